"""The adaptive group commit (workflows/store/group_commit.py): the per-step appends of the
runs a worker process executes, and the finalizes of those that complete, written together in
shared transactions on PostgreSQL.

The gathering rules (mode switch, when a batch closes, a failed batch) are checked with the
writer replaced; the rest against the database: several runs' appends in one transaction,
a lost fence failing only its run's writes, durability (an append returns only once its
events are committed), and a whole worker run with every append batched. On SQLite and
MariaDB the same worker scenario runs with each append written directly.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import wasmtime
from django.db import DatabaseError, connection, connections

from bench.engine_bench import STEPS_WAT
from engine.errors import FenceLost
from engine.events import DurableLogEvent
from engine.storage import RunRef
from workflows.store import group_commit
from workflows.store.group_commit import GroupCommit, Settings, next_mode

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def committer(settings: Any) -> Iterator[Any]:
    """The process's group commit made again from the test's settings, and forgotten after."""

    def make(**values: Any) -> GroupCommit | None:
        for name, value in values.items():
            setattr(settings, f"CLEAT_GROUP_COMMIT_{name.upper()}", value)
        group_commit.reset()
        return group_commit.committer()

    yield make
    group_commit.reset()


# --- the rules, with the writer replaced ---------------------------------------------------------


def test_the_mode_switches_up_at_the_threshold_and_down_below_half_of_it() -> None:
    assert next_mode(False, 199.0, 200.0) is False
    assert next_mode(False, 200.0, 200.0) is True
    assert next_mode(True, 150.0, 200.0) is True  # hysteresis: stays batched
    assert next_mode(True, 99.0, 200.0) is False
    assert next_mode(False, 0.0, 0.0) is True  # threshold 0: always batched


def _ref(i: int) -> RunRef:
    return RunRef(str(uuid.uuid4()), "d", f"run-{i}", "w", 1)


def _event(step: int) -> DurableLogEvent:
    return DurableLogEvent(step=step, ts=1, message="m")


class _Recorder:
    """Stands in for ``write_batch``: records each batch; matches every run but ``lost``."""

    def __init__(self, lost: str = "", fail: bool = False, takes_s: float = 0.0) -> None:
        self.batches: list[list[str]] = []
        self.lost, self.fail, self.takes_s = lost, fail, takes_s

    def __call__(self, batch: Any) -> set[str]:
        self.batches.append([item.ref.run_id for item in batch])
        time.sleep(self.takes_s)  # the write's round trip and commit
        if self.fail:
            raise DatabaseError("deadlock detected")
        return {item.ref.run_id for item in batch} - {self.lost}


def _appends_together(
    group: GroupCommit, runs: int, monkeypatch: Any, recorder: _Recorder
) -> dict[str, Any]:
    """``runs`` threads, each in a segment, append one event at the same moment."""
    monkeypatch.setattr(group_commit, "write_batch", recorder)
    monkeypatch.setattr(group_commit, "_can_batch", lambda conn: True)
    results: dict[str, Any] = {}
    barrier = threading.Barrier(runs)

    def one(i: int) -> None:
        ref = _ref(i)
        barrier.wait()
        results[ref.run_id] = group.append(uuid.uuid4(), ref, [_event(0)], _now())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results


def _now() -> Any:
    from django.utils import timezone

    return timezone.now()


def test_a_batch_gathers_while_the_one_before_it_is_written(monkeypatch: Any) -> None:
    """Eight segments, a wait of a minute, writes that take 0.2 s: the first append is
    written at once (nothing else is being written); the others, arriving meanwhile, gather
    and are written together as soon as that write is done -- not after the minute."""
    group = GroupCommit(Settings(enabled=True, min_rate=0, max_events=64, max_wait_s=60.0))
    recorder = _Recorder(takes_s=0.2)
    started = time.monotonic()
    results = _appends_together(group, 8, monkeypatch, recorder)
    assert time.monotonic() - started < 30
    assert sorted(results.values()) == [True] * 8
    assert sum(len(b) for b in recorder.batches) == 8
    assert len(recorder.batches) <= 3, recorder.batches  # shared, one write at a time
    assert group.totals["batched"] == 8


def test_a_batch_closes_at_its_event_limit(monkeypatch: Any) -> None:
    group = GroupCommit(Settings(enabled=True, min_rate=0, max_events=2, max_wait_s=60.0))
    recorder = _Recorder()
    results = _appends_together(group, 6, monkeypatch, recorder)
    assert sorted(results.values()) == [True] * 6
    assert max(len(b) for b in recorder.batches) <= 2


def test_a_lone_append_is_written_at_once_when_nothing_else_is(monkeypatch: Any) -> None:
    """One segment appends while another runs on without appending, a wait of a minute:
    nothing is being written, so the append is, at once -- a batch does not wait for
    segments still computing while the database has nothing to do."""
    group = GroupCommit(Settings(enabled=True, min_rate=0, max_events=64, max_wait_s=60.0))
    recorder = _Recorder()
    monkeypatch.setattr(group_commit, "write_batch", recorder)
    monkeypatch.setattr(group_commit, "_can_batch", lambda conn: True)
    started = time.monotonic()
    assert group.append(uuid.uuid4(), _ref(0), [_event(0)], _now()) is True
    waited = time.monotonic() - started
    assert waited < 5
    assert len(recorder.batches) == 1


def test_an_append_waits_for_the_write_in_progress_or_its_wait(monkeypatch: Any) -> None:
    """An append that arrives while another batch is being written waits for that write to
    end, then is written: with a long wait, 0.3 s (the first write); with a wait of 0.05 s,
    the wait -- so two writes are then in flight at once."""
    for max_wait_s, low, high in ((60.0, 0.2, 5.0), (0.05, 0.03, 0.25)):
        group = GroupCommit(
            Settings(enabled=True, min_rate=0, max_events=64, max_wait_s=max_wait_s)
        )
        recorder = _Recorder(takes_s=0.3)
        monkeypatch.setattr(group_commit, "write_batch", recorder)
        monkeypatch.setattr(group_commit, "_can_batch", lambda conn: True)
        waited: list[float] = []

        def first(group: GroupCommit = group) -> None:
            group.append(uuid.uuid4(), _ref(0), [_event(0)], _now())

        writing = threading.Thread(target=first)
        writing.start()
        while not recorder.batches:
            time.sleep(0.001)
        started = time.monotonic()
        assert group.append(uuid.uuid4(), _ref(1), [_event(0)], _now()) is True
        waited.append(time.monotonic() - started - recorder.takes_s)  # less its own write
        writing.join(10)
        assert low <= waited[0] < high, (max_wait_s, waited)
        assert [len(b) for b in recorder.batches] == [1, 1]


def test_a_lost_fence_fails_only_its_runs_writes(monkeypatch: Any) -> None:
    group = GroupCommit(Settings(enabled=True, min_rate=0, max_events=64, max_wait_s=60.0))
    recorder = _Recorder(lost="run-3")
    results = _appends_together(group, 5, monkeypatch, recorder)
    assert results.pop("run-3") is False
    assert list(results.values()) == [True] * 4


def test_a_failed_batch_sends_each_append_to_be_written_directly(monkeypatch: Any) -> None:
    group = GroupCommit(Settings(enabled=True, min_rate=0, max_events=64, max_wait_s=60.0))
    results = _appends_together(group, 4, monkeypatch, _Recorder(fail=True))
    assert list(results.values()) == [None] * 4
    assert group.totals["fallback"] == 4


def test_any_error_of_the_batch_is_no_one_runs_own(monkeypatch: Any) -> None:
    """Not only a database error: whatever the leader's write raises, no run of the batch
    (the leader's included) sees it; each writes its own append directly."""

    def broken(batch: Any) -> set[str]:
        raise ValueError("not a database error")

    group = GroupCommit(Settings(enabled=True, min_rate=0, max_events=64, max_wait_s=60.0))
    monkeypatch.setattr(group_commit, "_can_batch", lambda conn: True)
    monkeypatch.setattr(group_commit, "write_batch", broken)
    assert group.append(uuid.uuid4(), _ref(0), [_event(0)], _now()) is None


def test_a_run_is_never_twice_in_one_batch(monkeypatch: Any) -> None:
    """Events join their run by id in the statement: a second append of a run already in
    the open batch waits for the next one."""
    group = GroupCommit(Settings(enabled=True, min_rate=0, max_events=64, max_wait_s=0.2))
    recorder = _Recorder()
    monkeypatch.setattr(group_commit, "write_batch", recorder)
    monkeypatch.setattr(group_commit, "_can_batch", lambda conn: True)
    ref = _ref(0)
    results: list[Any] = []
    barrier = threading.Barrier(2)

    def one(step: int) -> None:
        barrier.wait()
        results.append(group.append(uuid.uuid4(), ref, [_event(step)], _now()))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [True, True]
    assert recorder.batches == [[ref.run_id], [ref.run_id]]


def test_below_the_threshold_each_append_is_direct_and_above_it_batched(
    monkeypatch: Any,
) -> None:
    group = GroupCommit(Settings(enabled=True, min_rate=1000, max_events=64, max_wait_s=0.0))
    monkeypatch.setattr(group_commit, "write_batch", _Recorder())
    monkeypatch.setattr(group_commit, "_can_batch", lambda conn: True)
    ref = _ref(0)
    assert group.append(uuid.uuid4(), ref, [_event(0)], _now()) is None  # slow: direct
    deadline = time.monotonic() + 5
    while not group.batched and time.monotonic() < deadline:  # fast: batched after a window
        group.append(uuid.uuid4(), ref, [_event(0)], _now())
    assert group.batched
    assert group.append(uuid.uuid4(), ref, [_event(0)], _now()) is True
    time.sleep(group_commit.RATE_WINDOW_S * 2)
    group.append(uuid.uuid4(), ref, [_event(0)], _now())  # a slow window: direct again
    assert not group.batched
    assert group.totals["direct"] >= 2


def test_finalizes_share_a_batch_and_each_gets_its_own_answer(monkeypatch: Any) -> None:
    """The finalizes of completed runs gather as the appends do; each caller gets its own
    run's answer (whether its fence matched, and its parent to wake)."""
    group = GroupCommit(
        Settings(enabled=True, min_rate=0, max_events=64, max_wait_s=60.0),
        lambda batch: group_commit.write_finalizes(batch),
    )
    monkeypatch.setattr(group_commit, "finalizer", lambda: group)
    batches: list[list[str]] = []

    def written(batch: Any) -> set[str]:
        batches.append([item.ref.run_id for item in batch])
        time.sleep(0.2)
        for item in batch:
            item.answer = f"parent-of-{item.ref.run_id}"
        return {item.ref.run_id for item in batch} - {"run-2"}

    monkeypatch.setattr(group_commit, "write_finalizes", written)
    results: dict[str, Any] = {}
    barrier = threading.Barrier(6)

    def one(i: int) -> None:
        ref = _ref(i)
        barrier.wait()
        results[ref.run_id] = group_commit.finalize(ref, {"i": i}, [])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results.pop("run-2") == (False, "parent-of-run-2")
    assert results == {f"run-{i}": (True, f"parent-of-run-{i}") for i in (0, 1, 3, 4, 5)}
    assert sum(len(b) for b in batches) == 6
    assert len(batches) <= 3, batches
    assert group.totals["batched"] == 6


def test_a_slow_process_finalizes_directly(monkeypatch: Any) -> None:
    """Below the threshold a finalize is not batched: the caller writes it in a
    transaction of its own."""
    group = GroupCommit(
        Settings(enabled=True, min_rate=1000, max_events=64, max_wait_s=0.0),
        lambda batch: pytest.fail("a slow process's finalize was batched"),
    )
    monkeypatch.setattr(group_commit, "finalizer", lambda: group)
    assert group_commit.finalize(_ref(0), {}, []) is None
    assert group.totals["direct"] == 1


# --- against the database ------------------------------------------------------------------------


def _claimed_runs(tenant: Any, count: int, worker: str) -> list[RunRef]:
    from workflows.definitions import deploy_definition
    from workflows.services import start_workflow
    from workflows.store.lifecycle import claim_ready_instances, load_run

    deploy_definition(tenant, "steps", wasmtime.wat2wasm(STEPS_WAT))
    for _ in range(count):
        start_workflow(tenant, "steps", 3)
    refs = []
    for claim in claim_ready_instances(worker, ["default"], count, _now()):
        loaded = load_run(claim, worker)
        assert loaded is not None
        refs.append(loaded.ref)
    assert len(refs) == count
    return refs


def _stored_steps(tenant: Any, run_id: str) -> list[int]:
    from workflows.models import WorkflowEvent
    from workflows.tenancy import tenant_context

    with tenant_context(tenant.id):
        return list(
            WorkflowEvent.objects.filter(instance_id=run_id)
            .order_by("step")
            .values_list("step", flat=True)
        )


def _together(refs: list[RunRef], write: Any) -> dict[str, Any]:
    """``write(ref)`` for each run, on a thread of its own, all at the same moment: each
    run's answer, or the ``FenceLost`` it raised."""
    barrier = threading.Barrier(len(refs))
    outcome: dict[str, Any] = {}

    def one(ref: RunRef) -> None:
        try:
            barrier.wait()
            outcome[ref.run_id] = write(ref)
        except FenceLost as exc:
            outcome[ref.run_id] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one, args=(ref,)) for ref in refs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return outcome


