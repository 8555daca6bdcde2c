"""The scheduler: ``tick(now)`` starts the runs schedules owe at ``now``.

One tick reads the due schedules of every tenant in one query (``schedules.store``), then
handles each in its own tenant context and transaction:

1. lock the row (``SKIP LOCKED``: a row another scheduler is handling is left to it) and
   check it still holds the ``next_run_at`` the read saw;
2. a row with no ``next_run_at`` yet (created by a workflow, the ORM or a migration) is
   initialised to its first instant after ``now``;
3. a due row is planned (:func:`plan_firing`: on time, or missed under its misfire policy),
   then advanced with a compare-and-swap on ``next_run_at``: whoever moves it owns the
   instant, everybody else does nothing;
4. the owned instant is delivered under the overlap policy (:func:`deliver`). The run is
   started with the idempotency key ``schedule:<id>:<instant>``, so even two attempts at the
   same instant (a crash between start and commit is impossible -- they share the
   transaction -- but an operator's backfill of an instant that already fired is not)
   start one run.

A row the scheduler cannot interpret (an expression or zone that no longer evaluates, a
workflow that is gone, input that is not JSON) is disabled with a note saying why; a database
error is logged and the row is retried on the next tick; nothing here ever raises out of
the loop that calls it.

Times are passed in (``now``): nothing below reads the clock except the worker's ticker.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import DatabaseError
from prometheus_client import Counter, Histogram

from engine.faults import crash_point
from schedules import store
from schedules.cron import CronError, Timing
from schedules.models import MisfirePolicy, OverlapPolicy, Schedule
from schedules.store import DueSchedule
from workflows.duties import WorkerContext
from workflows.models import Tenant, WorkflowInstance
from workflows.services import (
    Conflict,
    ServiceError,
    cancel_workflow,
    start_workflow,
    terminate_workflow,
)
from workflows.tenancy import tenant_context

log = logging.getLogger("cleat.scheduler")

FIRINGS = Counter("cleat_schedule_firings_total", "Schedule instants handled", ["outcome"])
LATENESS = Histogram(
    "cleat_schedule_lateness_seconds",
    "Run start minus the instant it was scheduled for",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
)

DEFAULT_BATCH = 200
# Counting a backlog (for the log line) stops here: a year of minutes is not worth walking.
MISSED_COUNT_CAP = 1000
OPERATOR = "scheduler"


def misfire_grace() -> timedelta:
    """How late an instant may be handled and still count as on time (not missed)."""
    return timedelta(seconds=float(getattr(settings, "CLEAT_SCHEDULE_MISFIRE_GRACE_SECONDS", 60)))


def firing_key_prefix(schedule_id: uuid.UUID) -> str:
    """What the start idempotency keys of every instant of one schedule begin with."""
    return f"schedule:{schedule_id}:"


def firing_key(schedule_id: uuid.UUID, instant: datetime) -> str:
    """The start idempotency key of one instant of one schedule."""
    return firing_key_prefix(schedule_id) + instant.astimezone(UTC).isoformat()


class Unusable(Exception):
    """The row cannot be acted on as stored; the scheduler disables it with this reason."""


# --- planning (pure) -------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    deliver: datetime | None  # the instant to deliver now (None: nothing)
    next_run_at: datetime | None  # None: the expression never fires again
    missed: int = 0  # instants dropped (skip, or beyond the catch-up limit); capped


def plan_firing(
    timing: Timing,
    expected: datetime,
    now: datetime,
    policy: str,
    limit: int,
    grace: timedelta,
) -> Plan:
    """What a due row (``next_run_at == expected <= now``) does at ``now``.

    * Within ``grace`` of its instant it is on time: deliver it, move to the next instant.
    * Later than that it was missed (nobody ran the scheduler):

      - ``skip`` delivers none of the backlog and resumes at the next future instant (an
        instant of the backlog that is itself still within the grace is on time, not
        missed, and is delivered);
      - ``catch_up`` delivers the backlog one instant per tick, oldest first, but only the
        newest ``limit`` instants of it: older ones are dropped. So an outage delivers
        exactly ``min(missed, limit)`` runs, then the schedule is back on its future
        instants.
    """
    if now - expected <= grace:
        return Plan(expected, timing.next_after(expected))
    if policy == MisfirePolicy.SKIP:
        latest = timing.prev_before(now + timedelta(microseconds=1))
        fresh = (
            latest if latest is not None and latest > expected and now - latest <= grace else None
        )
        owed = _count_owed(timing, expected, now)
        return Plan(fresh, timing.next_after(fresh or now), owed - (1 if fresh else 0))
    newest: list[datetime] = []  # instants in (expected, now], newest first
    cursor = now + timedelta(microseconds=1)
    while len(newest) < limit:
        found = timing.prev_before(cursor)
        if found is None or found <= expected:
            break
        newest.append(found)
        cursor = found
    if len(newest) < limit:  # the whole backlog (expected + newest) fits in the limit
        return Plan(expected, timing.next_after(expected))
    oldest_kept = newest[-1]
    dropped = _count_owed(timing, expected, oldest_kept - timedelta(microseconds=1))
    return Plan(oldest_kept, timing.next_after(oldest_kept), dropped)


def _count_owed(timing: Timing, start: datetime, end: datetime) -> int:
    """Instants in [start, end] (start counts even if it is not an instant), capped."""
    count = 1
    cursor = start
    while count < MISSED_COUNT_CAP:
        following = timing.next_after(cursor)
        if following is None or following > end:
            break
        count += 1
        cursor = following
    return count


# --- delivering one instant (inside the schedule's tenant context, row locked) ----------------


@dataclass(frozen=True)
class Delivery:
    instant: datetime
    # started | existing (the key's run already existed) | skipped (overlap) | buffered |
    # dropped (buffer_one already holds one)
    outcome: str
    run_id: uuid.UUID | None = None
    replaced: tuple[uuid.UUID, ...] = ()  # runs cancelled/terminated for this one


def deliver(
    schedule: Schedule,
    tenant: Tenant,
    instant: datetime,
    now: datetime,
    *,
    policy: str | None = None,
) -> list[Delivery]:
    """Deliver ``instant`` under the overlap policy (``policy`` overrides the schedule's).
    May start a buffered instant as well; returns every delivery made."""
    policy = policy or schedule.overlap_policy
    if policy == OverlapPolicy.ALLOW and not schedule.buffered_count:
        return [_start(schedule, tenant, instant, now)]  # nothing to look at
    going = store.active_runs(schedule)
    if policy in (OverlapPolicy.BUFFER_ONE, OverlapPolicy.BUFFER_ALL):
        made: list[Delivery] = []
        if not going and schedule.buffered_count:
            # The previous run ended and no tick has released the buffer yet: its oldest
            # instant starts first and this one queues behind it.
            made = release_buffered(schedule, tenant, now)
        queue = list(schedule.buffered_instants or [])
        if not going and not made and not queue:
            return [_start(schedule, tenant, instant, now)]
        if policy == OverlapPolicy.BUFFER_ONE and queue:
            made.append(Delivery(instant, "dropped"))
        else:
            queue.append(instant.astimezone(UTC).isoformat())
            _save_queue(schedule, queue)
            made.append(Delivery(instant, "buffered"))
        return made
    replaced: tuple[uuid.UUID, ...] = ()
    if going:
        if policy == OverlapPolicy.SKIP:
            return [Delivery(instant, "skipped")]
        if policy == OverlapPolicy.CANCEL_OTHER:
            replaced = _end_runs(tenant, going, cancel_workflow, instant)
        elif policy == OverlapPolicy.TERMINATE_OTHER:
            replaced = _end_runs(tenant, going, terminate_workflow, instant)
    started = _start(schedule, tenant, instant, now)
    return [Delivery(started.instant, started.outcome, started.run_id, replaced)]


def release_buffered(schedule: Schedule, tenant: Tenant, now: datetime) -> list[Delivery]:
    """Start the oldest buffered instant if the previous run has ended."""
    queue = list(schedule.buffered_instants or [])
    if not queue or store.active_runs(schedule):
        return []
    head = datetime.fromisoformat(queue.pop(0))
    _save_queue(schedule, queue)
    return [_start(schedule, tenant, head, now)]


def _save_queue(schedule: Schedule, queue: list[str]) -> None:
    Schedule.objects.filter(id=schedule.id, tenant_id=schedule.tenant_id).update(
        buffered_instants=queue, buffered_count=len(queue)
    )
    schedule.buffered_instants, schedule.buffered_count = queue, len(queue)


def _end_runs(
    tenant: Tenant,
    runs: list[WorkflowInstance],
    end: Callable[..., WorkflowInstance],
    instant: datetime,
) -> tuple[uuid.UUID, ...]:
    """Cancel (a request the run sees) or terminate the runs an instant replaces."""
    ended = []
    for run in runs:
        try:
            end(
                tenant,
                str(run.id),
                reason=f"replaced by the schedule's run for {instant.isoformat()}",
                operator=OPERATOR,
            )
        except Conflict:
            continue  # it ended meanwhile
        ended.append(run.id)
    return tuple(ended)


def _start(schedule: Schedule, tenant: Tenant, instant: datetime, now: datetime) -> Delivery:
    """Start the run of ``instant`` (idempotent per instant) and record it as the last run.
    A :class:`ServiceError` (workflow gone, bad input, ...) propagates."""
    stamp = instant.astimezone(UTC)
    instance, created = start_workflow(
        tenant,
        schedule.workflow_name,
        schedule.input,
        version=schedule.workflow_version,
        tag=schedule.workflow_tag or None,
        idempotency_key=firing_key(schedule.id, instant),
        entry_point=schedule.entry_point,
        workflow_id=f"{schedule.name[:96]}@{stamp:%Y-%m-%dT%H:%M:%SZ}",
    )
    Schedule.objects.filter(id=schedule.id, tenant_id=schedule.tenant_id).update(
        last_run_id=instance.id, last_run_at=instant
    )
    crash_point("schedule_fire")  # the run started, the firing's transaction not committed
    schedule.last_run_id, schedule.last_run_at = instance.id, instant
    if created:
        LATENESS.observe(max(0.0, (instance.created_at - instant).total_seconds()))
    return Delivery(instant, "started" if created else "existing", instance.id)


# --- the tick ----------------------------------------------------------------------------------


@dataclass
class TickReport:
    due: int = 0  # rows the due read returned
    initialised: int = 0
    started: int = 0
    existing: int = 0
    skipped: int = 0  # overlap skip
    buffered: int = 0
    dropped: int = 0  # buffer_one full
    missed: int = 0  # misfires not delivered
    disabled: int = 0
    contended: int = 0  # another scheduler had the row
    errors: int = 0
    more: bool = False  # the due read hit its limit: tick again at once
    deliveries: list[Delivery] = field(default_factory=list)

    @property
    def progress(self) -> int:
        return (
            self.initialised
            + self.started
            + self.existing
            + self.skipped
            + self.buffered
            + self.dropped
            + self.missed
            + self.disabled
        )

    def add(self, made: list[Delivery]) -> None:
        for delivery in made:
            setattr(self, delivery.outcome, getattr(self, delivery.outcome) + 1)
            FIRINGS.labels(delivery.outcome).inc()
        self.deliveries.extend(made)

    def summary(self) -> str:
        names = "due initialised started existing skipped buffered dropped missed disabled"
        names += " contended errors"
        return " ".join(f"{n}={getattr(self, n)}" for n in names.split())


def tick(
    now: datetime,
    *,
    tenant: uuid.UUID | None = None,
    limit: int = DEFAULT_BATCH,
    grace: timedelta | None = None,
) -> TickReport:
    """Handle every schedule due at ``now`` (of one tenant, or all). Never raises."""
    grace = misfire_grace() if grace is None else grace
    report = TickReport()
    try:
        rows = store.due_schedules(now, limit, tenant)
    except DatabaseError:
        report.errors += 1
        log.exception("event=schedule_due_read_failed (retried next tick)")
        return report
    report.due, report.more = len(rows), len(rows) >= limit
    # Concurrent schedulers read the same rows: a different order per process lets them
    # work on different rows instead of queueing behind one another's locks.
    random.shuffle(rows)
    for row in rows:
        _handle(row, now, grace, report)
    return report


def _handle(row: DueSchedule, now: datetime, grace: timedelta, report: TickReport) -> None:
    try:
        with tenant_context(row.tenant_id):
            _handle_in_tenant(row, now, grace, report)
    except (CronError, Unusable, ServiceError) as exc:
        reason = exc.message if isinstance(exc, CronError | ServiceError) else str(exc)
        if isinstance(exc, ServiceError) and exc.field:
            reason = f"{reason} ({exc.field})"
        _disable(row, reason, now, report)
    except DatabaseError:
        report.errors += 1
        log.exception("event=schedule_error schedule=%s (retried next tick)", row.id)
    except Exception:
        report.errors += 1
        log.exception("event=schedule_error schedule=%s", row.id)


def _handle_in_tenant(
    row: DueSchedule, now: datetime, grace: timedelta, report: TickReport
) -> None:
    schedule = store.lock_schedule(row.id, row.tenant_id, skip_locked=True)
    if schedule is None or not schedule.enabled or schedule.next_run_at != row.next_run_at:
        report.contended += 1
        return
    timing = schedule.timing
    expected = schedule.next_run_at
    if expected is None:
        first = timing.next_after(now)
        if first is None:
            raise Unusable(f"{schedule.cron!r} never fires after {now.isoformat()}")
        if store.advance(schedule, None, next_run_at=first):
            report.initialised += 1
            log.info(
                "event=schedule_initialised schedule=%s name=%s next_run_at=%s",
                schedule.id,
                schedule.name,
                first.isoformat(),
            )
        else:
            report.contended += 1
        return
    tenant = Tenant(id=row.tenant_id)  # the services need its id only
    if schedule.pause_on_failure and _paused_for_failure(schedule, now):
        report.disabled += 1
        return
    if expected > now:  # only buffered instants brought it here
        _log(schedule, release_buffered(schedule, tenant, now), now, report)
        return
    plan = plan_firing(
        timing, expected, now, schedule.misfire_policy, schedule.catch_up_limit, grace
    )
    if plan.next_run_at is None:
        raise Unusable(f"{schedule.cron!r} never fires after {expected.isoformat()}")
    if not store.advance(schedule, expected, next_run_at=plan.next_run_at):
        report.contended += 1
        return
    if plan.missed:
        report.missed += plan.missed
        FIRINGS.labels("missed").inc(plan.missed)
        log.warning(
            "event=schedule_misfire schedule=%s name=%s policy=%s missed=%d%s from=%s now=%s",
            schedule.id,
            schedule.name,
            schedule.misfire_policy,
            plan.missed,
            "+" if plan.missed >= MISSED_COUNT_CAP else "",
            expected.isoformat(),
            now.isoformat(),
        )
    if plan.deliver is not None:
        _log(schedule, deliver(schedule, tenant, plan.deliver, now), now, report)


def _log(schedule: Schedule, made: list[Delivery], now: datetime, report: TickReport) -> None:
    report.add(made)
    for delivery in made:
        log.info(
            "event=schedule_fired schedule=%s name=%s tenant=%s instant=%s outcome=%s run=%s "
            "late_ms=%d%s",
            schedule.id,
            schedule.name,
            schedule.tenant_id,
            delivery.instant.astimezone(UTC).isoformat(),
            delivery.outcome,
            delivery.run_id or "-",
            (now - delivery.instant).total_seconds() * 1000,
            f" replaced={','.join(map(str, delivery.replaced))}" if delivery.replaced else "",
        )


def _paused_for_failure(schedule: Schedule, now: datetime) -> bool:
    failed = store.last_run_failed(schedule)
    if failed is None:
        return False
    error = (failed.error or "")[:200]
    reason = (
        f"its last run {failed.id} ended {failed.status} "
        f"({failed.error_code or 'error'}: {error}) and pause_on_failure is set"
    )
    Schedule.objects.filter(id=schedule.id, tenant_id=schedule.tenant_id).update(
        enabled=False,
        notes=append_note(schedule.notes, now, f"disabled by the scheduler: {reason}"),
    )
    log.warning(
        "event=schedule_disabled schedule=%s name=%s reason=%r", schedule.id, schedule.name, reason
    )
    return True


def _disable(row: DueSchedule, reason: str, now: datetime, report: TickReport) -> None:
    """Disable a row the scheduler cannot act on, with a note (only if nobody moved it)."""
    try:
        with tenant_context(row.tenant_id):
            schedule = store.lock_schedule(row.id, row.tenant_id, skip_locked=False)
            if schedule is None or not schedule.enabled or schedule.next_run_at != row.next_run_at:
                report.contended += 1
                return
            store.advance(
                schedule,
                row.next_run_at,
                enabled=False,
                notes=append_note(schedule.notes, now, f"disabled by the scheduler: {reason}"),
            )
    except DatabaseError:
        report.errors += 1
        log.exception("event=schedule_error schedule=%s (retried next tick)", row.id)
        return
    report.disabled += 1
    FIRINGS.labels("disabled").inc()
    log.warning("event=schedule_disabled schedule=%s reason=%r", row.id, reason)


def append_note(notes: str, now: datetime, text: str) -> str:
    line = f"[{now.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z] {text}"
    return f"{notes.rstrip()}\n{line}" if notes.strip() else line


# --- the worker's ticker -------------------------------------------------------------------


class ScheduleTicker:
    """Runs :func:`tick` from a loop: when a schedule's instant has come, and at least every
    ``interval_s`` (for schedules created meanwhile and buffered instants whose previous run
    has ended). :meth:`seconds_until_due` is how long the loop may sleep."""

    BUSY_RETRY_S = 0.05  # a due row another scheduler holds: look again shortly

    def __init__(
        self,
        tenant: uuid.UUID | None = None,
        interval_s: float = 1.0,
        limit: int = DEFAULT_BATCH,
    ) -> None:
        self.tenant = tenant
        self.interval_s = interval_s
        self.limit = limit
        self._next_due: datetime | None = None
        self._next_check = 0.0  # monotonic
        self._hold_until = 0.0  # monotonic

    def run_due(self, now: datetime) -> TickReport | None:
        """Tick if it is time to (see the class docstring); never raises."""
        mono = time.monotonic()
        if mono < self._hold_until:
            return None
        due = self._next_due is not None and self._next_due <= now
        if not due and mono < self._next_check:
            return None
        try:
            report = tick(now, tenant=self.tenant, limit=self.limit)
            self._next_due = store.next_schedule_at(self.tenant)
        except Exception:  # tick() does not raise; the next-due read may
            log.exception("event=scheduler_error (retried in %.1fs)", self.interval_s)
            self._next_due = None
            self._next_check = mono + self.interval_s
            return None
        self._next_check = mono if report.more else mono + self.interval_s
        # Still due but nothing moved: another scheduler holds the rows, or they fail. Do
        # not spin on them.
        stuck = self._next_due is not None and self._next_due <= now and not report.progress
        if stuck:
            self._hold_until = mono + (self.interval_s if report.errors else self.BUSY_RETRY_S)
        else:
            self._hold_until = 0.0
        return report

    def seconds_until_due(self, now: datetime) -> float:
        """Seconds until the next tick is wanted (0: now)."""
        mono = time.monotonic()
        wait = self._next_check - mono
        if self._next_due is not None:
            wait = min(wait, (self._next_due - now).total_seconds())
        return max(0.0, wait, self._hold_until - mono)


def scheduler_in_worker() -> bool:
    return bool(getattr(settings, "CLEAT_SCHEDULER_IN_WORKER", True))


def worker_duty(worker: WorkerContext) -> ScheduleTicker | None:
    """The tick as a periodic duty of the worker loop (registered in SchedulesConfig.ready),
    unless CLEAT_SCHEDULER_IN_WORKER is off (the Celery beat task runs it whatever that says:
    ``worker.on_beat``)."""
    if not worker.on_beat and not scheduler_in_worker():
        return None
    return ScheduleTicker(worker.tenant, worker.poll_interval_s)


__all__ = [
    "Delivery",
    "Plan",
    "ScheduleTicker",
    "TickReport",
    "deliver",
    "firing_key",
    "plan_firing",
    "release_buffered",
    "tick",
    "worker_duty",
]
