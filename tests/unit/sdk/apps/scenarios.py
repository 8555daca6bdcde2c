"""Guest workflows for the SDK tests: one per scenario category of the engine's suite
(calls, sleep, signals, children, continue-as-new, defers, state, locks), plus updates,
promises, replay-safe time and randomness, and the sandbox's guards.

Each workflow returns a transcript of what it saw, so a test reads every answer with
``env.result(run)``. Built once per content hash (``cleat_workflow.build``).
"""

from __future__ import annotations

import datetime
import os
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

from cleat_workflow import (
    Call,
    CallFailed,
    Cancelled,
    Context,
    LockHeld,
    NotFound,
    PermanentError,
    RetriesExhausted,
    Retry,
    Service,
    Timeout,
    handler,
    workflow,
)

# --- calls ---------------------------------------------------------------------------------


@workflow
def calls(ctx: Context, input: Any) -> Any:
    seen: list[Any] = [ctx.call("shop", "price", {"sku": input["sku"]})]
    try:
        ctx.call("shop", "reject", {"sku": input["sku"]})
    except PermanentError as exc:
        seen.append(["permanent", exc.message])
    try:
        ctx.call("shop", "flaky", None)
    except CallFailed as exc:
        seen.append(["error", exc.message])
    try:
        ctx.call_with_retry("shop", "flaky", None, max_attempts=3, initial_interval=1)
    except RetriesExhausted as exc:
        seen.append(["exhausted", exc.message])
    seen.append(ctx.call_with_retry("shop", "eventually", {"n": 1}, initial_interval=2))
    return seen


# --- parallel calls and typed services -------------------------------------------------------


@workflow
def gathered(ctx: Context, input: Any) -> Any:
    results = ctx.gather(
        Call("shop", "price", {"sku": "a"}),
        Call("shop", "eventually", {"n": 2}, retry=Retry(max_attempts=3, initial_interval=2)),
        Call("shop", "reject", {"sku": "b"}),
        Call("shop", "flaky", {"n": 3}, retry=Retry(max_attempts=2, initial_interval=2)),
        return_exceptions=True,
    )
    seen = [[type(r).__name__, r.message] if isinstance(r, Exception) else r for r in results]
    try:
        ctx.gather(Call("shop", "reject", {"sku": "c"}), Call("shop", "price", {"sku": "d"}))
    except PermanentError as exc:
        seen.append(["raised", exc.message])
    return seen


@workflow
def met(ctx: Context, input: Any) -> Any:
    return ctx.gather(*(Call("shop", "meet", {"n": n}) for n in range(3)))


@dataclass
class Quote:
    sku: str


@dataclass
class Price:
    cents: int
    currency: str = "EUR"


class Shop(Service, name="shop"):
    def price(self, request: Quote) -> Price: ...

    def reject(self, request: Quote) -> Price: ...


@workflow
def typed(ctx: Context, input: Any) -> Any:
    shop = Shop(ctx)
    one = shop.price(Quote(sku="x"))
    both = ctx.gather(shop.price.call(Quote("a")), shop.price.call(Quote("b")))
    seen: list[Any] = [[type(one).__name__, one.cents, one.currency], [p.cents for p in both]]
    try:
        shop.price({"sku": "x"})
    except TypeError as exc:
        seen.append(str(exc))
    try:
        shop.reject(Quote("y"))
    except PermanentError as exc:
        seen.append(exc.message)
    return seen


# --- sleep ------------------------------------------------------------------------------------


@workflow
def sleeper(ctx: Context, input: Any) -> Any:
    before = ctx.now_ms()
    ctx.sleep(datetime.timedelta(seconds=input["seconds"]))
    return [before, ctx.now_ms()]


# --- signals ----------------------------------------------------------------------------------


@workflow
def signals(ctx: Context, input: Any) -> Any:
    first = ctx.wait_for_signal("go", "stop")
    seen: list[Any] = [[first.name, first.payload]]
    try:
        ctx.wait_for_signal("never", timeout=10)
    except Timeout:
        seen.append("timeout")
    polled = ctx.poll_signal("late")
    seen.append(None if polled is None else polled.payload)
    return seen


@workflow
def answerer(ctx: Context, input: Any) -> Any:
    ask = ctx.wait_for_signal("ask")
    ctx.reply_to_signal(ask.correlation_id, {"answered": ask.payload})
    return ask.correlation_id != ""


@workflow
def asker(ctx: Context, input: Any) -> Any:
    child = ctx.child("answerer", None)
    answer = ctx.signal_and_wait(child, "ask", {"q": 1}, timeout=60)
    return [answer, ctx.await_child(child)]


# --- children ---------------------------------------------------------------------------------


@workflow
def double(ctx: Context, input: Any) -> Any:
    if input < 0:
        raise PermanentError(f"cannot double {input}")
    ctx.sleep(1)
    return input * 2


@workflow
def parent(ctx: Context, input: Any) -> Any:
    first = ctx.child("double", input[0])
    one = ctx.await_child(first)
    run_ids = [ctx.child("double", n) for n in input[1:]]
    gathered = ctx.gather_children(run_ids)
    return [one, [[r.status, r.result if r.ok else r.error] for r in gathered]]


# --- continue-as-new --------------------------------------------------------------------------


