"""The due backlog: runs that are ``ready`` and due (``next_wake_at <= now``) but not yet
claimed, counted per task queue and definition with the oldest one's due time. One rule for
the console's dashboard and workers page (one tenant's runs) and the web process's
``/metrics`` gauges (every tenant's): :func:`due_runs`.

On PostgreSQL the fleet-wide read goes through the ``cleat.ready_backlog`` definer function
(the web connection sees one tenant at a time); its SQL says the same rule, and
``tests/integration/test_workers.py`` checks that both give the same figures.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.models import Count, Min, QuerySet

from workflows.models import RunStatus, WorkflowInstance
from workflows.store.sql import queries


@dataclass(frozen=True)
class Backlog:
    task_queue: str
    definition: str
    depth: int
    oldest_due_at: datetime

    def oldest_age_s(self, now: datetime) -> float:
        return max(0.0, (now - self.oldest_due_at).total_seconds())


def due_runs(runs: QuerySet[WorkflowInstance], now: datetime) -> QuerySet[WorkflowInstance]:
    """The runs of ``runs`` a worker would claim now, were it free."""
    return runs.filter(status=RunStatus.READY, next_wake_at__lte=now)


def backlog(runs: QuerySet[WorkflowInstance], now: datetime) -> list[Backlog]:
    """The due backlog of ``runs`` (a tenant's, or all), per task queue and definition."""
    rows = (
        due_runs(runs, now)
        .values("task_queue", "definition_name")
        .annotate(n=Count("id"), oldest=Min("next_wake_at"))
        .order_by()
    )
    return _sorted(
        Backlog(r["task_queue"], r["definition_name"], r["n"], r["oldest"]) for r in rows
    )


def fleet_backlog(now: datetime) -> list[Backlog]:
    """Every tenant's due backlog (``/metrics``)."""
    sql = queries(connection).get("ready_backlog")
    if sql is None:  # no row-level security here: the ORM reads every tenant's rows
        return backlog(WorkflowInstance.objects.all(), now)
    with connection.cursor() as cursor:
        cursor.execute(sql, [now])
        return _sorted(Backlog(*row) for row in cursor.fetchall())


def _sorted(items: Iterable[Backlog]) -> list[Backlog]:
    return sorted(items, key=lambda b: (b.task_queue, b.definition))
