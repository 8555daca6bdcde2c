"""The engine's scenarios end to end through the Django store and executor: claim, fenced
writes, finalize, wake-ups, retries and the dead-letter queue. Runs on every database the
suite is pointed at (SQLite by default; PostgreSQL as the RLS-bound application role;
MariaDB)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from engine.events import EventType
from tests.fixtures import FakeService
from tests.fixtures.wat import Ref, Wat
from workflows.models import Signal, Status, WorkflowInstance
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def make_env(tenant: Any) -> Iterator[Any]:
    made: list[DatabaseWorkflowEnvironment] = []

    def make(services: dict[str, Any] | None = None) -> DatabaseWorkflowEnvironment:
        env = DatabaseWorkflowEnvironment(tenant, services)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


def types(env: DatabaseWorkflowEnvironment, run: str) -> list[str]:
    return [e.TYPE.value for e in env.history(run)]


def call_sleep_call() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call {w.s("pay")} {w.s("charge")} {w.js({"amount": 5})}))
    (call $recn (call $durable_sleep (i64.const 60000)))
    (call $rec (call $durable_call {w.s("pay")} {w.s("receipt")} {w.input()}))
    (call $finish)"""
    )
    return w


def test_calls_and_a_durable_timer_survive_segments(make_env: Any) -> None:
    """Two calls around a one-minute sleep: the first segment records the first call and
    suspends; the timer makes the run due; the second segment replays the first call (not
    repeating it) and completes. Each call's idempotency key is stable."""
    pay = FakeService({"charge": {"ok": 1}, "receipt": lambda r: {"echo": r}})
    env = make_env({"pay": pay})
    env.deploy("order", call_sleep_call().wasm())
    run = env.run("order", {"n": 7})
    info = env.describe(run)
    assert info["status"] == "ready"
    assert info["waiting_on"].startswith("timer until")
    assert pay.ops() == ["charge"]
    env.advance(seconds=59)
    assert env.status(run) == Status.READY
    env.advance(seconds=1)
    assert env.result(run) == [[0, '{"ok":1}'], 0, [0, '{"echo":{"n":7}}']]
    assert pay.ops() == ["charge", "receipt"]
    assert types(env, run) == ["call", "sleep", "call"]
    stored = env.stored_history(run)
    assert [s.step for s in stored] == [0, 1, 2]
    assert all(s.checksum for s in stored)
    assert len({c.idempotency_key for c in pay.calls}) == 2


def signal_waiter() -> Wat:
    w = Wat()
    w.run(
        f"""
    (local.set $a (call $durable_await_signals {w.js(["approve", "reject"])} (i64.const 3600000)))
    (call $rec (local.get $a))
    (call $finish)""",
        locals="$a i64",
    )
    return w


def test_a_signal_wakes_a_waiting_run(make_env: Any) -> None:
    """A run waiting for signals is not due; delivering one makes it due and the await
    returns the signal; the signal row is marked consumed by the finalize."""
    env = make_env()
    env.deploy("approval", signal_waiter().wasm())
    run = env.run("approval")
    assert env.describe(run)["waiting_on"].startswith("signals approve/reject")
    assert env.run_until_idle() == 0
    env.signal(run, "reject", {"why": "budget"})
    assert env.run_until_idle() == 1
    assert env.result(run) == [[0, '{"name":"reject","payload":{"why":"budget"}}']]
    with tenant_context(env.tenant.id):
        assert Signal.objects.get(instance_id=run).consumed_at is not None


def test_signal_await_times_out_at_its_virtual_deadline(make_env: Any) -> None:
    env = make_env()
    env.deploy("approval", signal_waiter().wasm())
    run = env.run("approval")
    env.advance(seconds=3599)
    assert env.status(run) == Status.READY
    env.advance(seconds=1)
    assert env.result(run) == [[4, ""]]


def parent_and_child() -> tuple[Wat, Wat]:
    parent = Wat()
    parent.run(
        f"""
    (local.set $c (call $child_workflow {parent.s("child")} {parent.js({"x": 2})}))
    (local.set $r (call $await_child {parent.payload("c")}))
    (call $rec (local.get $r))
    (call $finish)""",
        locals="$c i64 $r i64",
    )
    child = Wat()
    child.run(
        f"""
    (call $rec (call $durable_call {child.s("math")} {child.s("double")} {child.input()}))
    (call $finish)"""
    )
    return parent, child


