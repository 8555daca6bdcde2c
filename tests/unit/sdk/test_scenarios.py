"""The engine's scenario categories, run by a Python guest (``apps/scenarios.py``): calls,
sleep, signals, children, continue-as-new, defers, state, locks, plus updates, promises,
replay-safe time and randomness, and the sandbox. Every run is checked fresh and replayed
(``assert_replays_quietly``: same outcome, no new event, no write, no service call)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.config import MIB, EngineConfig
from engine.determinism import idempotency_key
from engine.errors import PermanentError
from engine.events import CallEvent
from engine.runtime import WasmRuntime
from engine.testing import WorkflowEnvironment
from tests.fixtures import FakeService, assert_replays_quietly, event_types, wait_of

SCENARIOS_APP = Path(__file__).resolve().parent / "apps" / "scenarios.py"


@pytest.fixture
def shop() -> FakeService:
    return FakeService(
        {
            "price": {"cents": 1200},
            "reject": PermanentError("out of stock"),
            "flaky": RuntimeError("503"),
            "eventually": [RuntimeError("busy"), {"ok": 1}],
        }
    )


@pytest.fixture
def audit() -> FakeService:
    return FakeService({"record": {"ok": True}})


@pytest.fixture
def env(shop: FakeService, audit: FakeService) -> WorkflowEnvironment:
    from cleat_workflow.testing import PythonWorkflowEnvironment

    return PythonWorkflowEnvironment({"shop": shop, "audit": audit})


@pytest.fixture
def deploy(env: WorkflowEnvironment, scenarios_wasm: bytes) -> Callable[..., None]:
    """Deploy the scenarios module once per workflow, under the workflow's name."""

    def deploy_each(*names: str) -> None:
        for name in names:
            env.deploy(name, scenarios_wasm)

    return deploy_each


# --- calls ----------------------------------------------------------------------------------


def test_calls_map_statuses_to_exceptions_and_retry_on_durable_timers(
    env: WorkflowEnvironment, deploy: Callable[..., None], shop: FakeService
) -> None:
    """ctx.call answers the response, PermanentError or CallFailed; call_with_retry waits on
    retry-backoff timers (1 s then 2 s) and raises RetriesExhausted with the last error, or
    returns once an attempt succeeds. Attempts share the first one's idempotency key."""
    deploy(env, "calls")
    run = env.run("calls", {"sku": "book"})
    start = env.clock.ms
    assert wait_of(env, run)["kind"] == "retry_backoff"
    assert wait_of(env, run)["wake_at_ms"] == start + 1000
    env.advance(seconds=1)
    env.advance(seconds=2)
    env.advance(seconds=2)

    assert env.result(run) == [
        {"cents": 1200},
        ["permanent", "out of stock"],
        ["error", "RuntimeError: 503"],
        ["exhausted", "RuntimeError: 503"],
        {"ok": 1},
    ]
    assert shop.ops() == ["price", "reject", "flaky", *["flaky"] * 3, *["eventually"] * 2]
    retried = [c for c in shop.calls if c.operation == "flaky"][1:]
    assert [c.attempt for c in retried] == [1, 2, 3]
    assert {c.idempotency_key for c in retried} == {idempotency_key(run, run, 3)}
    assert event_types(env, run) == [
        *["call"] * 4,
        "sleep",
        "call",
        "sleep",
        "call",
        "call",
        "sleep",
        "call",
    ]
    assert_replays_quietly(env, run, watch=[shop])


# --- parallel calls and typed services -------------------------------------------------------


