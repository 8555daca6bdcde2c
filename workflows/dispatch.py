"""Dispatch on the broker (``CLEAT_DISPATCH=celery``): a wake-up publishes "run X is ready"
to the Celery queue of the run's task queue (``cleat.<task queue>``); a Celery worker
(``celery -A cleat_project worker -Q cleat.default``) takes the message, claims that run with
the worker's fenced claim (``claim_ready_instances(..., run=X)``: due, of an active tenant,
within its running cap, generation bumped) and executes its segment with the worker's code
(``executor.execute_claim``).

The database stays the source of truth; a message is only a hint:

* Publishing happens after the commit that made the run due (``transaction.on_commit``),
  never inside a transaction that may roll back, and records when (``dispatched_at``).
* A duplicate message (a re-delivery after a worker died, a sweep that published again)
  claims nothing: the run is running or done by then.
* What no wake-up announces -- a timer or a retry's back-off that became due, a run the
  reaper returned, a tenant reactivated -- and a message that was lost (the broker away, a
  publish that failed, a message dropped) are found by the sweep (:class:`Sweep`, a periodic
  duty of the worker loop or of the beat task): every ``CLEAT_DISPATCH_SWEEP_SECONDS`` it
  publishes each due ready run whose last message is older than its due time, or older
  than ``CLEAT_DISPATCH_REDELIVER_SECONDS`` while its queue holds no message (a backlog's
  messages are waiting, not lost: see :func:`sweep`).

Dropped approaches: publishing timers with a Celery ``eta`` (the broker or the worker holds
the message until then: a long timer sits in a worker's memory, and on Redis it is
re-delivered after the visibility timeout) and a sweep without ``dispatched_at`` (it
re-published the whole backlog on every pass).

``runworker`` keeps claiming from the database in either mode: a fleet may mix both, the
claim decides who runs a run.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connection, transaction
from django.db.models import F, Q
from django.utils import timezone
from prometheus_client import Counter

from workflows.duties import WorkerContext

log = logging.getLogger("cleat.dispatch")

POLL = "poll"
CELERY = "celery"
MODES = (POLL, CELERY)

RUN_SEGMENT_TASK = "cleat.run_segment"
QUEUE_PREFIX = "cleat."
# Broker priorities 0-9 (RabbitMQ: the queue's x-max-priority; Redis: kombu's steps).
MAX_BROKER_PRIORITY = 9

PUBLISHED = Counter("cleat_dispatch_published_total", "Ready messages published", ["by"])
PUBLISH_FAILED = Counter("cleat_dispatch_publish_failed_total", "Ready messages not published")
CLAIMED_NOTHING = Counter(
    "cleat_dispatch_claimed_nothing_total", "Ready messages whose run was not claimable"
)


def mode() -> str:
    """``CLEAT_DISPATCH``: ``poll`` (the default) or ``celery``; anything else is refused."""
    value = str(getattr(settings, "CLEAT_DISPATCH", POLL) or POLL).strip().lower()
    if value not in MODES:
        raise ImproperlyConfigured(
            f"CLEAT_DISPATCH={value!r} is not a dispatch mode: write 'poll' (runworker "
            "claims from the database, the default) or 'celery' (wake-ups are published to "
            "the broker, Celery workers run the segments)"
        )
    return value


def on_broker() -> bool:
    return mode() == CELERY


def celery_queue(task_queue: str) -> str:
    """The Celery queue of a task queue."""
    return f"{QUEUE_PREFIX}{task_queue}"


def broker_priority(priority: int, broker_url: str) -> int:
    """A run's priority (-100..100, higher first) as the broker's 0-9: higher first on
    RabbitMQ, lower first on Redis (kombu's Redis transport serves priority 0 first)."""
    from workflows.models import PRIORITY_MAX, PRIORITY_MIN

    clamped = min(max(priority, PRIORITY_MIN), PRIORITY_MAX)
    step = round((clamped - PRIORITY_MIN) * MAX_BROKER_PRIORITY / (PRIORITY_MAX - PRIORITY_MIN))
    if broker_url.split(":", 1)[0] in ("redis", "rediss", "sentinel"):
        return MAX_BROKER_PRIORITY - step
    return step


def sweep_every_s() -> float:
    return float(getattr(settings, "CLEAT_DISPATCH_SWEEP_SECONDS", 1.0))


def redeliver_after() -> timedelta:
    return timedelta(seconds=float(getattr(settings, "CLEAT_DISPATCH_REDELIVER_SECONDS", 10.0)))


# --- publishing ---------------------------------------------------------------------------


def publish(
    tenant: uuid.UUID | str, run_id: uuid.UUID | str, task_queue: str, priority: int, by: str
) -> bool:
    """Send "run X is ready". The message carries ids and the task queue only (never an
    input or a payload: what Flower and the broker show). A failure is logged: the sweep
    publishes the run again after the redelivery delay."""
    from workflows.celery_calls import celery_app, confirm_timeout

    app = celery_app()
    try:
        app.send_task(
            RUN_SEGMENT_TASK,
            args=[str(tenant), str(run_id)],
            kwargs={"task_queue": task_queue},
            queue=celery_queue(task_queue),
            priority=broker_priority(priority, str(app.conf.broker_url or "")),
            ignore_result=True,
            retry=True,
            retry_policy={"max_retries": 1, "interval_start": 0.2, "interval_step": 0.5},
            confirm_timeout=confirm_timeout(),
        )
    except Exception as exc:
        PUBLISH_FAILED.inc()
        log.warning(
            "event=dispatch_publish_failed run=%s detail=%r (the sweep publishes it again)",
            run_id,
            str(exc),
        )
        return False
    PUBLISHED.labels(by).inc()
    return True


def published_after_commit(
    tenant: uuid.UUID | str, run_id: uuid.UUID | str, task_queue: str, priority: int
) -> None:
    """Publish a run already marked ``dispatched_at`` once the current transaction commits
    (at once outside one)."""
    transaction.on_commit(lambda: publish(tenant, run_id, task_queue, priority, "wake"))


def ready_after_commit(tenant: uuid.UUID | str, run_id: uuid.UUID | str) -> None:
    """In broker dispatch: after the commit, mark the run dispatched and publish it, if it is
    ready and due then. Nothing in poll mode."""
    if on_broker():
        transaction.on_commit(lambda: _mark_and_publish(tenant, run_id))


def _mark_and_publish(tenant: uuid.UUID | str, run_id: uuid.UUID | str) -> None:
    from workflows.models import RunStatus, WorkflowInstance
    from workflows.tenancy import tenant_context

    now = timezone.now()
    try:
        with tenant_context(tenant):
            due = WorkflowInstance.objects.filter(
                id=run_id, tenant_id=tenant, status=RunStatus.READY, next_wake_at__lte=now
            )
            found = due.values_list("task_queue", "priority").first()
            if found is not None:
                due.update(dispatched_at=now)
    except Exception:  # the sweep finds it
        log.exception("event=dispatch_mark_failed run=%s", run_id)
        return
    if found is not None:
        publish(tenant, run_id, found[0], found[1], "wake")


# --- the sweep ----------------------------------------------------------------------------

SWEEP_BATCH = 500


def queue_depth(queue: str) -> int | None:
    """How many messages wait in ``queue`` on the broker (those a worker has taken but not
    yet acknowledged are not counted); None when the broker does not say."""
    from workflows.celery_calls import celery_app

    try:
        with celery_app().connection_for_write() as conn:
            _name, count, _consumers = conn.default_channel.queue_declare(queue=queue, passive=True)
            return int(count)
    except Exception:  # a queue not declared yet holds nothing; a broker away: unknown
        log.debug("event=dispatch_queue_depth_unknown queue=%s", queue, exc_info=True)
        return None


def sweep(now: datetime, batch: int = SWEEP_BATCH) -> int:
    """Publish, up to ``batch`` per tenant, every due ready run of an active tenant

    * whose last message is older than its due time (or that has none): a timer, a retry,
      a reaped lease, a run started or woken while its publish failed;
    * whose last message is older than the redelivery delay, when the run's queue holds no
      message: the message was lost (a queue with a backlog is left alone -- its messages
      are most likely still waiting there, and publishing them again every delay multiplied
      the backlog with duplicates).

    Marks them dispatched at ``now`` first (a transaction per tenant; rows another sweep
    holds are skipped). Returns how many were published (none in poll mode)."""
    from workflows.models import RunStatus, Tenant, WorkflowInstance
    from workflows.tenancy import tenant_context

    if not on_broker():
        return 0
    cutoff = now - redeliver_after()
    skip_locked = connection.features.has_select_for_update_skip_locked
    depths: dict[str, int | None] = {}
    published = 0
    for tenant in Tenant.objects.filter(is_active=True).values_list("id", flat=True):
        with tenant_context(tenant):
            due = WorkflowInstance.objects.filter(
                tenant_id=tenant, status=RunStatus.READY, next_wake_at__lte=now
            )
            stale = due.filter(dispatched_at__gte=F("next_wake_at"), dispatched_at__lte=cutoff)
            stale_queues = set(stale.values_list("task_queue", flat=True).distinct())
        for task_queue in stale_queues - set(depths):
            depths[task_queue] = queue_depth(celery_queue(task_queue))
        drained = [q for q in stale_queues if not depths[q]]
        with tenant_context(tenant):
            fresh = due.filter(
                Q(dispatched_at__isnull=True) | Q(dispatched_at__lt=F("next_wake_at"))
            )
            rows = list(
                fresh.select_for_update(skip_locked=skip_locked)
                .order_by("-priority", "next_wake_at")
                .values_list("id", "task_queue", "priority")[:batch]
            )
            if drained and len(rows) < batch:
                rows += list(
                    stale.filter(task_queue__in=drained)
                    .select_for_update(skip_locked=skip_locked)
                    .order_by("-priority", "next_wake_at")
                    .values_list("id", "task_queue", "priority")[: batch - len(rows)]
                )
            if rows:
                WorkflowInstance.objects.filter(id__in=[r for r, _, _ in rows]).update(
                    dispatched_at=now
                )
        for run_id, task_queue, priority in rows:
            published += publish(tenant, run_id, task_queue, priority, "sweep")
    if published:
        log.info("event=dispatch_sweep published=%d", published)
    return published


class Sweep:
    """The sweep as a periodic duty; on beat (where no worker loop may run) it also delivers
    the calls workflows handed to the host (``store.invocations``), as the loop does."""

    def __init__(self, on_beat: bool) -> None:
        self.every_s = sweep_every_s()
        self.on_beat = on_beat
        self._next = 0.0

    def run_due(self, now: datetime) -> int:
        tick = time.monotonic()
        if tick < self._next:
            return 0
        self._next = tick + self.every_s
        if self.on_beat:
            from workflows.executor import get_services
            from workflows.store import invocations

            for invocation_id, tenant in invocations.claim_due(now, 100):
                invocations.deliver(invocation_id, tenant, get_services(), now)
        return sweep(now)

    def seconds_until_due(self, now: datetime) -> float:
        return max(0.0, self._next - time.monotonic())


def sweep_duty(context: WorkerContext) -> Sweep | None:
    return Sweep(context.on_beat) if on_broker() else None


# --- the Celery side: claim the named run and execute it ------------------------------------

_worker_id: str | None = None


def worker_id() -> str:
    """This Celery worker process's lease holder name (one per process: a heartbeat would
    renew all its leases at once, as a worker's does)."""
    global _worker_id
    if _worker_id is None or not _worker_id.endswith(f"-{os.getpid()}"):
        _worker_id = f"celery-{socket.gethostname()}-{uuid.uuid4().hex[:6]}-{os.getpid()}"
    return _worker_id


def run_ready(tenant: uuid.UUID, run_id: uuid.UUID, task_queue: str) -> str:
    """Claim ``run_id`` if it is ready (same claim, same fencing as the worker's) and execute
    its segment. Returns the segment's outcome, or ``nothing`` when the run was not
    claimable (a duplicate message, a run another worker took, a tenant at its cap or
    inactive: the sweep publishes such a run again while it stays due)."""
    from workflows.executor import execute_claim
    from workflows.store.lifecycle import claim_ready_instances
    from workflows.worker import DatabaseClock, record_segment

    close_old_connections()
    try:
        clock = _clock(DatabaseClock)
        clock.sync()
        holder = worker_id()
        claims = claim_ready_instances(holder, [task_queue], 1, clock.now(), tenant, run=run_id)
        if not claims:
            CLAIMED_NOTHING.inc()
            log.info("event=dispatch_nothing_to_claim run=%s", run_id)
            return "nothing"
        report = execute_claim(claims[0], holder, clock.segment_clock())
        record_segment(report)
        return report.outcome
    finally:
        close_old_connections()


_clocks: dict[str, Any] = {}


def _clock(factory: Any) -> Any:
    """The process's database clock (workers.DatabaseClock), made once."""
    found = _clocks.get("clock")
    if found is None:
        found = _clocks["clock"] = factory()
    return found
