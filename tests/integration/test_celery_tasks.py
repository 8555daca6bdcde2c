"""Celery tasks as services, end to end on real processes: ``runworker`` runs the segments,
``celery -A cleat_project worker`` runs the tasks, on the shared RabbitMQ and Redis and
on a private Redis the test restarts, all on one PostgreSQL (as the RLS-bound role).

The tasks post to the test's ledger (``support.ledger``) with the idempotency key cleat
gave them: its books show each key's effect once however often a task ran, and its
request counts show a task that ran again after its worker was killed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from engine.determinism import idempotency_key
from engine.events import CallEvent, EncodedEvent, decode
from tests.fixtures.wat import Wat
from tests.integration.support.celery_workers import (
    RABBITMQ_URL,
    REDIS_URL,
    ROOT,
    TASKS_MODULE,
    THREADS,
    CeleryWorker,
    PrivateRabbit,
    PrivateRedis,
    broker_reachable,
    unique_queue,
)
from tests.integration.support.ledger import Ledger
from tests.integration.support.processes import WorkerProcess, command_env, wait_until
from tests.integration.test_worker_processes import statuses
from workflows import definitions, services
from workflows.models import (
    RunStatus,
    TaskCall,
    Tenant,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
)
from workflows.tenancy import tenant_context

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

OPERATIONS = ("reserve", "charge", "capture", "ship", "notify")


@pytest.fixture(autouse=True)
def _on_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.fail(
            "these tests run Celery workers and runworker processes on one PostgreSQL: run "
            "them with CLEAT_TEST_DB=postgres"
        )


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    with Ledger().serving() as served:
        yield served


def five_calls() -> bytes:
    """Five Celery-task calls with the run's input; the result is every answer."""
    w = Wat()
    calls = "".join(
        f"\n    (call $rec (call $durable_call {w.s('billing')} {w.s(op)} {w.input()}))"
        for op in OPERATIONS
    )
    w.run(calls + "\n    (call $finish)")
    return w.wasm()


def outcomes() -> bytes:
    """One call per outcome a task can have."""
    w = Wat()
    body = ""
    for service, op, request in (
        ("billing", "charge", '{"n":1}'),
        ("billing", "decline", '{"n":2}'),
        ("billing", "flaky", '{"n":3}'),
        ("billing", "broken", '{"n":4}'),
        ("impatient", "slow", '{"seconds":30}'),
    ):
        body += f"\n    (call $rec (call $durable_call {w.s(service)} {w.s(op)} {w.s(request)}))"
    w.run(body + "\n    (call $finish)")
    return w.wasm()


def environment(ledger: Ledger, broker: str, queue: str, timeout_s: float = 300) -> dict[str, str]:
    target = f"celery:{TASKS_MODULE}?queue={queue}"
    return command_env(
        {"billing": f"{target}&timeout={timeout_s:g}", "impatient": f"{target}&timeout=3"},
        CELERY_BROKER_URL=broker,
        CLEAT_TEST_LEDGER_URL=ledger.url,
        # A run waiting on a task sleeps until the task's outcome wakes it; this recheck
        # only bounds a wake lost with a killed process.
        CLEAT_WAIT_RECHECK_SECONDS="30",
        CELERY_BROKER_TRANSPORT_OPTIONS=json.dumps({"visibility_timeout": 20}),
    )


def runworker(tmp_path: Path, name: str, env: dict[str, str], *args: str) -> WorkerProcess:
    return WorkerProcess(
        tmp_path / f"{name}.log",
        ["--worker-id", name, "--poll-interval", "0.5", "--concurrency", "4", *args],
        env,
    )


def create_runs(tenant: Tenant, name: str, count: int) -> dict[str, int]:
    runs = {}
    for n in range(count):
        instance, _ = services.start_workflow(tenant, name, json.dumps({"n": n}))
        runs[str(instance.id)] = n
    return runs


def require(broker: str) -> None:
    reason = broker_reachable(broker)
    if reason is not None:
        pytest.fail(reason)