def test_gather_makes_every_first_attempt_then_retries_together_on_one_timer(
    env: WorkflowEnvironment, deploy: Callable[..., None], shop: FakeService
) -> None:
    """Four calls: every first attempt is made (in one batch, recorded in the given order)
    although two fail; the two retryable failures wait on one 2 s timer, then are tried
    again together; results and failures come back in place (return_exceptions). A second
    gather raises its first failure once both calls were made. Fresh and replayed, the same
    steps in the same order."""
    deploy(env, "gathered")
    run = env.run("gathered")
    start = env.clock.ms
    assert wait_of(env, run)["kind"] == "timer"
    assert wait_of(env, run)["wake_at_ms"] == start + 2000
    # Made concurrently: they reach the service in any order, and are recorded in order.
    assert sorted(shop.ops()) == sorted(["price", "eventually", "reject", "flaky"])
    env.advance(seconds=2)

    result = env.result(run)
    assert result[:3] == [{"cents": 1200}, {"ok": 1}, ["PermanentError", "out of stock"]]
    assert result[3][0] == "RetriesExhausted"
    assert result[3][1].startswith("shop.flaky: 2 attempt(s) failed, the last: ")
    assert result[4] == ["raised", "out of stock"]
    ops = shop.ops()
    assert sorted(ops[:4]) == sorted(["price", "eventually", "reject", "flaky"])
    assert sorted(ops[4:6]) == ["eventually", "flaky"]
    assert sorted(ops[6:]) == ["price", "reject"]
    assert event_types(env, run) == ["call"] * 4 + ["sleep"] + ["call"] * 4
    calls = [e for e in env.history(run) if isinstance(e, CallEvent)]
    assert [(e.operation, e.request) for e in calls] == [
        ("price", '{"sku":"a"}'),
        ("eventually", '{"n":2}'),
        ("reject", '{"sku":"b"}'),
        ("flaky", '{"n":3}'),
        ("eventually", '{"n":2}'),
        ("flaky", '{"n":3}'),
        ("reject", '{"sku":"c"}'),
        ("price", '{"sku":"d"}'),
    ]
    assert_replays_quietly(env, run, watch=[shop])


def test_a_gathers_calls_are_in_flight_together(
    env: WorkflowEnvironment, deploy: Callable[..., None], shop: FakeService
) -> None:
    """Each of the three calls waits on a barrier of three parties: the gather can only
    finish if they are in flight at once. The replay answers them from the history."""
    barrier = threading.Barrier(3, timeout=20)

    def meet(request: Any) -> Any:
        barrier.wait()
        return request["n"]

    shop.operations["meet"] = meet
    deploy(env, "met")
    run = env.run("met")
    assert env.result(run) == [0, 1, 2]
    assert event_types(env, run) == ["call"] * 3
    assert_replays_quietly(env, run, watch=[shop])


def test_a_typed_service_sends_dataclasses_and_returns_the_declared_reply(
    env: WorkflowEnvironment, deploy: Callable[..., None], shop: FakeService
) -> None:
    """Shop.price(Quote) -> Price: the request goes out as JSON, the reply comes back as a
    Price (defaults filled); its .call() form gathers; a request of the wrong type is a
    TypeError in the workflow before any call; a failure is the SDK's exception."""
    deploy(env, "typed")
    run = env.run("typed")
    assert env.result(run) == [
        ["Price", 1200, "EUR"],
        [1200, 1200],
        "shop.price takes a Quote, not dict",
        "out of stock",
    ]
    assert [c.request for c in shop.calls] == [
        {"sku": "x"},
        {"sku": "a"},
        {"sku": "b"},
        {"sku": "y"},
    ]
    assert_replays_quietly(env, run, watch=[shop])


# --- sleep ----------------------------------------------------------------------------------


def test_sleep_is_a_durable_timer_on_virtual_time(
    env: WorkflowEnvironment, deploy: Callable[..., None]
) -> None:
    deploy(env, "sleeper")
    start = env.clock.ms
    run = env.run("sleeper", {"seconds": 5})
    assert wait_of(env, run)["wake_at_ms"] == start + 5000
    env.advance(ms=4999)
    assert env.status(run) == "ready"
    env.advance(ms=1)
    assert env.result(run) == [start, start + 5000]
    assert event_types(env, run) == ["sleep"]
    assert_replays_quietly(env, run)


def test_cancelling_a_sleep_raises_cancelled(
    env: WorkflowEnvironment, deploy: Callable[..., None]
) -> None:
    deploy(env, "cancellable")
    run = env.run("cancellable")
    env.cancel(run)
    env.run_until_idle()
    assert env.result(run) == "cancelled"
    assert_replays_quietly(env, run)


