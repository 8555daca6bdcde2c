"""A worker may claim ahead of its threads (WorkerOptions.claim_ahead, runworker
--claim-ahead): one claim fills the idle threads and a queue, and no claim is made while
claimed runs still wait for a thread. By default (``auto``) the queue follows the backlog:
it grows while claims come back full and halves when one comes back short. On stop, the
queued runs are given back at once, their attempts unspent.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import pytest
import wasmtime

from bench.engine_bench import STEPS_WAT

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("ahead", "held", "free"),
    [
        (None, 0, 8),  # as many ahead as threads; idle: threads and queue
        (None, 3, 5),  # a thread idle: fill up
        (None, 4, 4),  # every thread busy, nothing queued: refill the queue
        (None, 5, 0),  # a run waits for a thread: no claim
        (0, 0, 4),  # no queue: only idle threads
        (0, 3, 1),
        (2, 4, 2),
    ],
)
def test_how_many_runs_a_claim_may_take(ahead: int | None, held: int, free: int) -> None:
    from workflows.worker import Worker, WorkerOptions

    worker = Worker(WorkerOptions(concurrency=4, claim_ahead=ahead))
    worker._inflight = {Future(): None for _ in range(held)}  # type: ignore[misc]
    assert worker._free_slots() == free


def test_on_stop_the_runs_no_thread_started_are_given_back(tenant: Any) -> None:
    from engine.services import Services
    from workflows.definitions import deploy_definition
    from workflows.executor import set_services
    from workflows.models import RunStatus, WorkflowInstance
    from workflows.services import start_workflow
    from workflows.tenancy import tenant_context
    from workflows.worker import Worker, WorkerOptions

    calling = threading.Event()
    go_on = threading.Event()
    calls: list[str] = []

    def blocking(request: Any, *, idempotency_key: str, context: Any) -> dict[str, Any]:
        calls.append(idempotency_key)
        calling.set()
        go_on.wait(30)
        return {}

    set_services(Services.from_settings({"bench": blocking}))
    try:
        deploy_definition(tenant, "one_call", wasmtime.wat2wasm(STEPS_WAT))
        runs = [start_workflow(tenant, "one_call", 1)[0] for _ in range(4)]
        worker = Worker(WorkerOptions(worker_id="ahead", concurrency=1, claim_ahead=3))
        thread = threading.Thread(target=worker.run)
        thread.start()
        assert calling.wait(30)
        with tenant_context(tenant.id):  # one claim took all four: one runs, three queue
            held = WorkflowInstance.objects.filter(assigned_to="ahead").count()
        assert held == 4
        worker.stop()
        go_on.set()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        go_on.set()
        set_services(None)
    with tenant_context(tenant.id):
        rows = {
            str(r.id): (r.status, r.assigned_to, r.attempt)
            for r in WorkflowInstance.objects.filter(id__in=[r.id for r in runs])
        }
    assert len(calls) == 1
    done = [v for v in rows.values() if v[0] == RunStatus.DONE]
    given_back = [v for v in rows.values() if v[0] == RunStatus.READY]
    assert len(done) == 1
    assert given_back == [(RunStatus.READY, None, given_back[0][2])] * 3
    assert {v[2] for v in given_back} == {runs[0].attempt}


def test_by_default_a_new_worker_claims_for_idle_threads_only() -> None:
    from workflows.worker import Worker, WorkerOptions

    worker = Worker(WorkerOptions(concurrency=4))
    worker._inflight = {Future(): None for _ in range(3)}  # type: ignore[misc]
    assert worker._free_slots() == 1
    worker._ahead = 8  # auto: the queue the backlog has grown
    assert worker._free_slots() == 9


@pytest.mark.parametrize(
    ("ahead", "room", "claimed", "after"),
    [
        (0, 4, 4, 4),  # a full claim: more may be due, the queue grows by the threads
        (4, 8, 8, 8),
        (8, 12, 12, 12),
        (12, 16, 16, 12),  # up to three times the threads
        (12, 16, 15, 6),  # a short claim took every run due: the queue halves
        (1, 5, 0, 0),
        (8, 0, 0, 8),  # no room, no claim: unchanged
    ],
)
def test_the_automatic_queue_follows_the_backlog(
    ahead: int, room: int, claimed: int, after: int
) -> None:
    from workflows.worker import next_claim_ahead

    assert next_claim_ahead(ahead, room, claimed, concurrency=4) == after


def test_a_backlog_is_claimed_in_growing_claims(tenant: Any, monkeypatch: Any) -> None:
    """A burst worker of the default options over a backlog: its first claim is for its
    threads alone; the queue grows while claims come back full (never past three times the
    threads), and the last claims (nothing left due) leave it smaller than the largest it
    reached; every run is done."""
    from django.db import connection

    from tests.fixtures.wat import Wat
    from workflows import worker as worker_module
    from workflows.definitions import deploy_definition
    from workflows.models import RunStatus, WorkflowInstance
    from workflows.services import start_workflow
    from workflows.tenancy import tenant_context
    from workflows.worker import Worker, WorkerOptions

    w = Wat()
    w.run("(call $finish)")
    deploy_definition(tenant, "done_at_once", w.wasm())
    runs = [start_workflow(tenant, "done_at_once", None)[0] for _ in range(30)]
    claims: list[tuple[int, int]] = []
    real_claim = worker_module.claim_ready_instances

    def recording(worker_id: str, queues: Any, free: int, *args: Any, **kw: Any) -> Any:
        claimed = real_claim(worker_id, queues, free, *args, **kw)
        if free > 0:
            claims.append((free, len(claimed)))
        return claimed

    monkeypatch.setattr(worker_module, "claim_ready_instances", recording)
    queues: list[int] = []
    real_next = worker_module.next_claim_ahead

    def next_queue(*args: Any, **kw: Any) -> int:
        queues.append(real_next(*args, **kw))
        return queues[-1]

    monkeypatch.setattr(worker_module, "next_claim_ahead", next_queue)
    threads = 1 if connection.vendor == "sqlite" else 2
    worker = Worker(WorkerOptions(concurrency=threads, burst=True, poll_interval_s=0.1))
    assert worker.run() == len(runs)
    with tenant_context(tenant.id):
        statuses = set(
            WorkflowInstance.objects.filter(id__in=[r.id for r in runs]).values_list(
                "status", flat=True
            )
        )
    assert statuses == {RunStatus.DONE}
    assert claims[0] == (threads, threads)  # a new worker: its idle threads only
    assert queues[0] == threads  # that claim came back full: a queue of the threads
    assert max(queues) <= 3 * threads
    assert max(room for room, _ in claims) <= threads + max(queues)
    assert sum(got for _, got in claims) == len(runs)
    assert worker._ahead == queues[-1] < max(queues)  # the short claims at the end


def _finished(worker: Any) -> bool:
    """One claimed run's segment ends (its future done, its callback run); whether the
    callback woke the loop."""
    worker._freed.clear()
    worker._wake.clear()
    future: Future[Any] = Future()
    future.add_done_callback(worker._segment_finished)
    future.set_result(None)
    assert worker._done[-1] is future  # queued for the loop to collect, woken or not
    return bool(worker._freed.is_set() and worker._wake.is_set())


def test_a_finished_segment_wakes_the_loop_only_when_a_claim_has_room() -> None:
    """Four threads, four runs queued ahead, all eight claimed: the first three segments to
    end leave runs waiting for a thread, so no claim could take anything and the loop sleeps
    on; the fourth leaves room for a claim and wakes it. (Each end woke the loop before: a
    context switch and a loop pass per run, about 5% of the worker's CPU per step.)"""
    from workflows.worker import Worker, WorkerOptions

    worker = Worker(WorkerOptions(concurrency=4, claim_ahead=4))
    worker._submitted = 8
    assert [_finished(worker) for _ in range(3)] == [False, False, False]
    assert _finished(worker) is True  # 4 left: the claim may take 4
    assert _finished(worker) is True  # and more from here on
    assert len(worker._done) == 5


@pytest.mark.parametrize(
    ("options", "unfinished"),
    [
        ({"claim_ahead": 0}, 4),  # no queue: every end frees a thread
        ({"claim_ahead": 4, "max_segments": 100}, 8),  # the loop counts toward its limit
        ({"claim_ahead": 4}, 1),  # the last run: a burst worker may stop
        ({"claim_ahead": 4}, 4),  # a thread free: a claim may take one (and the queue)
    ],
)
def test_a_finished_segment_wakes_the_loop_when_it_must(
    options: dict[str, Any], unfinished: int
) -> None:
    from workflows.worker import Worker, WorkerOptions

    worker = Worker(WorkerOptions(concurrency=4, **options))
    worker._submitted = unfinished
    assert _finished(worker) is True


class _Report:
    steps = 1


def _collecting_worker(monkeypatch: Any, fail_first: bool = False) -> tuple[Any, list[Any]]:
    """A worker whose recorded segments go to a list (the first record raising, if asked)."""
    from workflows import worker as worker_module
    from workflows.worker import Worker, WorkerOptions

    recorded: list[Any] = []

    def record(report: Any) -> None:
        recorded.append(report)
        if fail_first and len(recorded) == 1:
            raise RuntimeError("the log handler failed")

    monkeypatch.setattr(worker_module, "record_segment", record)
    return Worker(WorkerOptions(concurrency=4, claim_ahead=4)), recorded


def _segment(worker: Any) -> Future[Any]:
    future: Future[Any] = Future()
    worker._inflight[future] = object()
    worker._submitted += 1
    future.add_done_callback(worker._segment_finished)
    return future


def test_a_segment_listed_by_the_final_wait_and_queued_is_counted_once(monkeypatch: Any) -> None:
    worker, recorded = _collecting_worker(monkeypatch)
    future = _segment(worker)
    future.set_result(_Report())  # its callback queues it
    worker._collect(block=True)  # the wait lists it too
    assert worker.processed == 1
    assert len(recorded) == 1
    assert not worker._inflight and not worker._done


def test_a_failed_record_leaves_the_other_segments_for_the_next_pass(monkeypatch: Any) -> None:
    worker, recorded = _collecting_worker(monkeypatch, fail_first=True)
    futures = [_segment(worker) for _ in range(3)]
    for future in futures:
        future.set_result(_Report())
    with pytest.raises(RuntimeError):
        worker._collect(block=False)  # the loop logs it and goes on
    worker._collect(block=False)
    assert worker.processed == 3
    assert len(recorded) == 3
    assert not worker._inflight


def test_cancelled_runs_are_counted_finished_and_left_to_be_given_back(monkeypatch: Any) -> None:
    worker, recorded = _collecting_worker(monkeypatch)
    futures = [_segment(worker) for _ in range(8)]
    for future in futures[4:7]:
        assert future.cancel()  # stop(): the runs queued for a thread
    assert not worker._freed.is_set()  # 5 unfinished: no room yet
    assert futures[7].cancel()
    assert worker._freed.is_set()  # 4 unfinished: each cancelled run counted finished
    worker._collect(block=False)
    assert worker.processed == 0 and recorded == []
    assert len(worker._inflight) == 8  # _release_queued gives the cancelled ones back
