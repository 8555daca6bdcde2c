"""Real ``manage.py runworker`` processes sharing one PostgreSQL database (connected as the
RLS-bound application role): two workers racing over a thousand runs, a worker killed with
SIGKILL in the middle of service calls and its runs (those in flight and those queued for a
thread) recovered by another, and SIGTERM
letting a running segment finish.

The workflow makes two durable calls to an HTTP ledger served by the test process
(``support.ledger``), which honours ``Idempotency-Key``: the ledger's books show whether any
call's effect happened twice, and its request counts show the engine re-sending a key.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from engine.determinism import idempotency_key
from engine.events import CallEvent, EncodedEvent, decode, verify
from tests.fixtures.wat import Wat
from tests.integration.support.ledger import Ledger
from tests.integration.support.processes import WorkerProcess, command_env, wait_until
from workflows import definitions, services
from workflows.models import RunStatus, Tenant, WorkflowDefinition, WorkflowEvent, WorkflowInstance
from workflows.tenancy import tenant_context

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

OPERATIONS = ("debit", "credit")


def transfer() -> bytes:
    """Debit then credit the ledger with the run's input; the result is both answers."""
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call {w.s("ledger")} {w.s("debit")} {w.input()}))
    (call $rec (call $durable_call {w.s("ledger")} {w.s("credit")} {w.input()}))
    (call $finish)"""
    )
    return w.wasm()


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    with Ledger().serving() as served:
        yield served


@pytest.fixture
def deployed(tenant: Tenant) -> Tenant:
    definitions.deploy_definition(tenant, "transfer", transfer())
    return tenant


@pytest.fixture(autouse=True)
def _on_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.fail(
            "these tests race real worker processes on PostgreSQL: run them with "
            "CLEAT_TEST_DB=postgres, or deselect them with -m 'not postgres_only'"
        )


def start_runs(tenant: Tenant, count: int) -> dict[str, int]:
    """Start ``count`` transfers through the service; run id -> the ``n`` in its input."""
    runs = {}
    for n in range(count):
        instance, _ = services.start_workflow(tenant, "transfer", json.dumps({"n": n}))
        runs[str(instance.id)] = n
    return runs


def create_runs(tenant: Tenant, count: int) -> dict[str, int]:
    """Like :func:`start_runs`, in one INSERT: the rows ``start_workflow`` makes (due now),
    without a thousand round trips before the race even starts."""
    with tenant_context(tenant.id):
        definition = WorkflowDefinition.objects.get(tenant_id=tenant.id, name="transfer")
        rows = []
        for n in range(count):
            run_id = uuid.uuid4()
            rows.append(
                WorkflowInstance(
                    id=run_id,
                    tenant=tenant,
                    workflow_id=str(run_id),
                    definition=definition,
                    definition_name=definition.name,
                    definition_version=definition.version,
                    entry_point="run",
                    input=json.dumps({"n": n}, separators=(",", ":")),
                )
            )
        WorkflowInstance.objects.bulk_create(rows)
    return {str(row.id): n for n, row in enumerate(rows)}


def worker(tmp_path: Path, name: str, ledger: Ledger, *args: str) -> WorkerProcess:
    return WorkerProcess(
        tmp_path / f"{name}.log",
        ["--worker-id", name, "--poll-interval", "0.2", *args],
        command_env({"ledger": ledger.url}),
    )


def statuses(tenant: Tenant) -> Counter[str]:
    with tenant_context(tenant.id):
        return Counter(WorkflowInstance.objects.values_list("status", flat=True))


def check_books(tenant: Tenant, runs: dict[str, int], ledger: Ledger) -> dict[str, int]:
    """Every run done once with the ledger's answers; its history exactly one call event per
    step 0 and 1 (no fenced write lost or doubled), each checksummed and agreeing with the
    ledger; the ledger holding exactly one effect per expected idempotency key. Returns each
    run's generation."""
    with tenant_context(tenant.id):
        rows = {
            str(r["id"]): r
            for r in WorkflowInstance.objects.values(
                "id", "workflow_id", "status", "result", "error", "generation"
            )
        }
        history: dict[str, list[EncodedEvent]] = {run: [] for run in rows}
        for run, *stored in WorkflowEvent.objects.order_by("instance_id", "step").values_list(
            "instance_id", "step", "type_code", "timestamp_ms", "payload", "checksum"
        ):
            history[str(run)].append(EncodedEvent(*stored))
    assert set(rows) == set(runs), "runs appeared or vanished"
    not_done = {run: (r["status"], r["error"]) for run, r in rows.items() if r["status"] != "done"}
    assert not not_done, f"{len(not_done)} run(s) not done, e.g. {list(not_done.items())[:3]}"

    expected_keys = set()
    for run, n in runs.items():
        row, events = rows[run], history[run]
        assert [e.step for e in events] == [0, 1], f"run {run} history steps {events}"
        answers = []
        for step, operation in enumerate(OPERATIONS):
            key = idempotency_key(row["workflow_id"], run, step)
            expected_keys.add(key)
            entry = ledger.entries[key]
            assert (entry.operation, entry.request) == (operation, {"n": n})
            event = decode(events[step])
            assert verify(events[step]), f"run {run} step {step}: checksum mismatch"
            assert isinstance(event, CallEvent)
            assert (event.operation, event.response) == (operation, entry.response)
            answers.append([0, entry.response])
        assert json.loads(row["result"]) == answers, f"run {run} result {row['result']}"
    assert set(ledger.entries) == expected_keys, "the ledger saw calls no run recorded"
    assert sorted(e.seq for e in ledger.entries.values()) == list(range(1, 2 * len(runs) + 1))
    assert not ledger.mismatches
    return {run: r["generation"] for run, r in rows.items()}


