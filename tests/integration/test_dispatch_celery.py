"""Dispatch on the broker end to end, on RabbitMQ and on Redis: runs started by this process
are published to ``cleat.<task queue>``; Celery workers (``celery -A cleat_project worker
-Q cleat.<task queue>``) claim and run every segment (no ``runworker`` runs); Celery beat
sends the maintenance task (the reaper and the dispatch sweep). One Celery worker is killed
with SIGKILL mid-way and one run's message is dropped on purpose (purged from the queue):
every run ends done, the dropped one through the sweep.

``CLEAT_TEST_DISPATCH_RUNS`` sets the number of runs (default 200; each run is a parent
with a timer and a child: four segments).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from kombu import Connection

from tests.fixtures.wat import Wat
from tests.integration.support.celery_workers import (
    RABBITMQ_URL,
    REDIS_URL,
    ROOT,
    CeleryBeat,
    CeleryWorker,
    broker_reachable,
)
from tests.integration.support.dispatch import BROKER, BROKER_PATH
from tests.integration.support.processes import command_env, wait_until
from tests.integration.test_worker_processes import statuses
from workflows import definitions, services
from workflows.models import RunStatus, Tenant, WorkflowInstance
from workflows.tenancy import tenant_context

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

BROKERS = {"rabbitmq": RABBITMQ_URL, "redis": REDIS_URL}
SECRET = "hunter2-never-on-the-broker"


@pytest.fixture(autouse=True)
def _on_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.fail("these tests run Celery workers on one PostgreSQL: CLEAT_TEST_DB=postgres")


@pytest.fixture
def publisher() -> Iterator[None]:
    with override_settings(CLEAT_DISPATCH="celery", CLEAT_CELERY_APP=BROKER_PATH):
        yield
    BROKER.close()


def require(broker: str) -> None:
    reason = broker_reachable(broker)
    if reason is not None:
        pytest.fail(reason)


def unique_task_queue() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def parent() -> bytes:
    """A 200 ms timer, then a `leaf` child with the run's input, awaited."""
    w = Wat()
    w.run(
        f"""
    (call $recn (call $durable_sleep (i64.const 200)))
    (local.set $c (call $child_workflow {w.s("leaf")} {w.input()}))
    (call $rec (call $await_child {w.payload("c")}))
    (call $finish)""",
        locals="$c i64",
    )
    return w.wasm()


def leaf() -> bytes:
    w = Wat()
    w.run(f"(call $rec (call $json_parse {w.input()})) (call $finish)")
    return w.wasm()


def environment(broker: str, maintenance_queue: str) -> dict[str, str]:
    return command_env(
        CELERY_BROKER_URL=broker,
        CLEAT_DISPATCH="celery",
        CLEAT_MAINTENANCE_ON_BEAT="1",
        CLEAT_MAINTENANCE_QUEUE=maintenance_queue,
        CLEAT_BEAT_INTERVAL_SECONDS="0.5",
        CLEAT_DISPATCH_SWEEP_SECONDS="0.5",
        CLEAT_DISPATCH_REDELIVER_SECONDS="3",
        CLEAT_LEASE_SECONDS="10",
        # A parent whose child finished on the killed worker just before its wake-up waits
        # for this recheck (as with a killed runworker).
        CLEAT_WAIT_RECHECK_SECONDS="10",
        CELERY_BROKER_TRANSPORT_OPTIONS=json.dumps({"visibility_timeout": 20}),
    )


def purge(broker: str, queue: str) -> int:
    with Connection(broker) as conn:
        return int(conn.default_channel.queue_purge(queue) or 0)


def raw_message(broker: str, queue: str) -> Any:
    with Connection(broker) as conn:
        channel = conn.default_channel
        deadline = time.monotonic() + 10
        while True:
            message = channel.basic_get(queue=queue, no_ack=True)
            if message is not None:
                return message
            if time.monotonic() > deadline:
                raise AssertionError(f"no message in {queue}")
            time.sleep(0.1)


# The Celery worker logs each line twice (Django's handler, Celery's redirect): one of them.
_SEGMENT = re.compile(r"INFO cleat\.worker event=segment run=(\S+) outcome=(\S+) ")


@pytest.mark.parametrize("broker_name", sorted(BROKERS))
def test_the_ready_message_names_its_task_and_carries_ids_only(
    tenant: Tenant, publisher: None, broker_name: str
) -> None:
    """What Flower and the broker show: the task ``cleat.run_segment`` with the tenant and
    run ids and the task queue; no input, no payload, in the body or the headers."""
    broker = BROKERS[broker_name]
    require(broker)
    BROKER.use(broker)
    definitions.deploy_definition(tenant, "leaf", leaf())
    task_queue = unique_task_queue()
    run, _ = services.start_workflow(
        tenant, "leaf", json.dumps({"password": SECRET, "note": SECRET}), task_queue=task_queue
    )
    message = raw_message(broker, f"cleat.{task_queue}")
    body = message.body if isinstance(message.body, str) else bytes(message.body).decode()
    headers = dict(message.headers or {})
    assert headers["task"] == "cleat.run_segment"
    args, kwargs, _embed = json.loads(body)
    assert args == [str(tenant.id), str(run.id)] and kwargs == {"task_queue": task_queue}
    assert str(run.id) in headers["argsrepr"]
    assert SECRET not in body and SECRET not in repr(headers)
    assert SECRET not in repr(message.properties)