@pytest.mark.postgres_only  # the shared transactions are PostgreSQL's; elsewhere: direct
def test_runs_appending_together_share_a_transaction_and_a_lost_fence_fails_alone(
    tenant: Any, committer: Any
) -> None:
    from workflows.models import WorkflowInstance
    from workflows.store.storage import DjangoStorage
    from workflows.tenancy import tenant_context

    group = committer(min_rate=0, max_wait_ms=30_000)
    assert group is not None
    refs = _claimed_runs(tenant, 5, "gc")
    lost = refs[2]
    with tenant_context(tenant.id):  # reaped and claimed again elsewhere meanwhile
        WorkflowInstance.objects.filter(id=lost.run_id).update(generation=lost.generation + 1)
    storage = DjangoStorage(tenant.id)

    def append(ref: RunRef) -> str:
        storage.append_events(ref, [_event(0), _event(1)])
        return "ok"

    outcome = _together(refs, append)
    assert isinstance(outcome.pop(lost.run_id), FenceLost)
    assert list(outcome.values()) == ["ok"] * 4
    assert _stored_steps(tenant, lost.run_id) == []
    for ref in refs:
        if ref is not lost:
            assert _stored_steps(tenant, ref.run_id) == [0, 1]
    assert group.totals["batched"] == 5
    assert group.totals["batches"] < 5  # shared