def test_two_worker_processes_race_over_a_thousand_runs(
    deployed: Tenant, ledger: Ledger, tmp_path: Path
) -> None:
    """Two ``runworker --burst`` processes (4 threads each) claim from the same table with
    SKIP LOCKED: every run is executed by exactly one of them, once, and both do work."""
    runs = create_runs(deployed, 1000)
    cpu_before = _children_cpu()
    started = time.monotonic()
    with (
        worker(tmp_path, "race-a", ledger, "--concurrency", "4", "--burst") as a,
        worker(tmp_path, "race-b", ledger, "--concurrency", "4", "--burst") as b,
    ):
        assert a.wait(timeout=240) == 0, a.log()
        assert b.wait(timeout=240) == 0, b.log()
    elapsed = time.monotonic() - started
    print(
        f"\n1000 runs, 2 worker processes x 4 threads: {elapsed:.1f}s wall, "
        f"{_children_cpu() - cpu_before:.1f}s worker CPU, load {os.getloadavg()[0]:.1f}",
        file=sys.stderr,
    )

    generations = check_books(deployed, runs, ledger)
    # One claim per run: a second claim (or a reap) would have bumped the generation.
    assert set(generations.values()) == {1}
    assert set(ledger.requests.values()) == {1}, "a call was sent twice"
    by_worker = {w.args[1]: w.segments() for w in (a, b)}
    for name, lines in by_worker.items():
        assert lines, f"{name} did no work:\n{a.log() if name == 'race-a' else b.log()}"
        assert {(s.outcome, s.status) for s in lines} == {("completed", "done")}
    executed = Counter(s.run_id for lines in by_worker.values() for s in lines)
    assert set(executed) == set(runs)
    assert set(executed.values()) == {1}, "a run was executed by both workers"
    for w in (a, b):
        log = w.log()
        assert "fence_lost" not in log and "Traceback" not in log, log[-3000:]


def killed_mid_call(
    tenant: Tenant, ledger: Ledger, tmp_path: Path, name: str, calls: int, *args: str
) -> tuple[set[str], dict[Any, str]]:
    """A worker ``name`` (lease 2 s, ``args``) SIGKILLed once ``calls`` ledger calls are in
    flight (their effects done, their answers held back); the ledger then answers again.
    Returns the keys that were in flight and the runs left running, with their owner."""
    ledger.hold(30)
    with worker(tmp_path, name, ledger, *args, "--lease", "2") as killed:
        wait_until(lambda: ledger.held == calls, 30, f"{calls} ledger call(s) in flight")
        in_flight = set(ledger.entries)
        killed.kill()
    ledger.release()
    with tenant_context(tenant.id):
        orphaned = dict(
            WorkflowInstance.objects.filter(status=RunStatus.RUNNING).values_list(
                "id", "assigned_to"
            )
        )
    return in_flight, orphaned


def recovered(
    tenant: Tenant, ledger: Ledger, tmp_path: Path, name: str, runs: int
) -> WorkerProcess:
    """A second worker (4 threads; a little more lease than the killed one's, so that on a
    loaded machine it does not reap its own runs) until all ``runs`` are done, stopped
    cleanly."""
    with worker(tmp_path, name, ledger, "--concurrency", "4", "--lease", "3") as second:
        wait_until(lambda: statuses(tenant)[RunStatus.DONE] == runs, 60, "every run done", 0.2)
        second.terminate()
        assert second.wait(timeout=30) == 0, second.log()
    return second


