"""cleat's own Celery tasks (discovered by ``cleat_project.celery``'s ``autodiscover_tasks``).

``cleat.maintenance``: the periodic duties (``workflows.duties``: the reaper, the schedule
tick, and whatever else the apps register) run as one Celery beat periodic task, with the
same code as the worker loop runs them. Turn it on with ``CLEAT_MAINTENANCE_ON_BEAT=1`` (the
worker loops then run no duty) and run ``celery -A cleat_project beat`` next to the Celery
workers; beat sends the task every ``CLEAT_BEAT_INTERVAL_SECONDS``. Each Celery worker
process keeps its duties between tasks (a duty remembers when it is next due); several
processes running the task at once is safe (the reaper is idempotent, a schedule instant
fires once: ``schedules.scheduler``).

``cleat.run_segment``: broker dispatch (``CLEAT_DISPATCH=celery``, ``workflows/dispatch.py``).
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from typing import Any

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from workflows import dispatch, duties

log = logging.getLogger("cleat.worker")

MAINTENANCE_TASK = "cleat.maintenance"

_lock = threading.Lock()
_started: list[tuple[str, duties.Duty]] | None = None


def beat_duties() -> list[tuple[str, duties.Duty]]:
    """This process's duties, started once, as a worker would, with ``on_beat``."""
    global _started
    with _lock:
        if _started is None:
            context = duties.WorkerContext(
                worker_id=f"beat-{socket.gethostname()}",
                tenant=None,
                poll_interval_s=beat_interval_s(),
                lease_s=float(getattr(settings, "CLEAT_LEASE_SECONDS", 60.0)),
                on_beat=True,
            )
            _started = duties.start(context)
        return _started


def reset_beat_duties() -> None:
    """Start the duties afresh on the next task (tests)."""
    global _started
    with _lock:
        _started = None


def beat_interval_s() -> float:
    return float(getattr(settings, "CLEAT_BEAT_INTERVAL_SECONDS", 1.0))


@shared_task(name=MAINTENANCE_TASK, ignore_result=True)
def run_maintenance() -> dict[str, str]:
    """Run each duty's due work now; one that raises is logged and the others still run.
    Returns each duty's report (its text), for the task's log line."""
    done: dict[str, str] = {}
    for name, duty in beat_duties():
        try:
            done[name] = str(duty.run_due(timezone.now()))
        except Exception:
            log.exception("event=duty_error duty=%s worker=beat", name)
            done[name] = "error"
    return done


def beat_schedule() -> dict[str, Any]:
    """The beat entry of the maintenance task (``cleat_project/celery.py`` installs it when
    ``CLEAT_MAINTENANCE_ON_BEAT`` is on). A task older than five intervals is dropped: a
    backlog of ticks after an outage must not run the duties many times over."""
    interval = beat_interval_s()
    options: dict[str, Any] = {"expires": interval * 5}
    queue = str(getattr(settings, "CLEAT_MAINTENANCE_QUEUE", "") or "")
    if queue:
        options["queue"] = queue
    return {
        "cleat-maintenance": {
            "task": MAINTENANCE_TASK,
            "schedule": interval,
            "options": options,
        }
    }


@shared_task(name=dispatch.RUN_SEGMENT_TASK, ignore_result=True, acks_late=True)
def run_segment(tenant_id: str, run_id: str, task_queue: str = "default") -> str:
    """Broker dispatch (``CLEAT_DISPATCH=celery``, ``workflows/dispatch.py``): claim the
    run this message names, if it is ready, and execute its segment. The arguments are ids
    and the task queue only. A malformed message is logged and dropped (never retried)."""
    try:
        tenant, run = uuid.UUID(str(tenant_id)), uuid.UUID(str(run_id))
    except ValueError:
        log.error("event=dispatch_bad_message tenant=%r run=%r", tenant_id, run_id)
        return "bad_message"
    return dispatch.run_ready(tenant, run, str(task_queue))