@pytest.mark.postgres_only  # the shared transactions are PostgreSQL's; elsewhere: direct
def test_an_append_returns_only_once_its_events_are_committed(tenant: Any, committer: Any) -> None:
    """What a run does after its append (the guest's next call, a reply to a client) may
    rely on the event: another connection already sees it."""
    from workflows.store.storage import DjangoStorage

    group = committer(min_rate=0)
    assert group is not None
    [ref] = _claimed_runs(tenant, 1, "gc")
    DjangoStorage(tenant.id).append_events(ref, [_event(0)])
    assert group.totals["batched"] == 1
    seen: list[list[int]] = []

    def look() -> None:
        seen.append(_stored_steps(tenant, ref.run_id))
        connections.close_all()

    reader = threading.Thread(target=look)
    reader.start()
    reader.join(30)
    assert seen == [[0]]


@pytest.mark.postgres_only  # the shared transactions are PostgreSQL's; elsewhere: direct
def test_an_append_looks_up_its_threads_connection_once_per_function(
    tenant: Any, committer: Any, monkeypatch: Any
) -> None:
    """Django's ``connection`` proxy looks the thread's connection up at every attribute
    read through it (about 5 µs each, several times an append before): the append and the
    batch's write each look it up once."""
    from django.utils.connection import BaseConnectionHandler

    from workflows.store.storage import DjangoStorage

    group = committer(min_rate=0)
    assert group is not None
    [ref] = _claimed_runs(tenant, 1, "gc")
    storage = DjangoStorage(tenant.id)
    lookups: list[str] = []
    real = BaseConnectionHandler.__getitem__

    def counted(handler: Any, alias: str) -> Any:
        lookups.append(alias)
        return real(handler, alias)

    with monkeypatch.context() as patched:
        patched.setattr(BaseConnectionHandler, "__getitem__", counted)
        storage.append_events(ref, [_event(0)])
    assert group.totals["batched"] == 1
    assert lookups == ["default", "default"]  # the append's, the batch's write's
    assert _stored_steps(tenant, ref.run_id) == [0]