def test_an_unknown_dispatch_mode_stops_a_celery_worker_with_its_reason() -> None:
    env = command_env(CELERY_BROKER_URL=RABBITMQ_URL, CLEAT_DISPATCH="kafka")
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "cleat_project", "worker", "-P", "solo"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "CLEAT_DISPATCH='kafka' is not a dispatch mode" in output, output
    assert "Traceback" not in output, output


@pytest.mark.parametrize("broker_name", sorted(BROKERS))
def test_runs_through_celery_workers_one_killed_one_message_dropped(
    tenant: Tenant, publisher: None, broker_name: str, tmp_path: Path
) -> None:
    broker = BROKERS[broker_name]
    require(broker)
    BROKER.use(broker)
    count = int(os.environ.get("CLEAT_TEST_DISPATCH_RUNS", "200"))
    definitions.deploy_definition(tenant, "leaf", leaf())
    definitions.deploy_definition(tenant, "parent", parent())
    task_queue = unique_task_queue()
    queue = f"cleat.{task_queue}"
    maintenance = f"{queue}.maintenance"
    env = environment(broker, maintenance)

    # Published before any worker consumes, then dropped: only the sweep can find it.
    dropped, _ = services.start_workflow(tenant, "parent", '{"n": -1}', task_queue=task_queue)
    assert purge(broker, queue) == 1
    runs = {
        str(
            services.start_workflow(tenant, "parent", json.dumps({"n": n}), task_queue=task_queue)[
                0
            ].id
        ): n
        for n in range(count)
    }
    runs[str(dropped.id)] = -1

    started = time.monotonic()
    workers = [
        CeleryWorker(tmp_path / f"celery-{i}.log", f"d{i}", f"{queue},{maintenance}", env)
        for i in range(3)
    ]
    beat = CeleryBeat(tmp_path, env)
    try:
        for worker in workers:
            worker.wait_ready()

        def children_done() -> int:
            with tenant_context(tenant.id):
                return WorkflowInstance.objects.filter(
                    parent__isnull=False, status=RunStatus.DONE
                ).count()

        def mid_way() -> bool:  # the victim has been working, a third of the work is done
            return len(_SEGMENT.findall(workers[0].log())) >= 3 and children_done() >= count // 3

        wait_until(mid_way, 60 + count, "a third of the children, some by the first worker")
        workers[0].kill()
        killed_segments = len(_SEGMENT.findall(workers[0].log()))

        def parents_done() -> bool:
            with tenant_context(tenant.id):
                return WorkflowInstance.objects.filter(
                    parent__isnull=True, status=RunStatus.DONE
                ).count() == len(runs)

        wait_until(parents_done, 90 + count, f"{len(runs)} runs done", interval=0.5)
        elapsed = time.monotonic() - started
    finally:
        beat.close()
        for worker in workers:
            worker.close()
    logs = [worker.log() for worker in workers]
    segments = [m for log in logs for m in _SEGMENT.findall(log)]
    with tenant_context(tenant.id):
        rows = list(WorkflowInstance.objects.filter(parent__isnull=True).values("id", "result"))
        children = dict(
            WorkflowInstance.objects.filter(parent__isnull=False).values_list("parent_id", "input")
        )
    assert statuses(tenant) == {RunStatus.DONE: 2 * len(runs)}, statuses(tenant)
    for found in rows:
        n = runs[str(found["id"])]
        answers = json.loads(found["result"])
        assert json.loads(children[found["id"]]) == {"n": n}
        child_answers = [[status, json.loads(text)] for status, text in json.loads(answers[1][1])]
        assert answers[0] == 0 and answers[1][0] == 0 and child_answers == [[0, {"n": n}]]
    assert killed_segments > 0, "the killed worker ran nothing before it was killed"
    assert "event=dispatch_sweep" in "".join(logs)
    dropped_segments = [s for s in segments if s[0] == str(dropped.id)]
    # Its message purged, nothing but the sweep could publish it again (the logs are per
    # worker, not in time order; its last segment may have been the killed worker's).
    assert dropped_segments, "the dropped run never ran"
    duplicates = sum(log.count("cleat.dispatch event=dispatch_nothing_to_claim") for log in logs)
    print(
        f"\n{broker_name}: {len(runs)} runs ({2 * len(runs)} instances, {len(segments)} "
        f"segments) in {elapsed:.1f}s over 3 Celery workers, one killed after "
        f"{killed_segments} segments; {duplicates} message(s) claimed nothing; "
        f"load {os.getloadavg()[0]:.2f}"
    )