# --- signals --------------------------------------------------------------------------------


def test_signals_wait_time_out_and_poll(
    env: WorkflowEnvironment, deploy: Callable[..., None]
) -> None:
    """wait_for_signal returns the first matching signal; one with a timeout raises Timeout
    when virtual time passes it; poll_signal answers at once."""
    deploy(env, "signals")
    run = env.run("signals")
    assert wait_of(env, run)["signals"] == ["go", "stop"]
    env.signal(run, "stop", {"n": 1})
    env.run_until_idle()
    assert wait_of(env, run)["signals"] == ["never"]
    env.signal(run, "late", [1])
    env.advance(seconds=10)
    assert env.result(run) == [["stop", {"n": 1}], "timeout", [1]]
    assert_replays_quietly(env, run)


def test_a_signal_sent_and_waited_on_is_answered_with_its_correlation_id(
    env: WorkflowEnvironment, deploy: Callable[..., None]
) -> None:
    """wait_for_signal gives the Signal's correlation_id when its sender waits for an
    answer; reply_to_signal with it answers the sender's signal_and_wait."""
    deploy(env, "asker", "answerer")
    run = env.run("asker")
    assert env.result(run) == [{"answered": {"q": 1}}, True]
    assert_replays_quietly(env, run)


# --- children -------------------------------------------------------------------------------


def test_children_are_awaited_and_gathered(
    env: WorkflowEnvironment, deploy: Callable[..., None]
) -> None:
    """A child's result comes back through await_child; gather_children reports each child,
    a failed one with its status and error instead of failing the parent."""
    deploy(env, "parent", "double")
    run = env.run("parent", [1, 2, -3])
    env.advance(seconds=1)
    env.advance(seconds=1)
    assert env.result(run) == [2, [["ok", 4], ["permanent", "cannot double -3"]]]
    children = [r for r in env.storage.runs.values() if r.definition == "double"]
    assert len(children) == 3
    assert_replays_quietly(env, run, *(c.run_id for c in children))


# --- continue-as-new ------------------------------------------------------------------------


def test_continue_as_new_chains_runs(env: WorkflowEnvironment, deploy: Callable[..., None]) -> None:
    deploy(env, "counter")
    run = env.run("counter", 0)
    result = env.result(run)
    assert result["final"] == 3
    chain = [run]
    while env.storage.runs[chain[-1]].continued_as:
        chain.append(env.storage.runs[chain[-1]].continued_as)
    assert len(chain) == 4
    assert result["run_id"] == chain[-1]
    assert event_types(env, run) == ["state_mutation", "continue_as_new"]
    assert_replays_quietly(env, *chain)


# --- defers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("input", "status", "outcome"),
    [("x", "done", {"result": {"done": "x"}}), ("fail", "failed", {"error": "asked to fail"})],
)
def test_defers_run_after_the_workflow_with_its_outcome(
    env: WorkflowEnvironment,
    deploy: Callable[..., None],
    audit: FakeService,
    input: str,
    status: str,
    outcome: Any,
) -> None:
    """A deferred handler runs when the workflow ends (through ``dispatch``, after ``run``
    returned: the component is never re-entered) with the outcome, and its calls are
    recorded like the workflow's."""
    deploy(env, "with_defer")
    run = env.run("with_defer", input)
    env.advance(seconds=1)
    assert env.status(run) == status
    [call] = audit.calls
    label = "ok" if status == "done" else "permanent"
    assert call.request == {"defer_id": call.request["defer_id"], "status": label, **outcome}
    assert event_types(env, run) == ["defer", "sleep", "call"]
    assert_replays_quietly(env, run, watch=[audit])


# --- state ----------------------------------------------------------------------------------


def test_state_is_a_durable_mapping(env: WorkflowEnvironment, deploy: Callable[..., None]) -> None:
    deploy(env, "stateful")
    run = env.run("stateful")
    env.advance(seconds=1)
    assert env.result(run) == [
        "one",
        "default",
        True,
        ["a", "b"],
        5,
        -2,
        False,
        "KeyError",
        {"deep": [1, 2]},
    ]
    assert_replays_quietly(env, run)