@pytest.mark.postgres_only  # the shared transactions are PostgreSQL's; elsewhere: direct
def test_a_batch_the_database_refuses_is_written_directly(
    tenant: Any, committer: Any, monkeypatch: Any
) -> None:
    from workflows.store.storage import DjangoStorage

    group = committer(min_rate=0)
    assert group is not None
    [ref] = _claimed_runs(tenant, 1, "gc")
    real = group_commit.write_batch
    calls: list[int] = []

    def refused_once(batch: Any) -> set[str]:
        calls.append(len(batch))
        if len(calls) == 1:  # the batch: the server refuses its statement
            with connection.cursor() as cursor:
                cursor.execute("SELECT no_such_column FROM workflows_workflowinstance")
        return real(batch)

    monkeypatch.setattr(group_commit, "write_batch", refused_once)
    DjangoStorage(tenant.id).append_events(ref, [_event(0), _event(1)])
    assert group.totals["fallback"] == 1
    assert _stored_steps(tenant, ref.run_id) == [0, 1]


def test_a_worker_with_every_append_batched_loses_nothing(tenant: Any, committer: Any) -> None:
    """40 runs of 5 steps through a worker with 8 segment threads, group commit always on.
    On PostgreSQL the appends share transactions; on the other stores each is written on
    its own (the statements are PostgreSQL's): the same outcome either way."""
    from engine.services import Services
    from workflows.definitions import deploy_definition
    from workflows.executor import set_services
    from workflows.models import RunStatus, WorkflowInstance
    from workflows.services import start_workflow
    from workflows.tenancy import tenant_context
    from workflows.worker import Worker, WorkerOptions

    group = committer(min_rate=0)
    assert group is not None
    set_services(Services.from_settings({"bench": lambda request, **_: {}}))
    try:
        deploy_definition(tenant, "steps", wasmtime.wat2wasm(STEPS_WAT))
        runs = [start_workflow(tenant, "steps", 5)[0] for _ in range(40)]
        Worker(WorkerOptions(worker_id="gc-worker", concurrency=8, burst=True)).run()
    finally:
        set_services(None)
    with tenant_context(tenant.id):
        rows = list(
            WorkflowInstance.objects.filter(id__in=[r.id for r in runs]).values_list(
                "status", "event_count"
            )
        )
    assert rows == [(RunStatus.DONE, 5)] * 40
    for run in runs:
        assert _stored_steps(tenant, str(run.id)) == [0, 1, 2, 3, 4]
    finalizes = group_commit.finalizer()
    assert finalizes is not None
    if connection.vendor == "postgresql":
        # each run's first four calls: the fifth's event is written by the run's finalize
        assert group.totals["batched"] == 40 * 4
        assert group.totals["direct"] == 0
        assert finalizes.totals["batched"] == 40
    else:
        assert group.totals["batched"] == 0
        assert finalizes.totals["batched"] == 0


