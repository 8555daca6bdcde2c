"""The finalize of a segment that suspends, in one call on PostgreSQL
(``cleat.finalize_wait``, ``store.lifecycle._wait_in_one_message``), against the general
path's transaction: the same rows, the arrival read under the lock choosing when the run is
due, nothing written when the fence moved or when a fold of the history is due (the general
path then folds it). PostgreSQL as the RLS-bound application role; elsewhere the general
path is the only one, and the shared scenarios (test_lifecycle_scenarios.py) cover it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from engine import compaction
from engine.errors import FenceLost
from tests.fixtures import FakeService
from tests.fixtures.wat import Wat
from workflows.models import RunStatus, Signal, WorkflowEvent, WorkflowInstance
from workflows.store import lifecycle, wake
from workflows.store.lifecycle import wait_recheck
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

# What the comparison reads of each run's row.
COLUMNS = [
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
    "compacted_events",
    "heartbeat_at",
]


def call_then_wait() -> bytes:
    """Publishes query state, makes a call (an event), then waits up to an hour for "go"."""
    w = Wat()
    w.run(
        f"""
    (drop (call $set_query_state {w.s("stage")} {w.js("waiting")}))
    (call $rec (call $durable_call {w.s("pay")} {w.s("charge")} {w.input()}))
    (call $rec (call $durable_await_signals {w.js(["go"])} (i64.const 3600000)))
    (call $finish)"""
    )
    return w.wasm()


@pytest.fixture
def env(tenant: Any) -> Iterator[DatabaseWorkflowEnvironment]:
    made = DatabaseWorkflowEnvironment(tenant, {"pay": FakeService({"charge": 1})})
    made.deploy("waiter", call_then_wait())
    yield made
    made.close()


def rows(env: DatabaseWorkflowEnvironment, *runs: str) -> list[dict[str, Any]]:
    with tenant_context(env.tenant.id):
        found = {r.id: r for r in WorkflowInstance.objects.filter(id__in=runs)}
    return [{c: getattr(found[uuid.UUID(run)], c) for c in COLUMNS} for run in runs]


def events(env: DatabaseWorkflowEnvironment, run: str) -> list[tuple[int, int, str]]:
    return [(e.step, e.type_code, e.payload) for e in env.stored_history(run)]


def near(moment: Any, expected: Any) -> bool:
    """The same instant to the millisecond (a wait's deadline is kept in milliseconds)."""
    return moment is not None and abs(moment - expected) < timedelta(milliseconds=1)


def general_path_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle, "_wait_in_one_message", lambda *a: False)


def segment(env: DatabaseWorkflowEnvironment, worker: str) -> tuple[Any, Any]:
    """Claim the due run and run its segment, not finalized: (loaded, result)."""
    from tests.integration.test_store_scenarios import segment_by_hand

    return segment_by_hand(env, call_then_wait(), worker)