# --- locks ----------------------------------------------------------------------------------


def test_a_lock_is_exclusive_until_released(
    env: WorkflowEnvironment, deploy: Callable[..., None]
) -> None:
    deploy(env, "locker")
    holder = env.run("locker", {"key": "stock"})
    refused = env.run("locker", {"key": "stock"})
    assert env.result(refused) == [["busy", "lock 'stock' is held by another workflow"]]
    env.signal(holder, "release")
    env.run_until_idle()
    assert env.result(holder) == ["held"]
    later = env.run("locker", {"key": "stock"})
    assert wait_of(env, later)["signals"] == ["release"], "the released lock was not free"
    assert_replays_quietly(env, holder, refused)


# --- updates and promises -------------------------------------------------------------------


def test_updates_are_taken_at_blocking_calls_and_replayed(
    env: WorkflowEnvironment, deploy: Callable[..., None]
) -> None:
    """Updates reach a waiting run without re-entering the component: the SDK takes them
    before its blocking call, runs the handler and reports the outcome. A handler's error
    fails that update only; an unknown update is answered NOT_FOUND."""
    deploy(env, "approvals")
    run = env.run("approvals")
    first = env.update(run, "approve", "alice")
    env.run_until_idle()
    assert env.update_result(first) == ("done", '{"approvals":1}')
    rejected = env.update(run, "approve", "reject-me")
    unknown = env.update(run, "nope", 1)
    env.run_until_idle()
    assert env.update_result(rejected) == ("failed", "not this one")
    assert env.update_result(unknown) == (
        "failed",
        "no update handler named 'nope' is registered",
    )
    env.signal(run, "close")
    env.run_until_idle()
    assert env.result(run) == ["alice", "reject-me"]
    assert event_types(env, run).count("update_applied") == 3
    assert_replays_quietly(env, run)


@pytest.mark.parametrize(
    ("settle", "expected"),
    [
        ("resolve", ["resolved", {"paid": True}]),
        ("reject", ["rejected", "card declined"]),
        ("timeout", ["timeout"]),
    ],
)
def test_promises_resolve_reject_or_time_out(
    env: WorkflowEnvironment, deploy: Callable[..., None], settle: str, expected: list[Any]
) -> None:
    deploy(env, "promised")
    run = env.run("promised", {"timeout": 60})
    promise_id = json.loads(env.describe(run)["query_state"]["promise"])
    if settle == "resolve":
        env.resolve_promise(promise_id, {"paid": True})
        env.run_until_idle()
    elif settle == "reject":
        env.reject_promise(promise_id, "card declined")
        env.run_until_idle()
    else:
        env.advance(seconds=60)
    assert env.result(run) == expected
    assert_replays_quietly(env, run)


# --- replay-safe time and randomness ----------------------------------------------------------


def test_time_and_randomness_are_the_same_on_replay(
    env: WorkflowEnvironment, deploy: Callable[..., None]
) -> None:
    """time.time(), datetime.now(), time.monotonic() are the run's virtual time; random,
    uuid.uuid4() and os.urandom come from the run's seeded stream. The replay (the same
    history, a later wall clock) returns the identical result; another run draws other
    numbers."""
    deploy(env, "clock")
    start = env.clock.ms
    run = env.run("clock", {"sleep": 30})
    env.advance(seconds=30)
    result = env.result(run)
    first, second, third = result["samples"]
    assert first["time"] == second["time"] == start / 1000  # the call took no virtual time
    assert first["datetime"] == "2026-01-01T00:00:00+00:00"
    assert third["time"] == third["monotonic"] == (start + 30_000) / 1000
    assert result["now_ms"] == start + 30_000
    assert len({s["random"] for s in result["samples"]}) == 3
    assert len({s["uuid4"] for s in result["samples"]}) == 3

    env.advance(seconds=3600)  # the wall clock moves on; the replay's time does not
    replayed = env.replay(run).outcome
    assert json.loads(replayed.result) == result  # type: ignore[union-attr]
    assert_replays_quietly(env, run)

    other = env.run("clock", {"sleep": 30})
    env.advance(seconds=30)
    assert env.result(other)["samples"][0]["random"] != first["random"]


