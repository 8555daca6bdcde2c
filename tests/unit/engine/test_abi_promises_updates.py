"""ABI v1, promises and updates: create_promise, await_promise, resolve_promise,
reject_promise, register_update_handler (with updates applied at a blocking point)."""

from __future__ import annotations

import json

import pytest

from engine.events import UpdateAppliedEvent
from engine.status import AbiStatus
from engine.testing import WorkflowEnvironment
from tests.fixtures import assert_replays_quietly, event_types, wait_of
from tests.fixtures.wat import INPUT, Wat

# --- create_promise, await_promise ----------------------------------------------------------


def waiter_module(timeout_ms: int = -1) -> Wat:
    """Creates a promise, publishes its id as query state "promise", and awaits it."""
    w = Wat()
    w.run(
        f"""
    (local.set $p (call $create_promise {w.s("approval")}))
    (call $rec (local.get $p))
    (drop (call $set_query_state {w.s("promise")} {w.payload("p")}))
    (call $rec (call $await_promise {w.payload("p")} (i64.const {timeout_ms})))
    (call $finish)""",
        locals="$p i64",
    )
    return w


WAITER_WAT = waiter_module().source()


def _promise_of(env: WorkflowEnvironment, run: str) -> str:
    promise_id: str = env.describe(run)["query_state"]["promise"]
    return promise_id


def test_await_promise_returns_the_value_it_is_resolved_with() -> None:
    """The run waits on the promise; resolving it from outside wakes the run and the await
    answers the value."""
    env = WorkflowEnvironment()
    env.deploy("waiter", waiter_module().wasm())
    run = env.run("waiter")
    promise = _promise_of(env, run)
    wait = wait_of(env, run)
    assert (wait["kind"], wait["promise_id"], wait["wake_at_ms"]) == ("promise", promise, None)

    env.resolve_promise(promise, {"approved_by": "ada"})
    env.run_until_idle()
    assert env.result(run) == [[0, promise], [0, '{"approved_by":"ada"}']]
    assert event_types(env, run) == ["create_promise", "await_promise"]
    assert_replays_quietly(env, run)


def test_await_promise_returns_error_when_the_promise_is_rejected() -> None:
    """A rejected promise answers ERROR (1) with the rejection message."""
    env = WorkflowEnvironment()
    env.deploy("waiter", waiter_module().wasm())
    run = env.run("waiter")
    promise = _promise_of(env, run)
    env.reject_promise(promise, "no budget left")
    env.run_until_idle()
    assert env.result(run) == [[0, promise], [AbiStatus.ERROR, "no budget left"]]
    assert_replays_quietly(env, run)


def test_await_promise_times_out() -> None:
    """With a 1 s timeout and nobody settling it: TIMEOUT (4) after 1 s."""
    env = WorkflowEnvironment()
    env.deploy("waiter", waiter_module(1000).wasm())
    start = env.clock.ms
    run = env.run("waiter")
    assert wait_of(env, run)["wake_at_ms"] == start + 1000
    env.advance(seconds=1)
    assert env.result(run)[1] == [AbiStatus.TIMEOUT, ""]
    assert_replays_quietly(env, run)


def test_await_of_an_unknown_promise_is_not_found() -> None:
    """Awaiting an id no promise has answers NOT_FOUND (7) instead of waiting forever."""
    w = Wat()
    w.run(f"(call $rec (call $await_promise {w.s('p-missing')} (i64.const -1))) (call $finish)")
    env = WorkflowEnvironment()
    env.deploy("lost", w.wasm())
    run = env.run("lost")
    assert env.result(run) == [[AbiStatus.NOT_FOUND, "no promise p-missing"]]
    assert_replays_quietly(env, run)


# --- resolve_promise, reject_promise from a guest -------------------------------------------


def settler_module(verb: str) -> Wat:
    """Settles the promise whose id is its input, twice, then an unknown one."""
    w = Wat()
    value = w.js({"by": "settler"}) if verb == "resolve" else w.s("refused by settler")
    w.run(
        f"""
    (call $rec (call ${verb}_promise {w.input_string()} {value}))
    (call $rec (call ${verb}_promise {w.input_string()} {value}))
    (call $rec (call $resolve_promise {w.s("p-missing")} {w.js(1)}))
    (call $rec (call $reject_promise {w.input_string()} {w.s("too late")}))
    (call $finish)"""
    )
    return w


SETTLER_WAT = settler_module("resolve").source() + settler_module("reject").source()


@pytest.mark.parametrize(
    ("verb", "answer", "event"),
    [
        ("resolve", [0, '{"by":"settler"}'], "promise_resolved"),
        ("reject", [AbiStatus.ERROR, "refused by settler"], "promise_rejected"),
    ],
)
def test_a_workflow_settles_another_workflows_promise(
    verb: str, answer: list[object], event: str
) -> None:
    """One workflow resolves (or rejects) the promise another awaits: the awaiting run gets
    the value (or ERROR with the message). Settling it again is PERMANENT; an unknown
    promise is NOT_FOUND."""
    env = WorkflowEnvironment()
    env.deploy("waiter", waiter_module().wasm())
    env.deploy("settler", settler_module(verb).wasm())
    waiter = env.run("waiter")
    promise = _promise_of(env, waiter)
    settler = env.run("settler", json.dumps(promise))

    assert env.result(waiter) == [[0, promise], answer]
    first, again, unknown, late_reject = env.result(settler)
    assert first == [0, ""]
    assert again[0] == late_reject[0] == AbiStatus.PERMANENT
    assert unknown[0] == AbiStatus.NOT_FOUND
    assert event_types(env, settler) == [event, event, "promise_resolved", "promise_rejected"]
    assert_replays_quietly(env, waiter, settler)


