"""Wake-ups are not lost (both found by the fault soak, ``bench/soak.py``):

* one that arrives while the woken run's finalize is in flight -- the child completes, and
  its wake of the parent runs, between the parent's finalize looking for arrived wake-ups
  and its commit -- waits for the finalize and then makes the parent due, not skip it as
  ``running``;
* one whose connection breaks just after the satisfying commit is tried again on a new one.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from tests.fixtures.wat import Wat
from tests.integration.support.processes import wait_until
from workflows import definitions, services
from workflows.models import RunStatus, Tenant, WorkflowInstance
from workflows.store import wake
from workflows.tenancy import tenant_context

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_on_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return bool(row and row[0] == "Lock")


@pytest.mark.postgres_only
def test_a_wake_during_the_finalize_waits_for_it_and_wakes_the_run(tenant: Tenant) -> None:
    w = Wat()
    w.run("(call $finish)")
    definitions.deploy_definition(tenant, "idle", w.wasm())
    run, _ = services.start_workflow(tenant, "idle")
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=run.id).update(
            status=RunStatus.RUNNING, assigned_to="w", next_wake_at=None
        )
    later = timezone.now() + timedelta(minutes=5)
    locked, commit = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def finalize() -> None:  # as finalize_segment: lock, decide `ready` (re-check later), commit
        try:
            with tenant_context(tenant.id):
                row = WorkflowInstance.objects.select_for_update().get(id=run.id)
                row.status, row.next_wake_at, row.assigned_to = RunStatus.READY, later, None
                row.save()
                locked.set()
                commit.wait(30)
        finally:
            connection.close()

    def waker() -> None:
        try:
            results["pid"] = connection.cursor().connection.info.backend_pid
            results["woken"] = wake.wake_now(tenant.id, run.id)
        finally:
            connection.close()

    finalizer = threading.Thread(target=finalize)
    finalizer.start()
    assert locked.wait(30)
    waking = threading.Thread(target=waker)
    waking.start()
    wait_until(lambda: "pid" in results and waiting_on_lock(results["pid"]), 30, "the wake waits")
    commit.set()
    finalizer.join(30)
    waking.join(30)
    assert results.get("woken") is True, "the wake skipped a run whose finalize was in flight"
    with tenant_context(tenant.id):
        row = WorkflowInstance.objects.get(id=run.id)
    assert row.status == RunStatus.READY and row.next_wake_at < later


def test_a_wake_whose_connection_broke_is_tried_again(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError, transaction

    w = Wat()
    w.run("(call $finish)")
    definitions.deploy_definition(tenant, "idle", w.wasm())
    run, _ = services.start_workflow(tenant, "idle")
    later = timezone.now() + timedelta(minutes=5)
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=run.id).update(next_wake_at=later)
    real = wake.wake_now
    failures = [OperationalError("server closed the connection unexpectedly")] * 2

    def flaky(*args: Any) -> bool:
        if failures:
            raise failures.pop()
        return real(*args)

    monkeypatch.setattr(wake, "wake_now", flaky)
    monkeypatch.setattr(wake, "WAKE_RETRY_S", (0.0, 0.0, 0.0))
    with transaction.atomic():
        wake.after_commit(tenant.id, run.id)
    assert not failures
    with tenant_context(tenant.id):
        row = WorkflowInstance.objects.get(id=run.id)
    assert row.next_wake_at < later, "the wake was given up after a broken connection"