def _completed(steps: int) -> Any:
    """A segment's result that completes its run after ``steps`` new events."""
    from engine.outcomes import Completed, SegmentResult

    events = tuple(_event(step) for step in range(steps))
    return SegmentResult(Completed('"ok"'), events, events, {}, 0, steps)


@pytest.mark.postgres_only  # the shared transactions are PostgreSQL's; elsewhere: direct
def test_runs_completing_together_share_a_finalize_and_a_lost_fence_fails_alone(
    tenant: Any, committer: Any
) -> None:
    from workflows.models import RunStatus, WorkflowInstance
    from workflows.store.lifecycle import finalize_segment
    from workflows.tenancy import tenant_context

    committer(min_rate=0, max_wait_ms=30_000)
    finalizes = group_commit.finalizer()
    assert finalizes is not None
    refs = _claimed_runs(tenant, 5, "gc")
    lost = refs[2]
    with tenant_context(tenant.id):  # reaped and claimed again elsewhere meanwhile
        WorkflowInstance.objects.filter(id=lost.run_id).update(generation=lost.generation + 1)
    outcome = _together(refs, lambda ref: finalize_segment(ref, _completed(2)).status)
    assert isinstance(outcome.pop(lost.run_id), FenceLost)
    assert list(outcome.values()) == [RunStatus.DONE] * 4
    assert _stored_steps(tenant, lost.run_id) == []
    with tenant_context(tenant.id):
        statuses = dict(
            WorkflowInstance.objects.filter(id__in=[r.run_id for r in refs]).values_list(
                "id", "status"
            )
        )
    for ref in refs:
        if ref is not lost:
            assert _stored_steps(tenant, ref.run_id) == [0, 1]
            assert statuses[uuid.UUID(ref.run_id)] == RunStatus.DONE
    assert statuses[uuid.UUID(lost.run_id)] == RunStatus.RUNNING  # untouched by this worker
    assert finalizes.totals["batched"] == 5
    assert finalizes.totals["batches"] < 5  # shared