def test_a_child_runs_and_wakes_its_parent(make_env: Any) -> None:
    """child_workflow starts the child atomically with the parent's event; the parent waits;
    the child's completion wakes it and await_child returns the child's result."""
    math = FakeService({"double": lambda r: r["x"] * 2})
    env = make_env({"math": math})
    parent, child = parent_and_child()
    env.deploy("parent", parent.wasm())
    env.deploy("child", child.wasm())
    run = env.run("parent")
    # The child's result is its own transcript, which recorded the service's answer 4.
    assert env.result(run) == [[0, '[[0,"4"]]']]
    with tenant_context(env.tenant.id):
        child_row = WorkflowInstance.objects.get(parent_id=run)
    assert child_row.status == Status.DONE
    assert types(env, run) == ["child_workflow", "await_child"]


def continue_as_new_counter() -> Wat:
    w = Wat()
    w.run(
        f"""
    (local.set $n (call $incr_state {w.s("count")} (i64.const 1)))
    (if (i64.lt_s (local.get $n) (i64.const 3))
      (then (drop (call $continue_as_new {w.js({"again": True})}))))
    (call $recn (local.get $n))
    (call $finish)""",
        locals="$n i64",
    )
    return w


def test_continue_as_new_chains_runs_that_share_state(make_env: Any) -> None:
    """Each run increments the workflow-scoped counter and continues as new until it reaches
    3; the chain shares the workflow id, and each run's history is its own."""
    env = make_env()
    env.deploy("loop", continue_as_new_counter().wasm())
    first = env.run("loop")
    last = env.latest_run(first)
    assert last != first
    assert env.result(first) == [3]
    with tenant_context(env.tenant.id):
        chain = list(WorkflowInstance.objects.filter(workflow_id=first).order_by("created_at"))
    assert [r.status for r in chain] == ["done", "done", "done"]
    assert types(env, first) == ["state_mutation", "continue_as_new"]
    assert types(env, last) == ["state_mutation"]


