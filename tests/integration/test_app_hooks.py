"""The hooks through which the apps above workflows plug in (the schedules app does so in
``SchedulesConfig.ready``): periodic duties of the worker loop, the handler of crons that
workflows create, and each app's own tenant-scoped tables."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import datetime

import pytest
from django.test import override_settings
from django.utils import timezone

from engine.errors import Refused
from engine.status import AbiStatus
from engine.storage import CreateSchedule, DeleteSchedule, RunRef
from schedules.rls import SCHEDULE_TABLES
from schedules.scheduler import ScheduleTicker, worker_duty
from schedules.workflow_crons import WorkflowCrons
from workflows import duties, rls
from workflows.models import Tenant
from workflows.store import crons
from workflows.worker import Worker, WorkerOptions

CONTEXT = duties.WorkerContext("w", None, 1.0)


class CountingDuty:
    def __init__(self) -> None:
        self.ran = 0

    def run_due(self, now: datetime) -> None:
        self.ran += 1

    def seconds_until_due(self, now: datetime) -> float:
        return 0.0


class BrokenDuty:
    def run_due(self, now: datetime) -> None:
        raise RuntimeError("the duty broke")

    def seconds_until_due(self, now: datetime) -> float:
        raise RuntimeError("the duty broke")


@pytest.fixture
def extra_duties() -> Iterator[CountingDuty]:
    counting = CountingDuty()
    duties.register("test-broken", lambda _: BrokenDuty())
    duties.register("test-counting", lambda _: counting)
    try:
        yield counting
    finally:
        duties.unregister("test-broken")
        duties.unregister("test-counting")


def test_the_schedules_app_registers_its_duty_cron_handler_and_tables() -> None:
    assert "schedules" in duties.registered()
    assert isinstance(crons.handler(), WorkflowCrons)
    assert set(SCHEDULE_TABLES) <= set(rls.tenant_tables())
    assert not set(SCHEDULE_TABLES) & set(rls.WORKFLOW_TABLES)


def test_the_scheduler_duty_follows_its_setting() -> None:
    assert isinstance(worker_duty(CONTEXT), ScheduleTicker)
    with override_settings(CLEAT_SCHEDULER_IN_WORKER=False):
        assert worker_duty(CONTEXT) is None
        names = [name for name, _ in duties.start(CONTEXT)]
        assert "schedules" not in names


@pytest.mark.django_db(transaction=True)
def test_a_failing_duty_is_logged_and_the_loop_and_other_duties_go_on(
    tenant: Tenant, extra_duties: CountingDuty, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="cleat.worker")
    processed = Worker(WorkerOptions(worker_id="duties", concurrency=1, burst=True)).run()
    assert processed == 0
    assert extra_duties.ran >= 1
    assert "event=duty_error duty=test-broken" in caplog.text


def test_without_a_cron_handler_workflow_crons_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crons, "_handler", None)
    tenant = uuid.uuid4()
    run = RunRef(str(tenant), "wf", str(uuid.uuid4()), "w", 1)
    request = CreateSchedule(str(uuid.uuid4()), "wf", "* * * * *", "UTC", "null")
    with pytest.raises(Refused) as refused:
        crons.create(tenant, run, request, timezone.now())
    assert refused.value.status == AbiStatus.PERMANENT
    with pytest.raises(Refused):
        crons.delete(tenant, DeleteSchedule(request.schedule_id))
    assert crons.list_schedules(tenant) == []