def test_a_workflow_can_resolve_its_own_promise_before_awaiting_it() -> None:
    """Resolved before the await: the await answers at once, no suspension."""
    w = Wat()
    w.run(
        f"""
    (local.set $p (call $create_promise {w.s("self")}))
    (call $rec (call $resolve_promise {w.payload("p")} {w.js([1, 2])}))
    (call $rec (call $await_promise {w.payload("p")} (i64.const -1)))
    (call $finish)""",
        locals="$p i64",
    )
    env = WorkflowEnvironment()
    env.deploy("self", w.wasm())
    run = env.start("self")
    assert env.run_until_idle() == 1
    assert env.result(run) == [[0, ""], [0, "[1,2]"]]
    assert_replays_quietly(env, run)


# --- register_update_handler ----------------------------------------------------------------


def updatable_module() -> Wat:
    """run: registers "on_add", waits for signal "done", reports state "total".
    on_add: notes its input, increments "total", answers {"seen": <input>}."""
    w = Wat()
    w.run(
        f"""
    (call $recn (call $register_update_handler {w.s("on_add")}))
    (call $rec (call $durable_await_signals {w.js(["done"])} (i64.const -1)))
    (call $rec (call $get_state {w.s("total")}))
    (call $finish)"""
    )
    w.func(
        "on_add",
        f"""
    (call $note {w.input()})
    (drop (call $incr_state {w.s("total")} (i64.const 1)))
    {w.concat('{"seen":', INPUT, "}")}""",
    )
    return w


UPDATE_WAT = updatable_module().source()


def test_updates_are_applied_at_a_blocking_point_and_replayed_deterministically() -> None:
    """An update wakes the waiting run; its handler runs inside the instance (its host
    calls are recorded), its answer is the update's result. Replay re-applies each update
    at the same point, with the same effects on the transcript, and writes nothing."""
    env = WorkflowEnvironment()
    env.deploy("upd", updatable_module().wasm())
    run = env.run("upd", workflow_id="cart-1")
    first = env.update(run, "on_add", {"n": 5})
    env.run_until_idle()
    assert env.update_result(first) == ("done", '{"seen":{"n":5}}')
    second = env.update(run, "on_add", {"n": 7})
    env.run_until_idle()
    assert env.update_result(second) == ("done", '{"seen":{"n":7}}')
    assert env.status(run) == "ready"
    env.signal(run, "done")
    env.run_until_idle()

    assert env.result(run) == [
        0,
        '{"n":5}',
        '{"n":7}',
        [0, '{"name":"done","payload":null}'],
        [0, "2"],
    ]
    assert event_types(env, run) == [
        "update_handler",
        "update_applied",
        "state_mutation",
        "update_applied",
        "state_mutation",
        "await_signals",
        "state_mutation",
    ]
    applied = [e for e in env.history(run) if isinstance(e, UpdateAppliedEvent)]
    assert [(e.update_id, e.name, e.payload) for e in applied] == [
        (first, "on_add", '{"n":5}'),
        (second, "on_add", '{"n":7}'),
    ]
    replayed = env.replay(run)
    assert [(u.update_id, u.payload) for u in replayed.applied_updates] == [
        (first, '{"seen":{"n":5}}'),
        (second, '{"seen":{"n":7}}'),
    ]
    assert_replays_quietly(env, run)
    assert env.storage.state[("wf:cart-1", "total")] == "2"


def test_an_update_without_a_registered_handler_fails() -> None:
    """An update naming no registered handler is answered as failed, and the run goes on."""
    env = WorkflowEnvironment()
    env.deploy("upd", updatable_module().wasm())
    run = env.run("upd")
    update = env.update(run, "on_remove", {})
    env.run_until_idle()
    assert env.update_result(update) == (
        "failed",
        "no update handler named 'on_remove' is registered",
    )
    env.signal(run, "done")
    env.run_until_idle()
    assert env.result(run)[-1] == [AbiStatus.NOT_FOUND, ""]
    assert_replays_quietly(env, run)


def test_registering_a_handler_the_module_does_not_export_is_a_guest_fault() -> None:
    """register_update_handler names an export; a missing one fails the run (guest_fault)."""
    w = Wat()
    w.run(f"(drop (call $register_update_handler {w.s('nope')})) (call $finish)")
    env = WorkflowEnvironment()
    env.deploy("bad", w.wasm())
    run = env.run("bad")
    info = env.describe(run)
    assert (info["status"], info["error_code"]) == ("failed", "guest_fault")
    assert "register_update_handler" in info["error"]
    assert "'nope'" in info["error"]
    assert_replays_quietly(env, run)