def failing_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call {w.s("flaky")} {w.s("go")} {w.js({})}))
    {w.reply(1, "the service said no")}"""
    )
    return w


def test_a_retryable_failure_is_retried_then_dead_lettered(make_env: Any) -> None:
    """A run that fails with ERROR is retried with the definition's backoff (replaying its
    history: the call is not repeated), then dead-lettered; retry from the dead-letter
    queue reopens it."""
    from workflows import services as svc

    flaky = FakeService({"go": {"no": True}})
    env = make_env({"flaky": flaky})
    env.deploy("flaky", failing_module().wasm())
    run = env.run("flaky")
    info = env.describe(run)
    assert (info["status"], info["error_code"], info["attempt"]) == ("ready", "error", 2)
    env.advance(seconds=1)  # retry_initial_interval_s
    assert env.describe(run)["attempt"] == 3
    env.advance(seconds=2)
    info = env.describe(run)
    assert (info["status"], info["error_code"]) == ("dead_lettered", "error")
    assert info["error"] == "the service said no"
    assert flaky.ops() == ["go"]  # every retry replayed it
    svc.retry_workflow(env.tenant, run, operator="test", reason="fixed upstream")
    info = env.describe(run)
    assert (info["status"], info["error"]) == ("ready", None)
    assert EventType.ADMIN_ACTION.value in types(env, run)


def test_nondeterminism_dead_letters_naming_the_step(make_env: Any) -> None:
    """Code that asks a different question on replay is dead-lettered at once with
    ``nondeterminism`` and a message naming the step and both calls."""
    env = make_env({"pay": FakeService({"charge": 1, "refund": 2})})
    first = Wat()
    first.run(
        f"""
    (call $rec (call $durable_call {first.s("pay")} {first.s("charge")} {first.js({})}))
    (drop (call $durable_sleep (i64.const 1000)))
    (call $finish)"""
    )
    env.deploy("drift", first.wasm())
    run = env.run("drift")
    changed = Wat()
    changed.run(
        f"""
    (call $rec (call $durable_call {changed.s("pay")} {changed.s("refund")} {changed.js({})}))
    (drop (call $durable_sleep (i64.const 1000)))
    (call $finish)"""
    )
    # The same version's bytes replaced behind the run's back (what a bad deploy does).
    from workflows.models import WorkflowDefinition

    wasm = changed.wasm()
    import hashlib

    with tenant_context(env.tenant.id):
        WorkflowDefinition.objects.filter(name="drift").update(
            wasm=wasm, sha256=hashlib.sha256(wasm).hexdigest()
        )
    env.advance(seconds=1)
    info = env.describe(run)
    assert (info["status"], info["error_code"]) == ("dead_lettered", "nondeterminism")
    assert "step 0" in info["error"] and "charge" in info["error"] and "refund" in info["error"]


def state_and_defers() -> Wat:
    w = Wat()
    w.func("cleanup", f"(drop (call $set_state {w.s('cleaned')} {w.s('yes')})) {w.reply(0, '')}")
    w.run(
        f"""
    (drop (call $durable_defer {w.s("cleanup")}))
    (drop (call $set_state {w.s("a")} {w.js(1)}))
    (call $rec (call $get_state {w.s("a")}))
    (call $rec (call $get_state {w.s("missing")}))
    (call $recn (call $acquire_lock {w.s("L")} (i64.const 0)))
    (call $finish)"""
    )
    return w


def test_state_locks_and_defers_through_the_store(make_env: Any) -> None:
    env = make_env()
    env.deploy("stateful", state_and_defers().wasm())
    run = env.run("stateful")
    assert env.result(run) == [[0, "1"], [7, ""], 1]
    from workflows.models import ConcurrencyKey, WorkflowState

    scope = f"wf:{run}"
    with tenant_context(env.tenant.id):
        assert WorkflowState.objects.get(scope=scope, key="cleaned").value == "yes"
        assert not ConcurrencyKey.objects.filter(key="L").exists()  # released by the run's end


def test_an_update_is_applied_at_a_blocking_point(make_env: Any) -> None:
    """An update request wakes a waiting run; the handler answers within the segment and the
    finalize stores the answer on the request."""
    from workflows.models import UpdateRequest

    w = Wat()
    w.func(
        "bump",
        f"(drop (call $set_query_state {w.s('bumped')} {w.input()})) {w.reply(0, 'bumped!')}",
    )
    w.run(
        f"""
    (drop (call $register_update_handler {w.s("bump")}))
    (call $rec (call $durable_await_signals {w.js(["stop"])} (i64.const -1)))
    (call $finish)"""
    )
    env = make_env()
    env.deploy("updatable", w.wasm())
    run = env.run("updatable")
    update_id = env.update(run, "bump", {"by": 2})
    env.run_until_idle()
    with tenant_context(env.tenant.id):
        update = UpdateRequest.objects.get(id=update_id)
    assert (update.status, update.result) == ("done", "bumped!")
    assert env.describe(run)["query_state"] == {
        "bumped": json.dumps({"by": 2}, separators=(",", ":"))
    }
    env.signal(run, "stop")
    env.run_until_idle()
    assert env.result(run)[0][0] == 0


def test_cancellation_reaches_a_waiting_run(make_env: Any) -> None:
    env = make_env()
    env.deploy("approval", signal_waiter().wasm())
    run = env.run("approval")
    env.cancel(run, "no longer needed")
    env.run_until_idle()
    assert env.result(run) == [[5, ""]]


def test_promises_resolved_from_outside(make_env: Any) -> None:
    w = Wat()
    w.run(
        f"""
    (local.set $p (call $create_promise {w.s("approval")}))
    (call $set_query_state {w.s("promise")} {w.payload("p")}) drop
    (call $rec (call $await_promise {w.payload("p")} (i64.const -1)))
    (call $finish)""",
        locals="$p i64",
    )
    env = make_env()
    env.deploy("promising", w.wasm())
    run = env.run("promising")
    promise_id = env.describe(run)["query_state"]["promise"]
    env.resolve_promise(promise_id, {"approved": True})
    env.run_until_idle()
    assert env.result(run) == [[0, '{"approved":true}']]


def test_fence_lost_writes_nothing(make_env: Any) -> None:
    """A segment whose claim was reaped and re-claimed by another worker writes nothing:
    its finalize is fenced out and the new owner's history stands."""
    from datetime import timedelta

    from django.utils import timezone

    from engine.errors import FenceLost
    from engine.session import RunInfo
    from workflows.executor import get_runtime, get_services
    from workflows.store.lifecycle import (
        claim_ready_instances,
        finalize_segment,
        load_run,
        reap_expired_leases,
    )
    from workflows.store.storage import DjangoStorage

    env = make_env({"pay": FakeService({"charge": 1, "receipt": 2})})
    env.deploy("order", call_sleep_call().wasm())
    run = env.start("order", {})
    [claim] = claim_ready_instances("stalled", ["default"], 1, timezone.now())
    loaded = load_run(claim, "stalled")
    assert loaded is not None
    # The stalled worker's lease expires and the run is reaped (generation bumped).
    assert reap_expired_leases(timedelta(seconds=0), timezone.now() + timedelta(seconds=1)) == 1
    info = RunInfo(
        ref=loaded.ref,
        definition="order",
        version=1,
        input="{}",
        start_ms=int(loaded.instance.created_at.timestamp() * 1000),
    )
    module = get_runtime().load(call_sleep_call().wasm())
    with pytest.raises(FenceLost):
        result = get_runtime().run_segment(
            module, info, [], DjangoStorage(claim.tenant_id), get_services()
        )
        finalize_segment(loaded.ref, result)
    assert env.stored_history(run) == []
    assert env.status(run) == Status.READY
    env.advance(seconds=2)  # the reap made it due one second after the reap time
    assert env.describe(run)["events"] == 1


