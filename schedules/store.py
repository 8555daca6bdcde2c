"""The schedules' database operations: the cross-tenant due read, the next due instant, the
compare-and-swap that gives one firing to one scheduler, and the "is the previous run still
going" question the overlap policies ask.

On PostgreSQL the two cross-tenant reads are ``SECURITY DEFINER`` functions owned by
``cleat_dispatcher`` and executable by the application role only (``workflows/rls.py``
explains why); the rows they return carry ``tenant_id`` and the caller re-scopes to it
before touching anything else. Elsewhere (SQLite, MariaDB, SQL Server) the same reads are
ORM queries: there is no RLS to step around. The SQL is in ``schedules/sql/``, one module per
dialect, in the shape of ``workflows/store/sql/``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Exists, F, OuterRef, Q

from schedules.models import Schedule
from schedules.sql import queries
from workflows.models import ACTIVE_STATUSES, RunStatus, WorkflowInstance

# Statuses in which a run (or its continue-as-new successor) still counts as "going".
_ACTIVE = sorted(str(s) for s in ACTIVE_STATUSES)
assert _ACTIVE == ["paused", "ready", "running"], (
    "keep DUE_SCHEDULES_SQL's list (schedules/sql/postgresql.py) in step"
)


@dataclass(frozen=True)
class DueSchedule:
    id: uuid.UUID
    tenant_id: uuid.UUID
    next_run_at: datetime | None


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _previous_run_active() -> Exists:
    """For a schedule row (OuterRef): does a run of its last run's workflow id still go?"""
    last_workflow = WorkflowInstance.objects.filter(id=OuterRef(OuterRef("last_run_id"))).values(
        "workflow_id"
    )
    return Exists(
        WorkflowInstance.objects.filter(
            tenant_id=OuterRef("tenant_id"),
            workflow_id__in=last_workflow,
            status__in=_ACTIVE,
        )
    )


def due_schedules(now: datetime, limit: int, tenant: uuid.UUID | None = None) -> list[DueSchedule]:
    """Every tenant's schedules needing the scheduler at ``now`` (see ``DUE_SCHEDULES_SQL``
    in schedules/sql/postgresql.py)."""
    sql = queries(connection)
    if "due_schedules" in sql:
        with connection.cursor() as cursor:
            cursor.execute(sql["due_schedules"], [now, limit, tenant])
            return [DueSchedule(_uuid(i), _uuid(t), n) for i, t, n in cursor.fetchall()]
    query = Schedule.objects.filter(enabled=True, tenant__is_active=True).filter(
        Q(next_run_at__isnull=True)
        | Q(next_run_at__lte=now)
        | (Q(buffered_count__gt=0) & ~_previous_run_active())
    )
    if tenant is not None:
        query = query.filter(tenant_id=tenant)
    rows = query.order_by(F("next_run_at").asc(nulls_first=True)).values_list(
        "id", "tenant_id", "next_run_at"
    )[:limit]
    return [DueSchedule(_uuid(i), _uuid(t), n) for i, t, n in rows]


def next_schedule_at(tenant: uuid.UUID | None = None) -> datetime | None:
    """The earliest ``next_run_at`` of any enabled schedule (None: nothing scheduled)."""
    sql = queries(connection)
    if "next_schedule_at" in sql:
        with connection.cursor() as cursor:
            cursor.execute(sql["next_schedule_at"], [tenant])
            row = cursor.fetchone()
            return row[0] if row else None
    query = Schedule.objects.filter(enabled=True, tenant__is_active=True, next_run_at__isnull=False)
    if tenant is not None:
        query = query.filter(tenant_id=tenant)
    found = query.order_by("next_run_at").values_list("next_run_at", flat=True).first()
    return found


# --- inside a tenant context ---------------------------------------------------------------


def lock_schedule(
    schedule_id: uuid.UUID, tenant: uuid.UUID, *, skip_locked: bool
) -> Schedule | None:
    """The schedule row, locked for this transaction; None if it is gone, disabled or (with
    ``skip_locked``) another scheduler holds it right now."""
    query = Schedule.objects.filter(id=schedule_id, tenant_id=tenant)
    return query.select_for_update(
        skip_locked=skip_locked and connection.features.has_select_for_update_skip_locked
    ).first()


def advance(schedule: Schedule, expected: datetime | None, **changes: Any) -> bool:
    """Compare-and-swap: apply ``changes`` only if ``next_run_at`` still holds ``expected``.

    Whoever moves the row off the instant it read owns that instant; every other scheduler
    that read the same row gets False and does nothing. (The row lock taken before makes
    losing rare; this is what makes it harmless.)"""
    match = Q(next_run_at__isnull=True) if expected is None else Q(next_run_at=expected)
    updated = Schedule.objects.filter(
        Q(id=schedule.id, tenant_id=schedule.tenant_id, enabled=True) & match
    ).update(**changes)
    if updated:
        for name, value in changes.items():
            setattr(schedule, name, value)
    return bool(updated)


def active_runs(schedule: Schedule) -> list[WorkflowInstance]:
    """Runs of the schedule's last run's workflow id (following continue-as-new) that are
    still going: ready, running or paused."""
    if schedule.last_run_id is None:
        return []
    last_workflow = WorkflowInstance.objects.filter(
        tenant_id=schedule.tenant_id, id=schedule.last_run_id
    ).values("workflow_id")
    return list(
        WorkflowInstance.objects.filter(
            tenant_id=schedule.tenant_id, workflow_id__in=last_workflow, status__in=_ACTIVE
        )
        .only("id", "status", "workflow_id", "created_at")
        .order_by("created_at")
    )


def last_run_failed(schedule: Schedule) -> WorkflowInstance | None:
    """The last run (the newest of its workflow id) if it ended in failure -- failed or
    dead-lettered, not cancelled, not terminated by an operator -- else None."""
    workflow_id = _last_workflow_id(schedule)
    if workflow_id is None:
        return None
    latest = (
        WorkflowInstance.objects.filter(tenant_id=schedule.tenant_id, workflow_id=workflow_id)
        .only("id", "tenant_id", "status", "error_code", "error")
        .order_by("-created_at")
        .first()
    )
    if latest is None or latest.status not in (RunStatus.FAILED, RunStatus.DEAD_LETTERED):
        return None
    if latest.error_code == "cancelled":
        return None
    return latest


def _last_workflow_id(schedule: Schedule) -> str | None:
    if schedule.last_run_id is None:
        return None
    found: str | None = (
        WorkflowInstance.objects.filter(tenant_id=schedule.tenant_id, id=schedule.last_run_id)
        .values_list("workflow_id", flat=True)
        .first()
    )
    return found