# --- identity, failures, the sandbox --------------------------------------------------------


def test_identity_side_effects_and_not_found(
    env: WorkflowEnvironment, scenarios_wasm: bytes
) -> None:
    """version() and min_version() answer what the deploy declared (through the component
    backend), the rest answer the run's identity and lookups."""
    env.deploy("lookups", scenarios_wasm, version=3, min_version=2)
    run = env.run("lookups", workflow_id="wf-lookups")
    assert env.result(run) == ["wf-lookups", True, 3, 2, ["not_found", True], True]
    assert event_types(env, run)[-1] == "durable_log"
    assert_replays_quietly(env, run)


def test_an_exception_fails_the_run_with_the_workflows_own_frames(
    env: WorkflowEnvironment,
    deploy: Callable[..., None],
) -> None:
    deploy(env, "crashes")
    run = env.run("crashes", {})
    assert env.describe(run)["waiting_on"] == "retry 2 of 3 after error"
    env.advance(seconds=1)
    env.advance(seconds=2)  # the last attempt fails too: the run is dead-lettered
    info = env.describe(run)
    assert (info["status"], info["error_code"]) == ("dead_lettered", "error")
    assert info["error"].splitlines()[0] == "KeyError: 'nope'"
    assert "at scenarios.py:" in info["error"] and "in crashes" in info["error"]
    assert "cleat_workflow" not in info["error"]
    assert_replays_quietly(env, run)


def test_the_sandbox_has_no_files_no_sockets_no_environment(
    env: WorkflowEnvironment, deploy: Callable[..., None]
) -> None:
    deploy(env, "sandbox")
    run = env.run("sandbox")
    seen = env.result(run)
    assert seen["file"] == "FileNotFoundError"
    assert seen["socket"] in ("ModuleNotFoundError", "OSError", "PermissionError")
    assert seen["environ"] == []


def test_time_sleep_is_a_guest_fault_that_names_its_file_line_and_ctx_sleep(
    env: WorkflowEnvironment, deploy: Callable[..., None]
) -> None:
    deploy(env, "naps")
    run = env.run("naps")
    info = env.describe(run)
    assert info["error_code"] == "guest_fault"
    lines = SCENARIOS_APP.read_text().splitlines()
    line = lines.index("def naps(ctx: Context, input: Any) -> Any:") + 2
    assert f"time.sleep at scenarios.py:{line} in naps: waiting on the clock" in info["error"]
    assert "ctx.sleep()" in info["error"]


def test_an_unknown_default_entry_is_refused_with_the_workflows_offered(
    env: WorkflowEnvironment, scenarios_wasm: bytes
) -> None:
    env.deploy("no_such_workflow", scenarios_wasm)
    run = env.run("no_such_workflow")
    info = env.describe(run)
    assert info["error_code"] == "invalid_module"
    assert "deploy it under one of their names" in info["error"]
    assert "approvals" in info["error"]


# --- limits: the same epoch deadline and memory limit as core modules ------------------------


@pytest.fixture(scope="module")
def tight_runtime() -> Iterator[WasmRuntime]:
    from cleat_workflow.testing import compiled_cache_dir

    # Another engine: the component comes from the disk cache, not from a second compile.
    runtime = WasmRuntime(
        EngineConfig(
            segment_timeout_s=1.0,
            memory_limit_bytes=48 * MIB,
            module_cache_dir=compiled_cache_dir(),
        )
    )
    yield runtime
    runtime.close()


def test_a_busy_loop_stops_at_the_segment_deadline(
    scenarios_wasm: bytes, tight_runtime: WasmRuntime
) -> None:
    from cleat_workflow.testing import PythonWorkflowEnvironment

    env = PythonWorkflowEnvironment(runtime=tight_runtime)
    env.deploy("spins", scenarios_wasm)
    run = env.run("spins")
    info = env.describe(run)
    assert info["error_code"] == "timeout"
    assert "1 s deadline" in info["error"]