__all__ = ["Ref"]


def test_durable_send_is_delivered_by_the_worker_with_the_steps_key(make_env: Any) -> None:
    """durable_send queues the call with the run; the worker delivers it (at least once) with
    the idempotency key of the step, and a failing delivery is retried later."""
    from workflows.models import Invocation
    from workflows.worker import Worker, WorkerOptions

    answers: list[Any] = [RuntimeError("down"), {"sent": True}]
    mail = FakeService({"send": answers})
    env = make_env({"mail": mail})
    w = Wat()
    send = f"(call $durable_send {w.s('mail')} {w.s('send')} {w.js({'to': 'ada'})})"
    w.run(f"(call $rec {send}) (call $finish)")
    env.deploy("notify", w.wasm())
    run = env.run("notify")
    assert env.result(run) == [[0, ""]]
    Worker(WorkerOptions(worker_id="w1", burst=True, concurrency=1)).run()
    with tenant_context(env.tenant.id):
        [row] = Invocation.objects.all()
    assert (row.status, row.attempts) == ("pending", 1)
    assert "down" in row.last_error
    with tenant_context(env.tenant.id):
        Invocation.objects.filter(id=row.id).update(deliver_at=row.deliver_at.replace(year=2000))
    Worker(WorkerOptions(worker_id="w1", burst=True, concurrency=1)).run()
    with tenant_context(env.tenant.id):
        row.refresh_from_db()
    assert (row.status, row.attempts) == ("delivered", 2)
    assert [c.operation for c in mail.calls] == ["send", "send"]
    assert len({c.idempotency_key for c in mail.calls}) == 1
    assert mail.calls[0].idempotency_key == row.idempotency_key


def call_or_fail() -> Wat:
    w = Wat()
    w.run(
        f"""
    (local.set $r (call $durable_call {w.s("flaky")} {w.s("go")} {w.js({})}))
    (if (result i64) (i32.ne (call $status (local.get $r)) (i32.const 0))
      (then {w.reply(1, "the call failed")})
      (else (call $rec (local.get $r)) (call $finish)))""",
        locals="$r i64",
    )
    return w


def test_an_automatic_retry_makes_the_failed_call_again(make_env: Any) -> None:
    """A run that failed because its last call failed is retried by calling the service
    again (same idempotency key), not by replaying the recorded failure."""
    flaky = FakeService({"go": [RuntimeError("down"), {"ok": True}]})
    env = make_env({"flaky": flaky})
    env.deploy("flaky", call_or_fail().wasm())
    run = env.run("flaky")
    info = env.describe(run)
    assert (info["status"], info["error_code"], info["attempt"]) == ("ready", "error", 2)
    assert info["events"] == 0  # the failed call was forgotten
    env.advance(seconds=1)
    assert env.result(run) == [[0, '{"ok":true}']]
    assert flaky.ops() == ["go", "go"]
    assert flaky.calls[0].idempotency_key == flaky.calls[1].idempotency_key


def test_retry_from_the_dead_letter_queue_makes_the_failed_call_again(make_env: Any) -> None:
    from workflows import services as svc
    from workflows.models import WorkflowDefinition

    flaky = FakeService({"go": [RuntimeError("down"), {"ok": True}]})
    env = make_env({"flaky": flaky})
    env.deploy("flaky", call_or_fail().wasm())
    with tenant_context(env.tenant.id):
        WorkflowDefinition.objects.filter(name="flaky").update(retry_max_attempts=1)
    run = env.run("flaky")
    assert env.describe(run)["status"] == "dead_lettered"
    assert env.describe(run)["events"] == 1  # kept for the operator to see
    svc.retry_workflow(env.tenant, run, operator="ops", reason="service is back")
    env.run_until_idle()
    assert env.result(run) == [[0, '{"ok":true}']]
    assert flaky.ops() == ["go", "go"]
    assert [e.TYPE.value for e in env.history(run)] == ["admin_action", "call"]


