"""Maintenance on Celery beat: the periodic duties (the reaper, the schedule tick) run as the
beat task ``cleat.maintenance`` with the same code as the worker loop runs them, and a
worker leaves them to beat when ``CLEAT_MAINTENANCE_ON_BEAT`` is on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from cleat_project.celery import _maintenance_on_beat, app
from schedules.models import Schedule
from schedules.scheduler import ScheduleTicker
from tests.fixtures.wat import Wat
from workflows import definitions, duties, services, tasks
from workflows.dispatch import Sweep
from workflows.maintenance import Reaper
from workflows.models import RunStatus, Tenant, WorkflowInstance
from workflows.tenancy import tenant_context
from workflows.worker import Worker, WorkerOptions

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_duties() -> Iterator[None]:
    tasks.reset_beat_duties()
    yield
    tasks.reset_beat_duties()


@override_settings(CLEAT_DISPATCH="celery")  # every registered duty applies then
def test_the_beat_task_runs_the_workers_duties_with_the_same_code() -> None:
    started = dict(tasks.beat_duties())
    assert list(started) == list(duties.registered())
    assert isinstance(started["reaper"], Reaper)
    assert isinstance(started["schedules"], ScheduleTicker)
    assert isinstance(started["dispatch_sweep"], Sweep) and started["dispatch_sweep"].on_beat


def test_the_dispatch_sweep_is_no_duty_in_poll_dispatch() -> None:
    assert "dispatch_sweep" not in dict(tasks.beat_duties())
    assert "dispatch_sweep" not in dict(duties.start(duties.WorkerContext("w", None, 1.0)))


@override_settings(CLEAT_SCHEDULER_IN_WORKER=False)
def test_on_beat_the_tick_runs_even_when_it_is_kept_out_of_the_worker_loop() -> None:
    assert "schedules" not in dict(duties.start(duties.WorkerContext("w", None, 1.0)))
    assert "schedules" in dict(tasks.beat_duties())


@override_settings(CLEAT_MAINTENANCE_ON_BEAT=True)
def test_a_worker_leaves_its_duties_to_beat_when_maintenance_is_on_beat() -> None:
    assert Worker(WorkerOptions(worker_id="w-beat"))._duties == []


@override_settings(CLEAT_LEASE_SECONDS=5.0)
def test_the_maintenance_task_reaps_an_expired_lease_and_fires_a_due_schedule(
    tenant: Tenant,
) -> None:
    w = Wat()
    w.run("(call $finish)")
    definitions.deploy_definition(tenant, "noop", w.wasm())
    run, _ = services.start_workflow(tenant, "noop", "null")
    stale = timezone.now() - timedelta(seconds=30)
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=run.id).update(
            status=RunStatus.RUNNING, assigned_to="dead-worker", heartbeat_at=stale
        )
        Schedule.objects.create(
            tenant=tenant,
            name="every-minute",
            workflow_name="noop",
            cron="* * * * *",
            input=json.dumps(None),
            next_run_at=timezone.now() - timedelta(seconds=1),
        )
    report = tasks.run_maintenance.apply().get()  # as a Celery worker runs it, in-process
    assert report["reaper"] == "1"
    with tenant_context(tenant.id):
        reaped = WorkflowInstance.objects.get(id=run.id)
        fired = WorkflowInstance.objects.filter(definition_name="noop").count()
    assert reaped.status == RunStatus.READY and reaped.generation == run.generation + 1
    assert fired == 2, report


def test_beat_sends_the_maintenance_task_only_when_it_is_turned_on() -> None:
    before = dict(app.conf.beat_schedule or {})
    try:
        with override_settings(CLEAT_MAINTENANCE_ON_BEAT=False):
            _maintenance_on_beat(app)
            assert "cleat-maintenance" not in (app.conf.beat_schedule or {})
        with override_settings(CLEAT_MAINTENANCE_ON_BEAT=True, CLEAT_BEAT_INTERVAL_SECONDS=2.0):
            _maintenance_on_beat(app)
            entry = app.conf.beat_schedule["cleat-maintenance"]
        assert entry["task"] == tasks.MAINTENANCE_TASK == "cleat.maintenance"
        assert entry["schedule"] == 2.0 and entry["options"] == {"expires": 10.0}
        assert tasks.MAINTENANCE_TASK in app.tasks
    finally:
        app.conf.beat_schedule = before