def _suspended(steps: int) -> Any:
    """A segment's result that suspends its run, waiting for the signal "go", after
    ``steps`` new events."""
    from engine.outcomes import SegmentResult, Suspended, WaitCondition, WaitKind

    events = tuple(_event(step) for step in range(steps))
    wait = WaitCondition(WaitKind.SIGNALS, signals=("go",))
    return SegmentResult(Suspended(wait), events, events, {}, 0, steps)


@pytest.mark.postgres_only  # the shared transactions are PostgreSQL's; elsewhere: direct
def test_runs_suspending_together_share_a_finalize_and_a_lost_fence_fails_alone(
    tenant: Any, committer: Any
) -> None:
    """Suspends gathered by their own group commit: one statement for several runs, each
    with its events and its wait, the arrival read for each (one run has its signal
    already: due at once); the run whose fence was lost is not written and fails alone."""
    from workflows.models import RunStatus, Signal, WorkflowInstance
    from workflows.store.lifecycle import finalize_segment
    from workflows.tenancy import tenant_context

    committer(min_rate=0, max_wait_ms=30_000)
    suspends = group_commit.suspender()
    assert suspends is not None
    refs = _claimed_runs(tenant, 5, "gc")
    lost, signalled = refs[2], refs[3]
    with tenant_context(tenant.id):  # reaped and claimed again elsewhere meanwhile
        WorkflowInstance.objects.filter(id=lost.run_id).update(generation=lost.generation + 1)
        Signal.objects.create(tenant_id=tenant.id, instance_id=signalled.run_id, name="go")
    now = _now()
    outcome = _together(refs, lambda ref: finalize_segment(ref, _suspended(2), now).status)
    assert isinstance(outcome.pop(lost.run_id), FenceLost)
    assert list(outcome.values()) == [RunStatus.READY] * 4
    assert _stored_steps(tenant, lost.run_id) == []
    with tenant_context(tenant.id):
        rows = {
            str(i): (status, due, waiting)
            for i, status, due, waiting in WorkflowInstance.objects.filter(
                id__in=[r.run_id for r in refs]
            ).values_list("id", "status", "next_wake_at", "waiting_on")
        }
    for ref in refs:
        status, due, waiting = rows[ref.run_id]
        if ref is lost:
            assert status == RunStatus.RUNNING  # untouched by this worker
            continue
        assert _stored_steps(tenant, ref.run_id) == [0, 1]
        assert status == RunStatus.READY and waiting["signals"] == ["go"]
        assert (due == now) is (ref is signalled)
    assert suspends.totals["batched"] == 5
    assert suspends.totals["batches"] < 5  # shared


@pytest.mark.postgres_only  # the one-call finalize is PostgreSQL's function
def test_one_finalize_call_writes_each_tenants_matched_runs_and_nothing_of_a_lost_one(
    tenant: Any, other_tenant: Any
) -> None:
    """One call of ``finalize_done`` with completed runs of two tenants (each set in turn,
    under RLS): each matched run is done with its events, its workflow's locks released and
    its pending update failed; the run whose fence was lost keeps its row, its lock and its
    pending update; the caller's tenant setting is as it was."""
    from workflows.models import ConcurrencyKey, RunStatus, UpdateRequest, WorkflowInstance
    from workflows.store.lifecycle import completion_entry
    from workflows.tenancy import tenant_context

    mine = _claimed_runs(tenant, 2, "gc")
    theirs = _claimed_runs(other_tenant, 2, "gc")
    lost = theirs[1]
    owners = [(tenant, ref) for ref in mine] + [(other_tenant, ref) for ref in theirs]
    for owner, ref in owners:
        with tenant_context(owner.id):
            ConcurrencyKey.objects.create(
                tenant_id=owner.id, key=f"k-{ref.run_id}", holder=ref.workflow_id
            )
            UpdateRequest.objects.create(tenant_id=owner.id, instance_id=ref.run_id, name="u")
    with tenant_context(other_tenant.id):  # reaped and claimed again elsewhere meanwhile
        WorkflowInstance.objects.filter(id=lost.run_id).update(generation=lost.generation + 1)
    runs, rows = [], []
    for owner, ref in owners:
        entry = completion_entry(owner.id, ref, _completed(2), _now())
        assert entry is not None
        runs.append(entry[0])
        rows += entry[1]
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('cleat.tenant_id', 'the caller''s', false)")

    parents = group_commit.finalize_runs(runs, rows)

    assert parents == {ref.run_id: None for _, ref in owners if ref is not lost}
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('cleat.tenant_id', true)")
        assert cursor.fetchone() == ("the caller's",)
    for owner, ref in owners:
        written = ref is not lost
        with tenant_context(owner.id):
            status = WorkflowInstance.objects.get(id=ref.run_id).status
            assert status == (RunStatus.DONE if written else RunStatus.RUNNING)
            held = ConcurrencyKey.objects.filter(holder=ref.workflow_id).exists()
            assert held is not written
            update = UpdateRequest.objects.get(instance_id=ref.run_id)
        assert _stored_steps(owner, ref.run_id) == ([0, 1] if written else [])
        assert update.status == (
            UpdateRequest.State.FAILED if written else UpdateRequest.State.PENDING
        )
        assert (update.completed_at is not None) is written


