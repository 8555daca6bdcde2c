"""Crons that workflows create, list and delete (``schedule_cron`` and friends): the
handler the store calls for them (``workflows/store/crons.py``), registered in
``SchedulesConfig.ready``. Each call runs inside the store's fenced transaction, in the run's
tenant context and a savepoint, so a refusal leaves nothing behind.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from engine.cron import cron_error, timezone_error
from engine.errors import Refused
from engine.policies import Quota, quota_refusal
from engine.status import AbiStatus
from engine.storage import CreateSchedule, DeleteSchedule, RunRef
from schedules.cron import CronError, next_fire_time
from schedules.models import Schedule
from workflows.models import WorkflowDefinition
from workflows.policies import quotas_for


def _uuid_or_none(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(text))
    except ValueError:
        return None


class WorkflowCrons:
    """``workflows.store.crons.CronHandler`` on the Schedule model."""

    def create(self, tenant: uuid.UUID, run: RunRef, request: CreateSchedule, now: datetime) -> str:
        m = request
        problem = cron_error(m.cron) or timezone_error(m.timezone)
        if problem:
            raise Refused(AbiStatus.PERMANENT, problem)
        if not WorkflowDefinition.objects.filter(tenant_id=tenant, name=m.workflow_name).exists():
            raise Refused(AbiStatus.NOT_FOUND, f"no workflow definition named {m.workflow_name!r}")
        schedule_id = uuid.UUID(m.schedule_id)
        if Schedule.objects.filter(tenant_id=tenant, id=schedule_id).exists():
            return m.schedule_id
        refusal = quota_refusal(
            quotas_for(tenant), Quota.SCHEDULES, Schedule.objects.filter(tenant_id=tenant).count()
        )
        if refusal is not None:
            raise Refused(AbiStatus.DENIED, refusal)
        try:
            json.loads(m.input)
        except json.JSONDecodeError:
            raise Refused(AbiStatus.PERMANENT, "the schedule's input is not valid JSON") from None
        try:
            # The scheduler takes it from here: the first instant after the step's time.
            first_run = next_fire_time(m.cron, m.timezone, now)
        except CronError as exc:
            raise Refused(AbiStatus.PERMANENT, exc.message) from None
        Schedule.objects.create(
            id=schedule_id,
            tenant_id=tenant,
            name=f"{m.workflow_name}-{m.schedule_id[:8]}",
            workflow_name=m.workflow_name,
            cron=m.cron,
            timezone=m.timezone,
            input=m.input,
            next_run_at=first_run,
            created_by_run=_uuid_or_none(run.run_id),
            created_at=now,
        )
        return m.schedule_id

    def delete(self, tenant: uuid.UUID, request: DeleteSchedule) -> None:
        deleted, _ = Schedule.objects.filter(
            tenant_id=tenant, id=_uuid_or_none(request.schedule_id)
        ).delete()
        if not deleted:
            raise Refused(AbiStatus.NOT_FOUND, f"no schedule {request.schedule_id}")

    def list(self, tenant: uuid.UUID) -> list[dict[str, Any]]:
        rows = Schedule.objects.filter(tenant_id=tenant).order_by("created_at", "id")
        return [
            {
                "id": str(s.id),
                "name": s.name,
                "workflow_name": s.workflow_name,
                "cron": s.cron,
                "timezone": s.timezone,
                "input": s.input,
                "enabled": s.enabled,
            }
            for s in rows
        ]