def test_a_suspend_is_one_message_and_leaves_the_general_paths_rows(
    env: DatabaseWorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.start("waiter", {"amount": 5})
    assert env.step()  # the first segment of the definition reads its module
    fast = env.start("waiter", {"amount": 5})
    with CaptureQueriesContext(connection) as seen:
        assert env.step()
    sent = [q["sql"] for q in seen]
    # The claim with the load, the wait's look for a signal, the finalize: one each.
    assert len(sent) == 3, [q[:60] for q in sent]
    assert "next_signal" in sent[1]
    assert "finalize_wait" in sent[-1]
    assert not any(
        "FOR NO KEY UPDATE" in q or "workflows_workflowinstance" in q for q in sent[1:-1]
    )

    general_path_only(monkeypatch)
    slow = env.start("waiter", {"amount": 5})
    with CaptureQueriesContext(connection) as seen:
        assert env.step()
    general = [q["sql"] for q in seen]
    assert not any("finalize_wait" in q for q in general)
    # its begin, the tenant, the fenced lock, the events' insert, the arrival, the save, its
    # commit: seven statements for the one call
    assert len(general) == len(sent) + 6, general[len(sent) - 1 :]

    a, b = rows(env, fast, slow)
    for row in (a, b):  # the moments each finalize read: its own
        heartbeat = row.pop("heartbeat_at")
        assert near(row.pop("next_wake_at"), heartbeat + min(timedelta(hours=1), wait_recheck()))
        assert row["waiting_on"].pop("wake_at_ms") > 0
    assert a == b
    assert a["status"] == RunStatus.READY and a["assigned_to"] is None
    assert a["waiting_on"]["signals"] == ["go"] and a["query_state"] == {"stage": '"waiting"'}
    assert a["event_count"] == 1
    assert events(env, fast) == events(env, slow) and len(events(env, fast)) == 1

    # Both go on alike: the signal wakes each, and each completes.
    for run in (fast, slow):
        env.signal(run, "go", {"ok": True})
    env.run_until_idle()
    assert env.status(fast) == env.status(slow) == RunStatus.DONE


@pytest.mark.parametrize("path", ["one_message", "general"])
def test_what_arrived_during_the_segment_makes_the_run_due_at_once(
    env: DatabaseWorkflowEnvironment, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A signal of the wait's names committed while the segment ran (after its load, before
    its finalize), or a cancellation request, is read under the lock: the run is due now,
    and the idle workers are told. Without one it waits for its deadline."""
    if path == "general":
        general_path_only(monkeypatch)
    waiting, signalled, cancelled = (env.start("waiter", {"n": i}) for i in range(3))
    now = env.clock.now()
    told: list[str] = []  # the runs the finalizes made due now, for the idle workers
    tell = wake.ready_after_commit
    for _ in range(3):
        loaded, result = segment(env, "w")
        assert loaded.ref.run_id in (waiting, signalled, cancelled)
        with tenant_context(env.tenant.id):
            if loaded.ref.run_id == signalled:
                Signal.objects.create(tenant_id=env.tenant.id, instance_id=signalled, name="go")
            if loaded.ref.run_id == cancelled:
                WorkflowInstance.objects.filter(id=cancelled).update(cancel_requested=True)
        monkeypatch.setattr(
            wake, "ready_after_commit", lambda tenant, run, **kw: told.append(str(run))
        )
        with CaptureQueriesContext(connection) as seen:
            assert lifecycle.finalize_segment(loaded.ref, result, now).status == RunStatus.READY
        monkeypatch.setattr(wake, "ready_after_commit", tell)
        assert any("finalize_wait" in q["sql"] for q in seen) is (path == "one_message")
    due = {
        run: row["next_wake_at"]
        for run, row in zip(
            (waiting, signalled, cancelled), rows(env, waiting, signalled, cancelled), strict=True
        )
    }
    assert due[signalled] == due[cancelled] == now
    assert near(due[waiting], now + min(timedelta(hours=1), wait_recheck()))
    assert sorted(told) == sorted([signalled, cancelled])


@pytest.mark.parametrize("path", ["one_message", "general"])
def test_a_moved_fence_writes_nothing(
    env: DatabaseWorkflowEnvironment, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The run was reaped and claimed again while the segment ran: the finalize fails with
    FenceLost and leaves the new owner's row and history as they are."""
    if path == "general":
        general_path_only(monkeypatch)
    run = env.start("waiter", {})
    loaded, result = segment(env, "stalled")
    assert lifecycle.reap_expired_leases(timedelta(0), env.clock.now() + timedelta(seconds=1)) == 1
    [again] = lifecycle.claim_ready_instances(
        "other", ["default"], 1, env.clock.now() + timedelta(seconds=2)
    )
    assert str(again.id) == run
    before = rows(env, run)
    with pytest.raises(FenceLost):
        lifecycle.finalize_segment(loaded.ref, result)
    assert rows(env, run) == before
    assert before[0]["status"] == RunStatus.RUNNING and before[0]["assigned_to"] == "other"
    assert events(env, run) == []  # the call's event was to be written with the finalize


def calls_then_wait() -> bytes:
    """Three calls (three events), then a wait for "go"."""
    w = Wat()
    calls = "".join(
        f"(call $rec (call $durable_call {w.s('pay')} {w.s('charge')} {w.input()}))"
        for _ in range(3)
    )
    w.run(
        f"""{calls}
    (call $rec (call $durable_await_signals {w.js(["go"])} (i64.const 3600000)))
    (call $finish)"""
    )
    return w.wasm()


@pytest.mark.parametrize("threshold,folded", [(4, False), (3, True)])
def test_a_fold_due_is_left_to_the_general_path(
    env: DatabaseWorkflowEnvironment,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    threshold: int,
    folded: bool,
) -> None:
    """The run suspends with three events not yet folded. Below the threshold the one call
    writes it; at the threshold (engine.compaction.due) the call writes nothing, and the
    general path folds the history under its lock."""
    from tests.integration.test_store_scenarios import segment_by_hand

    settings.CLEAT_COMPACT_AFTER_EVENTS = threshold
    wasm = calls_then_wait()
    env.deploy("caller", wasm)
    run = env.start("caller", {})
    loaded, result = segment_by_hand(env, wasm, "w")
    assert compaction.due(3, threshold) is folded
    with CaptureQueriesContext(connection) as seen:
        lifecycle.finalize_segment(loaded.ref, result)
    assert len([q for q in seen if "finalize_wait" in q["sql"]]) == 1
    assert (len(seen) > 1) is folded  # the general path after the call
    [row] = rows(env, run)
    assert row["status"] == RunStatus.READY and row["event_count"] == 3
    assert (row["compacted_events"] > 0) is folded
    with tenant_context(env.tenant.id):
        kept = WorkflowEvent.objects.filter(instance_id=run).count()
    assert kept == 3 - row["compacted_events"]  # the folded ones are in the checkpoint


@pytest.mark.parametrize("path", ["one_call", "orm"])
def test_the_waits_look_for_a_signal_finds_the_oldest_of_its_names_not_consumed(
    env: DatabaseWorkflowEnvironment,
    other_tenant: Any,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
) -> None:
    """``DjangoStorage.next_signal``: one call of ``cleat.next_signal`` on PostgreSQL, the
    ORM's read elsewhere (compared here): the run's oldest unconsumed signal of the names,
    skipping those the segment consumed already; never another run's, another name's, a
    consumed one, or another tenant's."""
    from engine.storage import RunRef
    from workflows.store import storage as storage_module
    from workflows.store.storage import DjangoStorage

    if path == "orm":
        real = storage_module.queries
        monkeypatch.setattr(
            storage_module,
            "queries",
            lambda conn: {k: v for k, v in real(conn).items() if k != "next_signal"},
        )
    run, other = env.start("waiter", {}), env.start("waiter", {})
    theirs = DatabaseWorkflowEnvironment(other_tenant)
    try:
        theirs.deploy("waiter", call_then_wait())
        foreign = theirs.start("waiter", {})
    finally:
        theirs.close()
    with tenant_context(other_tenant.id):
        Signal.objects.create(tenant_id=other_tenant.id, instance_id=foreign, name="go")
    with tenant_context(env.tenant.id):

        def sent(name: str, **kw: Any) -> str:
            made = Signal.objects.create(
                tenant_id=env.tenant.id, instance_id=kw.pop("to", run), name=name, **kw
            )
            return str(made.id)

        sent("go", consumed_at=env.clock.now())
        sent("go", to=other)
        sent("other")
        first = sent("go", payload='{"n":1}', correlation_id="c1")
        second = sent("stop", payload='{"n":2}')
    storage = DjangoStorage(env.tenant.id)
    ref = RunRef(str(env.tenant.id), "w", run)
    with CaptureQueriesContext(connection) as seen:
        found = storage.next_signal(ref, ["go", "stop"], [])
    assert ("next_signal" in seen[0]["sql"]) is (path == "one_call")
    assert found is not None
    assert (found.signal_id, found.name, found.payload) == (first, "go", '{"n":1}')
    assert found.correlation_id == "c1"
    later = storage.next_signal(ref, ["go", "stop"], [first])
    assert later is not None and (later.signal_id, later.name) == (second, "stop")
    assert storage.next_signal(ref, ["go", "stop"], [first, second]) is None
    assert storage.next_signal(ref, ["missing"], []) is None
    # another tenant's run, asked for as this tenant: nothing (row-level security, the filter)
    assert storage.next_signal(RunRef(str(env.tenant.id), "w", foreign), ["go"], []) is None