@pytest.mark.postgres_only  # the shared transactions are PostgreSQL's; elsewhere: direct
def test_a_finalize_returns_only_once_committed_and_a_refused_batch_is_written_directly(
    tenant: Any, committer: Any, monkeypatch: Any
) -> None:
    """A batch the server refuses wrote nothing; each of its finalizes is then written on
    its own. Whichever way, the run is done for every other connection when the finalize
    returns."""
    from workflows.models import RunStatus, WorkflowInstance
    from workflows.store.lifecycle import finalize_segment
    from workflows.tenancy import tenant_context

    committer(min_rate=0)
    finalizes = group_commit.finalizer()
    assert finalizes is not None
    first, second = _claimed_runs(tenant, 2, "gc")
    real = group_commit.write_finalizes
    calls: list[int] = []

    def refused_once(batch: Any) -> set[str]:
        calls.append(len(batch))
        if len(calls) == 1:
            with connection.cursor() as cursor:
                cursor.execute("SELECT no_such_column FROM workflows_workflowinstance")
        return real(batch)

    monkeypatch.setattr(group_commit, "write_finalizes", refused_once)
    seen: list[Any] = []

    def look(run_id: str) -> None:
        with tenant_context(tenant.id):
            seen.append(WorkflowInstance.objects.get(id=run_id).status)
        connections.close_all()

    for ref, path in ((first, "fallback"), (second, "batched")):
        assert finalize_segment(ref, _completed(1)).status == RunStatus.DONE
        assert finalizes.totals[path] == 1
        reader = threading.Thread(target=look, args=(ref.run_id,))
        reader.start()
        reader.join(30)
        assert _stored_steps(tenant, ref.run_id) == [0]
    assert seen == [RunStatus.DONE, RunStatus.DONE]
    assert calls == [1, 1]


@pytest.mark.postgres_only  # the heartbeat's definer function is PostgreSQL's
def test_the_heartbeat_skips_a_row_a_batch_has_locked(tenant: Any) -> None:
    """A batch locks several of the worker's rows; the worker's heartbeat must not wait for
    them (it could deadlock with the batch): it renews the others and returns at once."""
    from django.db import connections as conns

    from workflows.store.lifecycle import heartbeat_worker

    refs = _claimed_runs(tenant, 3, "beat")
    locker = conns.create_connection("default")
    try:
        locker.set_autocommit(False)
        with locker.cursor() as cursor:
            cursor.execute("SELECT set_config('cleat.tenant_id', %s, true)", [str(tenant.id)])
            cursor.execute(
                "SELECT id FROM workflows_workflowinstance WHERE id = %s FOR NO KEY UPDATE",
                [refs[0].run_id],
            )
            with connection.cursor() as mine:  # waiting for the lock fails, not hangs
                mine.execute("SET lock_timeout = '3s'")
            try:
                renewed = heartbeat_worker("beat", _now())
            finally:
                with connection.cursor() as mine:
                    mine.execute("RESET lock_timeout")
        assert renewed == 2
    finally:
        locker.rollback()
        locker.close()
