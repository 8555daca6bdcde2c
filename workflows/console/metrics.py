"""The dashboard's figures for one tenant, computed from the instances table.

All queries are aggregates scoped by tenant (and run inside the request's tenant context, so
RLS applies on PostgreSQL); per-minute series come from ``TruncMinute`` groupings over the
last hour, never from loading rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, Min, Q, QuerySet
from django.db.models.functions import TruncMinute

from workflows.models import TERMINAL_STATUSES, RunStatus, Tenant, WorkflowInstance
from workflows.store.backlog import due_runs
from workflows.tenancy import of_tenant

WINDOW_MINUTES = 60
_FAILED = (RunStatus.FAILED, RunStatus.DEAD_LETTERED, RunStatus.TERMINATED)


@dataclass
class DefinitionStats:
    name: str
    by_status: dict[str, int] = field(default_factory=dict)
    finished_last_hour: int = 0
    failed_last_hour: int = 0
    ready_depth: int = 0
    oldest_ready_s: float | None = None

    @property
    def total(self) -> int:
        return sum(self.by_status.values())

    @property
    def failure_rate(self) -> float | None:
        if not self.finished_last_hour:
            return None
        return self.failed_last_hour / self.finished_last_hour


@dataclass
class Dashboard:
    now: datetime
    definition: str | None  # the one definition shown, or None for all
    by_status: dict[str, int]
    minutes: list[datetime]  # the buckets' starts, oldest first
    starts: list[int]
    completions: list[int]
    failures: list[int]
    ready_depth: int
    oldest_ready_s: float | None
    per_definition: list[DefinitionStats]

    @property
    def finished_last_hour(self) -> int:
        return sum(self.completions) + sum(self.failures)

    @property
    def failure_rate(self) -> float | None:
        """Failed, dead-lettered or terminated among the runs that ended in the window."""
        finished = self.finished_last_hour
        return sum(self.failures) / finished if finished else None


def _per_minute(
    runs: QuerySet[WorkflowInstance], column: str, minutes: list[datetime], extra: Q | None = None
) -> list[int]:
    start = minutes[0]
    query = runs.filter(**{f"{column}__gte": start})
    if extra is not None:
        query = query.filter(extra)
    counts = {
        row["minute"]: row["n"]
        for row in query.annotate(minute=TruncMinute(column))
        .values("minute")
        .annotate(n=Count("id"))
        .order_by()
    }
    # Bucket keys come back aware (USE_TZ) on every backend; normalise to the minute. A time
    # stamped after ``now`` (a worker's clock a little ahead of this server's) counts in the
    # current minute rather than falling outside the window.
    normalised: dict[datetime, int] = {}
    for minute, n in counts.items():
        if minute is None:
            continue
        key = min(minute.replace(second=0, microsecond=0), minutes[-1])
        normalised[key] = normalised.get(key, 0) + n
    return [normalised.get(m, 0) for m in minutes]


def dashboard(tenant: Tenant, now: datetime, definition: str | None = None) -> Dashboard:
    runs = of_tenant(WorkflowInstance, tenant.id)
    if definition:
        runs = runs.filter(definition_name=definition)
    last = now.replace(second=0, microsecond=0)
    minutes = [last - timedelta(minutes=i) for i in range(WINDOW_MINUTES - 1, -1, -1)]
    by_status = {s.value: 0 for s in RunStatus}
    for row in runs.values("status").annotate(n=Count("id")).order_by():
        by_status[row["status"]] = row["n"]
    starts = _per_minute(runs, "created_at", minutes)
    completions = _per_minute(runs, "completed_at", minutes, Q(status=RunStatus.DONE))
    failures = _per_minute(runs, "completed_at", minutes, Q(status__in=_FAILED))
    ready = due_runs(runs, now).aggregate(n=Count("id"), oldest=Min("next_wake_at"))
    return Dashboard(
        now=now,
        definition=definition,
        by_status=by_status,
        minutes=minutes,
        starts=starts,
        completions=completions,
        failures=failures,
        ready_depth=ready["n"],
        oldest_ready_s=(now - ready["oldest"]).total_seconds() if ready["oldest"] else None,
        per_definition=_per_definition(runs, now, minutes[0]),
    )


def _per_definition(
    runs: QuerySet[WorkflowInstance], now: datetime, since: datetime
) -> list[DefinitionStats]:
    stats: dict[str, DefinitionStats] = {}

    def entry(name: str) -> DefinitionStats:
        return stats.setdefault(name, DefinitionStats(name))

    for row in runs.values("definition_name", "status").annotate(n=Count("id")).order_by():
        entry(row["definition_name"]).by_status[row["status"]] = row["n"]
    for row in (
        runs.filter(completed_at__gte=since, status__in=TERMINAL_STATUSES)
        .values("definition_name")
        .annotate(n=Count("id"), failed=Count("id", filter=Q(status__in=_FAILED)))
        .order_by()
    ):
        item = entry(row["definition_name"])
        item.finished_last_hour, item.failed_last_hour = row["n"], row["failed"]
    for row in (
        due_runs(runs, now)
        .values("definition_name")
        .annotate(n=Count("id"), oldest=Min("next_wake_at"))
        .order_by()
    ):
        item = entry(row["definition_name"])
        item.ready_depth = row["n"]
        item.oldest_ready_s = (now - row["oldest"]).total_seconds() if row["oldest"] else None
    return sorted(stats.values(), key=lambda s: (-s.total, s.name))