# --- the finalize's fast path and its fallbacks ------------------------------------------------
# On PostgreSQL a plain completion is finalized in one statement; anything it does not cover
# (an open child, a lost fence) must take the general path. These run on every database.


def segment_by_hand(env: DatabaseWorkflowEnvironment, wasm: bytes, worker_id: str) -> Any:
    """Claim the due run and execute its segment, without finalizing: (loaded, result)."""
    from django.utils import timezone

    from engine.session import RunInfo
    from workflows.executor import get_runtime, get_services
    from workflows.store.lifecycle import claim_ready_instances, load_run
    from workflows.store.storage import DjangoStorage

    [claim] = claim_ready_instances(worker_id, ["default"], 1, timezone.now())
    loaded = load_run(claim, worker_id)
    assert loaded is not None
    instance = loaded.instance
    info = RunInfo(
        ref=loaded.ref,
        definition=instance.definition_name,
        version=instance.definition_version,
        input=instance.input,
        start_ms=int(instance.created_at.timestamp() * 1000),
    )
    result = get_runtime().run_segment(
        get_runtime().load(wasm),
        info,
        loaded.history,
        DjangoStorage(claim.tenant_id),
        get_services(),
    )
    return loaded, result


def test_a_completing_parent_closes_its_open_child(make_env: Any) -> None:
    """A parent that completes while its child still waits terminates the child (its
    parent-close policy): the one-statement completion must not skip that."""
    parent = Wat()
    parent.run(f"(drop (call $child_workflow {parent.s('waiter')} {parent.js({})})) (call $finish)")
    env = make_env()
    env.deploy("parent", parent.wasm())
    env.deploy("waiter", signal_waiter().wasm())
    run = env.run("parent")
    assert env.result(run) == []
    with tenant_context(env.tenant.id):
        child = WorkflowInstance.objects.get(parent_id=run)
    assert (child.status, child.error_code) == (Status.TERMINATED, "terminated")
    assert child.generation == 1  # fenced by the close; never claimed


def test_an_update_still_pending_when_the_run_completes_is_failed(make_env: Any) -> None:
    """An update that arrives while the last segment runs (the run has no handler left to
    answer it) is failed by the finalize, with the run's final status."""
    from workflows.models import UpdateRequest
    from workflows.store.lifecycle import finalize_segment

    w = Wat()
    w.run(
        f"(call $rec (call $durable_call {w.s('pay')} {w.s('charge')} {w.input()})) (call $finish)"
    )
    env = make_env({"pay": FakeService({"charge": {"ok": 1}})})
    env.deploy("pay", w.wasm())
    run = env.start("pay", {"amount": 5})
    loaded, result = segment_by_hand(env, w.wasm(), "w-update")
    update_id = env.update(run, "bump", {"by": 1})
    finalize_segment(loaded.ref, result)
    assert env.result(run) == [[0, '{"ok":1}']]
    assert env.describe(run)["events"] == 1
    with tenant_context(env.tenant.id):
        update = UpdateRequest.objects.get(id=update_id)
    assert update.status == "failed"
    assert update.result == "the run ended (done) before answering"
    assert update.completed_at is not None


def test_a_completion_whose_claim_moved_on_writes_nothing(make_env: Any) -> None:
    """A segment that completed after its lease was reaped and the run claimed again -- by a
    worker with the same id, so only the generation tells them apart -- is fenced out at the
    finalize: the new claim stands, without a result."""
    from datetime import timedelta

    from django.utils import timezone

    from engine.errors import FenceLost
    from workflows.store.lifecycle import (
        claim_ready_instances,
        finalize_segment,
        reap_expired_leases,
    )

    w = Wat()
    w.run("(call $finish)")
    env = make_env()
    env.deploy("quick", w.wasm())
    run = env.start("quick", {})
    loaded, result = segment_by_hand(env, w.wasm(), "stalled")
    later = timezone.now() + timedelta(seconds=1)
    assert reap_expired_leases(timedelta(seconds=0), later) == 1
    [again] = claim_ready_instances("stalled", ["default"], 1, later)
    assert again.generation == loaded.claim.generation + 2
    with pytest.raises(FenceLost):
        finalize_segment(loaded.ref, result)
    info = env.describe(run)
    assert (info["status"], info["result"], info["events"]) == (Status.RUNNING, None, 0)