def test_each_outcome_of_a_celery_task_maps_to_its_status(
    tenant: Tenant, ledger: Ledger, tmp_path: Path
) -> None:
    """OK with the result, PERMANENT for the SDK's permanent error, RETRIES_EXHAUSTED after
    Celery's own retries, ERROR for another exception, TIMEOUT when no outcome comes in the
    service's time; while a task runs the run waits on it, holding no worker thread."""
    require(RABBITMQ_URL)
    definitions.deploy_definition(tenant, "outcomes", outcomes())
    queue = unique_queue()
    env = environment(ledger, RABBITMQ_URL, queue)
    with (
        CeleryWorker(tmp_path / "celery.log", "outcomes", queue, env) as celery,
        runworker(tmp_path, "outcomes-cleat", env) as worker,
    ):
        celery.wait_ready()
        run, _ = services.start_workflow(tenant, "outcomes", "null")

        def waiting_on_slow() -> bool:
            with tenant_context(tenant.id):
                row = WorkflowInstance.objects.get(id=run.id)
            return row.status == RunStatus.READY and "impatient.slow" in str(row.waiting_on)

        wait_until(waiting_on_slow, 60, "the run waiting on the slow task")
        with tenant_context(tenant.id):
            waiting = WorkflowInstance.objects.get(id=run.id).waiting_on
            call = TaskCall.objects.get(instance_id=run.id, operation="slow")
        assert waiting is not None and waiting["kind"] == "task"
        assert waiting["task_id"] == str(call.id)
        assert waiting["description"].startswith(f"task impatient.slow (task id {call.id})")
        wait_until(lambda: statuses(tenant)[RunStatus.DONE] == 1, 60, "the run done")
        worker.terminate()
        assert worker.wait(timeout=30) == 0, worker.log()
    with tenant_context(tenant.id):
        done = WorkflowInstance.objects.get(id=run.id)
        states = Counter(TaskCall.objects.values_list("state", flat=True))
    answers = json.loads(done.result)
    assert [status for status, _ in answers] == [0, 2, 6, 1, 4], answers
    assert json.loads(answers[0][1])["op"] == "charge"
    assert answers[1][1] == "card declined for {'n': 2}"
    assert answers[2][1] == "RuntimeError: still down"
    assert answers[3][1] == "ValueError: the ledger is closed"
    assert "reported no outcome within 3000 ms" in answers[4][1]
    assert states == {"settled": 5}


def check_books(tenant: Tenant, runs: dict[str, int], ledger: Ledger) -> None:
    """Every run done with the ledger's answers, its history the five calls (none pending),
    each expected key's effect in the ledger exactly once and no other key there."""
    with tenant_context(tenant.id):
        rows = {
            str(r["id"]): r
            for r in WorkflowInstance.objects.values("id", "workflow_id", "status", "result")
        }
        history: dict[str, list[CallEvent]] = {run: [] for run in rows}
        for run, *stored in WorkflowEvent.objects.order_by("instance_id", "step").values_list(
            "instance_id", "step", "type_code", "timestamp_ms", "payload", "checksum"
        ):
            decoded = decode(EncodedEvent(*stored))
            assert isinstance(decoded, CallEvent)
            history[str(run)].append(decoded)
        calls = Counter(TaskCall.objects.values_list("state", flat=True))
    assert set(rows) == set(runs)
    stuck = {run: r["status"] for run, r in rows.items() if r["status"] != RunStatus.DONE}
    assert not stuck, f"{len(stuck)} run(s) not done: {list(stuck.items())[:5]}"
    expected = set()
    for run, n in runs.items():
        events = history[run]
        assert [e.step for e in events] == list(range(len(OPERATIONS))), events
        for step, (event, op) in enumerate(zip(events, OPERATIONS, strict=True)):
            key = idempotency_key(rows[run]["workflow_id"], run, step)
            expected.add(key)
            # The call's own outcome first: a call that timed out or failed never reached
            # the ledger, and a bare KeyError below would hide what the run was told.
            assert not event.pending and event.status == 0, (
                f"run {run} step {step} ({op}): status {event.status}, {event.error!r}"
            )
            entry = ledger.entries.get(key)
            assert entry is not None, (
                f"run {run} step {step} ({op}) recorded OK {event.response!r}, "
                "but the ledger never received its key"
            )
            assert (entry.operation, entry.request) == (op, {"n": n})
            assert json.loads(event.response) == json.loads(entry.response)
    assert set(ledger.entries) == expected, "the ledger holds effects no run asked for"
    assert sorted(e.seq for e in ledger.entries.values()) == list(range(1, len(expected) + 1))
    assert not ledger.mismatches
    assert calls == {"settled": len(expected)}


def _deploy_five(tenant: Tenant) -> None:
    definitions.deploy_definition(tenant, "five", five_calls())
    with tenant_context(tenant.id):
        assert WorkflowDefinition.objects.filter(name="five").exists()


