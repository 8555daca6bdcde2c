"""The worker survives its database connections being killed (``pg_terminate_backend`` from a
superuser's connection, as an operator, a failover or a pooler would): the runs in flight
are released on a new connection and finish promptly -- not when their lease expires -- and
the lost connection does not count as an attempt of theirs (attempts are the guest's
failures: three blips used to dead-letter a run).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from engine.services import Services
from tests.fixtures import FakeService
from tests.fixtures.wat import Wat
from workflows import definitions, services
from workflows.executor import execute_claim, set_services
from workflows.models import RunStatus, Tenant, WorkflowInstance
from workflows.rls import app_role
from workflows.store.lifecycle import claim_ready_instances
from workflows.store.storage import DjangoStorage
from workflows.tenancy import tenant_context
from workflows.worker import Worker, WorkerOptions

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_S = 60.0
RUNS = 40
KILLS = 6


def three_calls() -> bytes:
    """Three durable calls (each appended as it happens, so the run writes between them)."""
    w = Wat()
    calls = "\n".join(
        f"(call $rec (call $durable_call {w.s('svc')} {w.s('slow')} {w.input()}))" for _ in range(3)
    )
    w.run(f"{calls}\n(call $finish)")
    return w.wasm()


def superuser_connection() -> psycopg.Connection[Any]:
    """A second connection to the test database as the server's superuser."""
    db = connection.settings_dict
    return psycopg.connect(
        host=db["HOST"] or "127.0.0.1",
        port=int(db["PORT"] or 5432),
        dbname=db["NAME"],
        user="postgres",
        autocommit=True,
    )


def terminate_worker_backends(admin: psycopg.Connection[Any], spare: int) -> int:
    """Kill every application-role backend of the test database but the test's own."""
    rows = admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND usename = %s AND pid <> %s",
        [app_role(), spare],
    ).fetchall()
    return sum(1 for (killed,) in rows if killed)


def statuses(tenant: Tenant, runs: list[str]) -> dict[str, tuple[str, int]]:
    with tenant_context(tenant.id):
        return {
            str(i): (s, a)
            for i, s, a in WorkflowInstance.objects.filter(id__in=runs).values_list(
                "id", "status", "attempt"
            )
        }


@pytest.mark.postgres_only
def test_killed_connections_release_runs_at_once_and_cost_no_attempt(tenant: Tenant) -> None:
    def slow(request: Any) -> Any:
        time.sleep(0.05)
        return {"ok": request}

    set_services(Services.from_settings({"svc": FakeService({"slow": slow})}))
    definitions.deploy_definition(tenant, "thrice", three_calls())
    runs = [
        str(services.start_workflow(tenant, "thrice", json.dumps({"n": n}))[0].id)
        for n in range(RUNS)
    ]
    connection.ensure_connection()
    own_pid = connection.connection.info.backend_pid
    worker = Worker(
        WorkerOptions(
            worker_id="killed-conn",
            concurrency=4,
            poll_interval_s=0.2,
            lease_s=LEASE_S,
            burst=False,
        )
    )
    crashed: list[BaseException] = []

    def run_worker() -> None:
        try:
            worker.run()
        except BaseException as exc:
            crashed.append(exc)

    thread = threading.Thread(target=run_worker, name="killed-conn-worker")
    killed = 0
    try:
        with superuser_connection() as admin:
            thread.start()
            # Kill while runs are in flight: wait for the first to start, then every 0.3 s.
            began = time.monotonic()
            while not any(s == RunStatus.RUNNING for s, _ in statuses(tenant, runs).values()):
                assert time.monotonic() - began < 30, "the worker never claimed a run"
                time.sleep(0.02)
            for _ in range(KILLS):
                killed += terminate_worker_backends(admin, own_pid)
                time.sleep(0.3)
        last_kill = time.monotonic()
        # Everything done well before any lease could expire (the reaper never helps here).
        bound = LEASE_S / 4
        while True:
            found = statuses(tenant, runs)
            if all(s == RunStatus.DONE for s, _ in found.values()):
                break
            if time.monotonic() - last_kill > bound:
                stuck = {r: v for r, v in found.items() if v[0] != RunStatus.DONE}
                raise AssertionError(
                    f"{len(stuck)} run(s) not done {bound:.0f}s after the last kill: {stuck}"
                )
            time.sleep(0.1)
        recovered_s = time.monotonic() - last_kill
        assert thread.is_alive() and not crashed, f"the worker loop ended: {crashed!r}"
    finally:
        worker.stop()
        thread.join(timeout=60)
        set_services(None)
    assert killed >= KILLS, f"only {killed} backend(s) terminated: the kills missed the worker"
    spent = {r: a for r, (_, a) in statuses(tenant, runs).items() if a != 1}
    assert spent == {}, f"a lost connection counted as the runs' attempts: {spent}"
    print(f"killed {killed} backends; every run done {recovered_s:.2f}s after the last kill")


def test_a_lost_connection_inside_a_segment_releases_the_run_without_an_attempt(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every database: a write of the segment fails as a dropped connection does. The run is
    released (due again shortly), not failed as `internal` with its attempt counted; the
    next segment completes it."""
    service = FakeService({"slow": {"ok": True}})
    set_services(Services.from_settings({"svc": service}))
    real_append = DjangoStorage.append_events
    failures = [OperationalError("server closed the connection unexpectedly")]

    def dropped(self: DjangoStorage, *args: Any, **kw: Any) -> Any:
        if failures:
            raise failures.pop()
        return real_append(self, *args, **kw)

    monkeypatch.setattr(DjangoStorage, "append_events", dropped)
    try:
        definitions.deploy_definition(tenant, "thrice", three_calls())
        run, _ = services.start_workflow(tenant, "thrice", json.dumps({"n": 1}))
        [claim] = claim_ready_instances("blip", ["default"], 1, timezone.now())
        report = execute_claim(claim, "blip")
        assert (report.outcome, report.status) == ("released", RunStatus.READY), report
        with tenant_context(tenant.id):
            released = WorkflowInstance.objects.get(id=run.id)
        assert (released.status, released.attempt, released.error_code) == (
            RunStatus.READY,
            1,
            None,
        )
        assert released.next_wake_at is not None
        later = released.next_wake_at + timedelta(milliseconds=1)
        [again] = claim_ready_instances("blip", ["default"], 1, later)
        assert execute_claim(again, "blip").outcome == "completed"
    finally:
        set_services(None)
    with tenant_context(tenant.id):
        done = WorkflowInstance.objects.get(id=run.id)
    assert (done.status, done.attempt) == (RunStatus.DONE, 1)