@workflow
def counter(ctx: Context, input: Any) -> Any:
    ctx.state["seen"] = input
    if input < 3:
        ctx.continue_as_new(input + 1)
    return {"final": input, "run_id": ctx.run_id}


# --- defers -----------------------------------------------------------------------------------


@handler
def audit(ctx: Context, outcome: Any) -> Any:
    ctx.call("audit", "record", outcome)
    return "audited"


@workflow
def with_defer(ctx: Context, input: Any) -> Any:
    ctx.defer(audit)
    ctx.sleep(1)
    if input == "fail":
        raise PermanentError("asked to fail")
    return {"done": input}


# --- state ------------------------------------------------------------------------------------


@workflow
def stateful(ctx: Context, input: Any) -> Any:
    ctx.state["b"] = {"deep": [1, 2]}
    ctx.state["a"] = "one"
    seen: list[Any] = [ctx.state["a"], ctx.state.get("missing", "default")]
    seen.append("a" in ctx.state)
    seen.append(list(ctx.state))
    seen.append(ctx.state.incr("n", 5))
    ctx.sleep(1)
    seen.append(ctx.state.incr("n", -7))
    del ctx.state["a"]
    seen.append("a" in ctx.state)
    try:
        ctx.state["a"]
    except KeyError:
        seen.append("KeyError")
    seen.append(ctx.state["b"])
    return seen


# --- locks ------------------------------------------------------------------------------------


@workflow
def locker(ctx: Context, input: Any) -> Any:
    seen: list[Any] = []
    try:
        with ctx.lock(input["key"], ttl=60):
            seen.append("held")
            ctx.wait_for_signal("release")
    except LockHeld as exc:
        seen.append(["busy", exc.message])
    return seen


# --- updates and promises ---------------------------------------------------------------------


@handler
def approve(ctx: Context, payload: Any) -> Any:
    approvals = [*ctx.state.get("approvals", []), payload]
    ctx.state["approvals"] = approvals
    if payload == "reject-me":
        raise PermanentError("not this one")
    return {"approvals": len(approvals)}


@workflow
def approvals(ctx: Context, input: Any) -> Any:
    ctx.on_update(approve)
    ctx.wait_for_signal("close")
    return ctx.state.get("approvals", [])


@workflow
def promised(ctx: Context, input: Any) -> Any:
    promise = ctx.promise("payment")
    ctx.set_query("promise", promise.id)
    try:
        return ["resolved", promise.wait(timeout=input.get("timeout"))]
    except CallFailed as exc:
        return ["rejected", exc.message]
    except Timeout:
        return ["timeout"]


# --- replay-safe time and randomness ------------------------------------------------------------


def _sample() -> dict[str, Any]:
    return {
        "time": time.time(),
        "datetime": datetime.datetime.now(datetime.UTC).isoformat(),
        "monotonic": time.monotonic(),
        "random": random.random(),
        "randint": random.randint(0, 10**9),
        "uuid4": str(uuid.uuid4()),
        "urandom": os.urandom(8).hex(),
    }


@workflow
def clock(ctx: Context, input: Any) -> Any:
    first = _sample()
    ctx.call("shop", "price", {"sku": "x"})
    second = _sample()
    ctx.sleep(input.get("sleep", 30))
    third = _sample()
    return {"samples": [first, second, third], "now_ms": ctx.now_ms(), "uuid": ctx.uuid("s")}


# --- the sandbox ------------------------------------------------------------------------------


@workflow
def sandbox(ctx: Context, input: Any) -> Any:
    seen: dict[str, Any] = {}
    try:
        with open("/etc/hostname") as fh:
            seen["file"] = fh.read()
    except OSError as exc:
        seen["file"] = type(exc).__name__
    try:
        import socket

        socket.create_connection(("127.0.0.1", 80), timeout=1)
        seen["socket"] = "connected"
    except Exception as exc:
        seen["socket"] = type(exc).__name__
    seen["environ"] = sorted(os.environ)
    return seen


@workflow
def naps(ctx: Context, input: Any) -> Any:
    time.sleep(1)
    return "woke"


@workflow
def spins(ctx: Context, input: Any) -> Any:
    n = 0
    while True:
        n += 1


@workflow
def hoards(ctx: Context, input: Any) -> Any:
    chunks = []
    while True:
        chunks.append(bytearray(1 << 20))


@workflow
def crashes(ctx: Context, input: Any) -> Any:
    ctx.call("shop", "price", {"sku": "x"})
    return {"missing": input["nope"]}


@workflow
def cancellable(ctx: Context, input: Any) -> Any:
    try:
        ctx.sleep(3600)
    except Cancelled:
        return "cancelled"
    return "slept"


@workflow
def lookups(ctx: Context, input: Any) -> Any:
    seen: list[Any] = [ctx.workflow_id, ctx.run_id == ctx.run_id, ctx.version, ctx.min_version]
    try:
        ctx.await_child("no-such-run")
    except NotFound as exc:
        seen.append(["not_found", exc.message != ""])
    except CallFailed as exc:
        seen.append(["error", exc.message])
    seen.append(ctx.side_effect(lambda: random.random() < 2))
    ctx.log.info("looked up %s", ctx.workflow_id)
    return seen
