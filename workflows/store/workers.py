"""The worker registry (``WorkerProcess``): what a worker writes about itself and what the
console, the API and ``/metrics`` read back.

A heartbeat is one upsert statement (``INSERT ... ON CONFLICT`` / ``ON DUPLICATE KEY``,
said through the ORM's ``bulk_create(update_conflicts=True)``), written on the loop's
heartbeat, never on the claim or the finalize path. The table is fleet-wide: no tenant
context is needed or used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from workflows.models import WorkerProcess
from workflows.store.lifecycle import database_now

ERROR_CHARS = 500  # a last error is kept to this length


@dataclass(frozen=True)
class WorkerBeat:
    """What a worker reports on a heartbeat."""

    worker_id: str
    host: str
    pid: int
    task_queues: Sequence[str]
    concurrency: int
    started_at: datetime
    heartbeat_interval_s: float
    runs_held: int
    steps_total: int
    steps_per_s: float
    last_error: str = ""
    last_error_at: datetime | None = None


_UPDATED = (
    "host",
    "pid",
    "task_queues",
    "concurrency",
    "started_at",
    "heartbeat_at",
    "heartbeat_interval_s",
    "runs_held",
    "steps_total",
    "steps_per_s",
    "last_error",
    "last_error_at",
)


def fleet_now() -> datetime:
    """The time the workers' heartbeats are stamped with: the database's clock (they follow
    it, see ``workflows.worker.DatabaseClock``), or this machine's where the dialect has none."""
    return database_now() or timezone.now()


def record_heartbeat(beat: WorkerBeat, now: datetime) -> None:
    """Insert or refresh the worker's row, in one statement."""
    row = WorkerProcess(
        worker_id=beat.worker_id,
        host=beat.host,
        pid=beat.pid,
        task_queues=list(beat.task_queues),
        concurrency=beat.concurrency,
        started_at=beat.started_at,
        heartbeat_at=now,
        heartbeat_interval_s=beat.heartbeat_interval_s,
        runs_held=beat.runs_held,
        steps_total=beat.steps_total,
        steps_per_s=round(beat.steps_per_s, 3),
        last_error=beat.last_error[:ERROR_CHARS],
        last_error_at=beat.last_error_at,
    )
    features = connection.features
    if features.supports_update_conflicts:
        # MySQL / MariaDB's ON DUPLICATE KEY UPDATE names no conflict target.
        target = ["worker_id"] if features.supports_update_conflicts_with_target else None
        WorkerProcess.objects.bulk_create(
            [row], update_conflicts=True, update_fields=list(_UPDATED), unique_fields=target
        )
        return
    # A backend with no upsert: update, insert when there was nothing to update.
    if not WorkerProcess.objects.filter(worker_id=row.worker_id).update(
        **{name: getattr(row, name) for name in _UPDATED}
    ):
        row.save(force_insert=True)


def forget_worker(worker_id: str) -> int:
    """A clean stop: the worker's row goes."""
    deleted, _ = WorkerProcess.objects.filter(worker_id=worker_id).delete()
    return deleted


def forget_long_gone(now: datetime, older_than: timedelta) -> int:
    """Rows of workers not heard of for ``older_than`` (they died without a clean stop, long
    ago): removed by each worker when it starts, so the page does not fill with the dead."""
    deleted, _ = WorkerProcess.objects.filter(heartbeat_at__lt=now - older_than).delete()
    return deleted


__all__ = ["WorkerBeat", "fleet_now", "forget_long_gone", "forget_worker", "record_heartbeat"]