def test_running_out_of_memory_is_a_resource_limit(
    scenarios_wasm: bytes, tight_runtime: WasmRuntime
) -> None:
    from cleat_workflow.testing import PythonWorkflowEnvironment

    env = PythonWorkflowEnvironment(runtime=tight_runtime)
    env.deploy("hoards", scenarios_wasm)
    run = env.run("hoards")
    info = env.describe(run)
    assert info["error_code"] == "resource_limit"
    assert str(48 * MIB) in info["error"]


# --- non-determinism --------------------------------------------------------------------------


def test_changed_code_is_caught_as_nondeterminism_naming_the_step(
    env: WorkflowEnvironment,
    deploy: Callable[..., None],
    scenarios_changed_wasm: bytes,
    shop: FakeService,
) -> None:
    """A run recorded by ``calls`` waits on a retry timer; the definition is then replaced
    by code whose second call differs. The next segment stops at step 1 with the recorded
    call and the new one, and calls nothing."""
    deploy(env, "calls")
    run = env.run("calls", {"sku": "book"})
    assert wait_of(env, run)["kind"] == "retry_backoff"
    calls_before = len(shop.calls)
    env.deploy("calls", scenarios_changed_wasm, version=1)
    env.advance(seconds=1)

    info = env.describe(run)
    assert info["error_code"] == "nondeterminism"
    assert "step 1" in info["error"]
    assert "reject" in info["error"] and "refund" in info["error"]
    assert len(shop.calls) == calls_before
    recorded = [e for e in env.history(run) if isinstance(e, CallEvent)]
    assert [e.operation for e in recorded] == ["price", "reject", "flaky", "flaky"]


def test_a_string_over_the_limit_is_a_guest_fault_naming_its_size(scenarios_wasm: bytes) -> None:
    """The host refuses a string argument over the limit before it copies it, and frees every
    argument's buffer either way; the run fails with the sizes named, and the next run is
    unharmed."""
    from cleat_workflow.testing import PythonWorkflowEnvironment, compiled_cache_dir

    runtime = WasmRuntime(
        EngineConfig(max_string_bytes=2048, module_cache_dir=compiled_cache_dir())
    )
    try:
        shop = FakeService({"price": {"cents": 1}})
        env = PythonWorkflowEnvironment({"shop": shop}, runtime=runtime)
        env.deploy("calls", scenarios_wasm)
        run = env.run("calls", {"sku": "x" * 3000})
        info = env.describe(run)
        assert info["error_code"] == "guest_fault"
        assert info["error"] == "durable_call: a string of 3010 bytes exceeds the 2048-byte maximum"
        assert shop.calls == []
        env.deploy("clock", scenarios_wasm)
        fine = env.run("clock", {"sleep": 1})
        env.advance(seconds=1)
        assert env.describe(fine)["status"] == "done"
    finally:
        runtime.close()


class SlowShop:
    """shop.price, answered after ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def price(self, request: Any, *, idempotency_key: str, context: Any) -> dict[str, int]:
        time.sleep(self.seconds)
        return {"cents": 5}


def test_time_in_a_service_call_does_not_count_against_the_segment_deadline(
    scenarios_wasm: bytes, tight_runtime: WasmRuntime
) -> None:
    """A 1.3 s call under the 1 s deadline: the host moves the deadline on by the call's time
    (from inside the host call, on its context), so the guest goes on to its sleep."""
    from cleat_workflow.testing import PythonWorkflowEnvironment

    env = PythonWorkflowEnvironment({"shop": SlowShop(1.3)}, runtime=tight_runtime)
    env.deploy("clock", scenarios_wasm)
    run = env.run("clock", {"sleep": 5})
    info = env.describe(run)
    assert info["error_code"] in (None, ""), info["error"]
    assert wait_of(env, run)["kind"] == "timer"