@pytest.mark.postgres_only
def test_postgres_runs_a_plain_segment_in_four_statements_with_the_general_paths_outcome(
    make_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claim, load (one message), the step (one message), the completion (one message); the
    rows it leaves are those the general path (a transaction per part) leaves."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from workflows.store import lifecycle

    w = Wat()
    w.run(
        f"""
    (drop (call $set_query_state {w.s("stage")} {w.js("paid")}))
    (call $rec (call $durable_call {w.s("pay")} {w.s("charge")} {w.input()}))
    (call $finish)"""
    )
    env = make_env({"pay": FakeService({"charge": lambda r: {"charged": r}})})
    env.deploy("pay", w.wasm())
    fast = env.start("pay", {"amount": 5})
    with CaptureQueriesContext(connection) as queries:
        assert env.step()
    assert len(queries) == 4, [q["sql"][:80] for q in queries]

    monkeypatch.setattr(lifecycle, "_load_in_one_message", lambda *a: (False, None))
    monkeypatch.setattr(lifecycle, "_complete_in_one_message", lambda *a: False)
    slow = env.start("pay", {"amount": 5})
    with CaptureQueriesContext(connection) as queries:
        assert env.step()
    assert len(queries) > 4

    columns = [
        "status",
        "result",
        "error",
        "error_code",
        "event_count",
        "query_state",
        "assigned_to",
        "waiting_on",
        "next_wake_at",
        "attempt",
        "generation",
        "cancel_requested",
    ]
    with tenant_context(env.tenant.id):
        rows = {
            r.id: r for r in WorkflowInstance.objects.filter(id__in=[fast, slow]).order_by("id")
        }
    a, b = rows[uuid_of(fast)], rows[uuid_of(slow)]
    assert {c: getattr(a, c) for c in columns} == {c: getattr(b, c) for c in columns}
    assert a.status == Status.DONE and a.query_state == {"stage": '"paid"'}
    for r in (a, b):
        assert r.completed_at and r.heartbeat_at and r.updated_at >= r.completed_at
    strip = [(e.step, e.type_code, e.payload) for e in env.stored_history(fast)]
    assert strip == [(e.step, e.type_code, e.payload) for e in env.stored_history(slow)]


def uuid_of(run: str) -> Any:
    import uuid

    return uuid.UUID(run)


@pytest.mark.postgres_only
def test_postgres_load_in_one_message_reads_what_the_orm_reads(
    make_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-message load returns the same instance (every column, JSON fields decoded),
    definition and history as the ORM's; a claim that moved on loads nothing."""
    from django.utils import timezone

    from workflows.store import lifecycle

    pay = FakeService({"charge": {"ok": 1}, "receipt": lambda r: {"echo": r}})
    env = make_env({"pay": pay})
    env.deploy("order", call_sleep_call().wasm())
    run = env.start("order", {"amount": 5})
    env.run_until_idle()  # the call and the sleep are recorded; the run waits
    with tenant_context(env.tenant.id):
        WorkflowInstance.objects.filter(id=run).update(
            allowed_signals=["go", "stop"], query_state={"k": "v"}, next_wake_at=timezone.now()
        )
    [claim] = lifecycle.claim_ready_instances("cmp", ["default"], 1, timezone.now())
    done, quick = lifecycle._load_in_one_message(claim, "cmp")
    assert done and quick is not None
    monkeypatch.setattr(lifecycle, "_load_in_one_message", lambda *a: (False, None))
    orm = lifecycle.load_run(claim, "cmp")
    assert orm is not None
    fields = [f.attname for f in WorkflowInstance._meta.concrete_fields]
    assert {f: getattr(quick.instance, f) for f in fields} == {
        f: getattr(orm.instance, f) for f in fields
    }
    assert quick.instance.allowed_signals == ["go", "stop"]
    assert quick.instance.waiting_on["kind"] == orm.instance.waiting_on["kind"]
    assert (quick.definition_id, quick.sha256, quick.max_history_length) == (
        orm.definition_id,
        orm.sha256,
        orm.max_history_length,
    )
    assert quick.history == orm.history and len(quick.history) == 1
    monkeypatch.undo()
    moved_on = lifecycle.Claim(claim.id, claim.tenant_id, claim.generation + 1)
    assert lifecycle._load_in_one_message(moved_on, "cmp") == (True, None)