def race(
    tenant: Tenant,
    ledger: Ledger,
    tmp_path: Path,
    broker: str,
    count: int,
    *,
    kill_at: int | None = None,
    restart_broker: PrivateRedis | PrivateRabbit | None = None,
) -> dict[str, object]:
    """``count`` runs of five Celery-task calls through two runworker processes and three
    Celery workers; one Celery worker killed with SIGKILL when the ledger holds ``kill_at``
    effects, or the private broker restarted then. Returns what happened, for the report."""
    _deploy_five(tenant)
    queue = unique_queue()
    env = environment(ledger, broker, queue)
    started = time.monotonic()
    restarted = 0
    celery = [CeleryWorker(tmp_path / f"celery-{i}.log", f"c{i}", queue, env) for i in range(3)]
    cleat = [runworker(tmp_path, f"cleat-{i}", env) for i in range(2)]
    try:
        for worker in celery:
            worker.wait_ready()
        runs = create_runs(tenant, "five", count)
        total = count * len(OPERATIONS)
        trigger = kill_at if kill_at is not None else total // 3
        wait_until(lambda: len(ledger.entries) >= trigger, 600, f"{trigger} effects", 0.05)
        in_flight = sum(1 for _ in ledger.entries)
        if restart_broker is not None:
            restart_broker.stop()
            time.sleep(3)
            restart_broker.start()
            # Celery 5.7's worker on the Redis transport may stop on the lost connection
            # ("Unrecoverable error: AttributeError ... 'hostname'") instead of
            # reconnecting; in production its supervisor starts it again, as here.
            time.sleep(5)
            for i, worker in enumerate(celery):
                if worker.proc.poll() is not None:
                    worker.close()
                    celery[i] = CeleryWorker(
                        tmp_path / f"celery-{i}-again.log", f"c{i}b", queue, env
                    )
                    restarted += 1
        else:
            # Held in the ledger, each Celery thread's request is counted and unanswered: with
            # more held than two workers have threads, the one killed surely has effects
            # applied and not acknowledged, which are delivered again after the kill.
            # Within the tasks' HTTP timeout (30 s), so no held task gives up.
            ledger.hold(25)
            wait_until(lambda: ledger.held > 2 * THREADS, 20, "requests held on every worker", 0.05)
            celery[0].kill()
            ledger.release()
        wait_until(lambda: statuses(tenant)[RunStatus.DONE] == count, 900, "every run done", 0.5)
        elapsed = time.monotonic() - started
        for worker in cleat:
            worker.terminate()
        for worker in cleat:
            assert worker.wait(timeout=60) == 0, worker.log()[-3000:]
        check_books(tenant, runs, ledger)
        logs = "".join(w.log() for w in cleat)
        assert "Traceback" not in logs, logs[-5000:]
        return {
            "elapsed_s": round(elapsed, 1),
            "effects_at_fault": in_flight,
            "repeated_keys": len(ledger.repeated_keys()),
            "task_runs": sum(ledger.requests.values()),
            "celery_workers_restarted": restarted,
        }
    finally:
        for worker in cleat:
            worker.close()
        for worker in celery:
            worker.close()


def test_500_runs_of_five_celery_tasks_with_a_celery_worker_killed(
    tenant: Tenant, ledger: Ledger, tmp_path: Path
) -> None:
    """500 runs x 5 task calls over three Celery workers on RabbitMQ, one SIGKILLed a third
    of the way: every run done, each key's effect applied exactly once (the tasks that were
    running on the killed worker were delivered again and ran again with the same key), no
    run stuck."""
    require(RABBITMQ_URL)
    count = int(os.environ.get("CLEAT_TEST_CELERY_RUNS", "500"))
    figures = race(tenant, ledger, tmp_path, RABBITMQ_URL, count)
    print(
        f"\ncelery x rabbitmq, {count} runs x 5 tasks, a worker killed: {figures}", file=sys.stderr
    )
    assert figures["repeated_keys"], "no task ran again: the kill found nothing in flight"


def test_runs_of_celery_tasks_on_rabbitmq_survive_a_broker_restart(
    tenant: Tenant, ledger: Ledger, tmp_path: Path
) -> None:
    """The same with the broker (a RabbitMQ node of the test's own) stopped and started again
    mid-run: its durable queues keep what was published and not yet acknowledged, tasks
    published while it was away are sent again by their runs, workers reconnect, every run
    done and every effect applied once."""
    require(RABBITMQ_URL)  # the shared node answers: the AMQP transport itself works here
    broker = PrivateRabbit()
    try:
        broker.start()
        count = int(os.environ.get("CLEAT_TEST_CELERY_RESTART_RUNS", "50"))
        figures = race(tenant, ledger, tmp_path, broker.url, count, restart_broker=broker)
    finally:
        broker.destroy()
    print(
        f"\ncelery x private rabbitmq, {count} runs, broker restarted: {figures}", file=sys.stderr
    )