def test_a_worker_killed_mid_call_is_reaped_and_the_key_deduplicates_the_resend(
    deployed: Tenant, ledger: Ledger, tmp_path: Path
) -> None:
    """SIGKILL a worker while its four runs sit in a slow ledger call (the effect done, the
    answer not yet back); a second worker with a 3 s lease reaps them, replays them, sends
    the same idempotency keys again and gets the stored answers: every run completes and
    every effect happened exactly once."""
    runs = start_runs(deployed, 8)
    # No queue ahead of the threads: a holds exactly the four runs in flight, and the other
    # four stay ready (runs queued ahead: the next test).
    in_flight, orphaned = killed_mid_call(
        deployed, ledger, tmp_path, "crash-a", 4, "--concurrency", "4", "--claim-ahead", "0"
    )
    assert set(orphaned.values()) == {"crash-a"} and len(orphaned) == 4
    assert statuses(deployed)[RunStatus.READY] == 4
    b = recovered(deployed, ledger, tmp_path, "crash-b", len(runs))

    generations = check_books(deployed, runs, ledger)
    crashed = {str(run) for run in orphaned}
    # The crashed runs: claimed by a (1), reaped (2), claimed by b (3); the rest claimed once.
    assert {run: g for run, g in generations.items() if g != 1} == dict.fromkeys(crashed, 3)
    # Exactly the calls that were in flight were sent again, once, and performed once.
    assert in_flight == {idempotency_key(str(run), str(run), 0) for run in crashed}, (
        "the in-flight keys are not the crashed runs' first calls"
    )
    assert ledger.repeated_keys() == in_flight
    assert all(ledger.requests[key] == 2 for key in in_flight)
    log = b.log()
    reaped = sum(int(n) for n in _values(log, "event=reaped count="))
    assert reaped == 4, log
    assert {s.run_id for s in b.segments()} == set(runs)
    assert "event=worker_stopped worker=crash-b" in log


def test_a_killed_workers_queued_runs_are_reaped_and_run_once(
    deployed: Tenant, ledger: Ledger, tmp_path: Path
) -> None:
    """A worker that claims ahead of its threads (runworker's default) and is killed mid-call
    holds more runs than it runs: the one in flight and the ones queued for a thread. A
    second worker reaps them all after the lease and runs them; the queued runs had made no
    call, so only the in-flight call is sent again, and every effect happens once."""
    runs = start_runs(deployed, 4)
    in_flight, held = killed_mid_call(
        deployed, ledger, tmp_path, "queue-a", 1, "--concurrency", "1", "--claim-ahead", "3"
    )
    assert set(held.values()) == {"queue-a"} and len(held) == len(runs)  # 1 running, 3 queued
    b = recovered(deployed, ledger, tmp_path, "queue-b", len(runs))
    generations = check_books(deployed, runs, ledger)
    # Each: claimed by a (1), reaped (2), claimed by b (3).
    assert generations == dict.fromkeys(runs, 3)
    assert len(in_flight) == 1 and ledger.repeated_keys() == in_flight
    assert sum(int(n) for n in _values(b.log(), "event=reaped count=")) == len(runs), b.log()


def test_sigterm_lets_the_running_segment_finish_then_exits(
    deployed: Tenant, ledger: Ledger, tmp_path: Path
) -> None:
    """SIGTERM while a segment waits on a slow call: the worker stops claiming, finishes the
    segment (the run completes) and exits 0; it does not claim the run that is still due."""
    first = start_runs(deployed, 1)
    ledger.hold(30)
    with worker(tmp_path, "term", ledger, "--concurrency", "1") as w:
        wait_until(lambda: ledger.held == 1, 30, "the call in flight")
        second, _ = services.start_workflow(deployed, "transfer", json.dumps({"n": 1}))
        w.terminate()
        w.wait_for_log("event=worker_stopping", 10)
        time.sleep(0.5)
        assert w.proc.poll() is None, "the worker exited under a running segment"
        ledger.release()
        assert w.wait(timeout=30) == 0, w.log()
    with tenant_context(deployed.id):
        done = WorkflowInstance.objects.get(id=next(iter(first)))
        waiting = WorkflowInstance.objects.get(id=second.id)
    assert done.status == RunStatus.DONE
    assert json.loads(done.result) == [[0, e.response] for e in ledger.entries.values()]
    assert waiting.status == RunStatus.READY and waiting.generation == 0
    assert [(s.run_id, s.outcome) for s in w.segments()] == [(str(done.id), "completed")]
    assert "processed=1" in w.log()


def _values(log: str, prefix: str) -> list[str]:
    return [line.split(prefix, 1)[1].split()[0] for line in log.splitlines() if prefix in line]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
