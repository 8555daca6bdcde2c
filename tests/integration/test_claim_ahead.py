"""A worker may claim ahead of its threads (WorkerOptions.claim_ahead, runworker
--claim-ahead; off by default): one claim fills the idle threads and a queue, and no claim is
made while claimed runs still wait for a thread. On stop, the queued runs are given back at
once, their attempts unspent.
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


def test_by_default_a_worker_claims_for_idle_threads_only() -> None:
    from workflows.worker import Worker, WorkerOptions

    worker = Worker(WorkerOptions(concurrency=4))
    worker._inflight = {Future(): None for _ in range(3)}  # type: ignore[misc]
    assert worker._free_slots() == 1


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
    worker._unfinished = 8
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
    ],
)
def test_a_finished_segment_wakes_the_loop_when_it_must(
    options: dict[str, Any], unfinished: int
) -> None:
    from workflows.worker import Worker, WorkerOptions

    worker = Worker(WorkerOptions(concurrency=4, **options))
    worker._unfinished = unfinished
    assert _finished(worker) is True