def test_publishes_to_rabbitmq_wait_for_the_brokers_confirm() -> None:
    """cleat's app publishes with RabbitMQ's publisher confirms on, also when the deployment
    sets transport options of its own (they are merged over the defaults): a message lost with
    a stopping broker fails its publish, and the run publishes it again, instead of counting as
    sent (the broker-restart test above)."""
    require(RABBITMQ_URL)
    queue = unique_queue()
    script = f"""
import json
import django
django.setup()
from kombu import Queue
from cleat_project.celery import app
with app.connection_for_write() as conn:
    with conn.Producer() as producer:
        producer.publish({{"n": 1}}, routing_key={queue!r},
                         declare=[Queue({queue!r}, auto_delete=True)])
    print(json.dumps({{
        "options": app.conf.broker_transport_options,
        "confirm_publish": conn.connection.confirm_publish,
        "confirm_selected": conn.default_channel._confirm_selected,
    }}))
    Queue({queue!r}).bind(conn.default_channel).delete()
"""
    env = command_env(
        {},
        CELERY_BROKER_URL=RABBITMQ_URL,
        CELERY_BROKER_TRANSPORT_OPTIONS=json.dumps({"visibility_timeout": 20}),
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["options"] == {"visibility_timeout": 20, "confirm_publish": True}
    assert seen["confirm_publish"] is True
    assert seen["confirm_selected"] is True


@pytest.mark.skip(
    reason="intermittent: once in CI (2026-12-01) a run finished with a call whose key the "
    "ledger never saw; not reproduced in 5 runs since. Likely cause (docs/celery.md): the Redis "
    "transport pops a message (BRPOP) before it writes its unacknowledged copy, so a broker "
    "killed in between loses the task; it never runs and the call ends TIMEOUT at the service's "
    "timeout, which this test's every-effect-once books cannot accept. To run it, remove this mark."
)
def test_runs_of_celery_tasks_on_redis_survive_a_broker_restart(
    tenant: Tenant, ledger: Ledger, tmp_path: Path
) -> None:
    """The same on Redis, with the broker (the test's own redis-server) stopped and started
    again mid-run: tasks published while it was away are sent again by their runs, workers
    reconnect, every run done and every effect once."""
    require(REDIS_URL)  # the shared one answers: the Redis transport itself works here
    broker = PrivateRedis(tmp_path)
    broker.start()
    try:
        count = int(os.environ.get("CLEAT_TEST_CELERY_RESTART_RUNS", "50"))
        figures = race(tenant, ledger, tmp_path, broker.url, count, restart_broker=broker)
    finally:
        broker.stop()
    print(f"\ncelery x private redis, {count} runs, broker restarted: {figures}", file=sys.stderr)


def test_celery_beat_runs_the_reaper_when_the_maintenance_is_on_beat(
    tenant: Tenant, tmp_path: Path
) -> None:
    """``celery -A cleat_project beat`` sends ``cleat.maintenance``; a Celery worker runs the
    reaper with it: a run whose worker stopped heartbeating is returned to ready."""
    require(RABBITMQ_URL)
    w = Wat()
    w.run("(call $finish)")
    definitions.deploy_definition(tenant, "noop", w.wasm())
    run, _ = services.start_workflow(tenant, "noop", "null")
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=run.id).update(
            status=RunStatus.RUNNING,
            assigned_to="a-dead-worker",
            heartbeat_at=run.created_at,
            generation=7,
        )
    queue = unique_queue()
    env = command_env(
        {},
        CELERY_BROKER_URL=RABBITMQ_URL,
        CELERY_TASK_DEFAULT_QUEUE=queue,
        CLEAT_MAINTENANCE_ON_BEAT="1",
        CLEAT_LEASE_SECONDS="2",
    )
    beat_log = open(tmp_path / "beat.log", "wb")  # noqa: SIM115 - closed below
    beat = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "cleat_project",
            "beat",
            "-s",
            str(tmp_path / "beat-schedule"),
            "-l",
            "INFO",
        ],
        env=env,
        cwd=ROOT,
        stdout=beat_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        with CeleryWorker(tmp_path / "celery.log", "beat-worker", queue, env) as worker:

            def reaped() -> bool:
                with tenant_context(tenant.id):
                    row = WorkflowInstance.objects.get(id=run.id)
                return row.status == RunStatus.READY and row.generation == 8

            try:
                wait_until(reaped, 90, "the reaper, run by the beat task, to return the run")
            except AssertionError:
                raise AssertionError(
                    worker.log()[-3000:] + (tmp_path / "beat.log").read_text()[-2000:]
                ) from None
            assert "cleat.maintenance" in worker.log()
    finally:
        beat.terminate()
        beat.wait(timeout=30)
        beat_log.close()
