"""Making waiting runs due, and telling idle workers there is work.

A run that waits (for a signal, a child, a promise) has ``next_wake_at`` NULL or in the
future. Whatever satisfies the wait makes it due: ``next_wake_at = now`` if it is ``ready``.
That is done after the satisfying transaction commits, in a short transaction of its own, so
no transaction ever holds two runs' row locks (no deadlocks between runs signalling each
other, nor between a child finishing and a parent closing its children).

If the process dies between the two (``os._exit``, ``kill -9``: the crash point
``before_wake``), the wake-up is lost with it. The **wake sweep** (:func:`sweep_missed_wakes`,
the worker duty ``wake_sweep`` every ``CLEAT_WAKE_SWEEP_SECONDS``) finds such runs: it takes
the waiting runs (``ready``, not due) that received something since its last pass -- a child
that ended (or a run it started detached), an unconsumed signal, a pending update, a task
call's reported outcome, a settled promise, a cancellation request -- asks
:func:`wakeup_arrived` (the same rule the finalize asks) whether that satisfies what each one
waits for, and wakes those through :func:`wake_now`. It reads those rows from the satisfying
side, each by an index on when it arrived, so a pass costs what arrived since the last one,
not the number of waiting runs. The run's re-check (``CLEAT_WAIT_RECHECK_SECONDS``) remains
the last resort (no worker running the sweep, an arrival whose commit lagged its timestamp by
more than :data:`SWEEP_OVERLAP`).

Approaches dropped: waking inside the satisfying transaction (it takes the waiting run's row
lock while holding the child's: a parent closing its children takes them in the other order,
a deadlock); a row written with each satisfaction and deleted by its wake (an outbox: exact,
but a write and a delete more on every child end, signal and update, to cover a crash).

Ordering argument for the race with a finalizing run: the finalize holds the run's row lock
while it looks for wake-ups that arrived during the segment; a wake issued after the
satisfying commit reads the row with a lock, so it either sees the finalize's ``ready`` (and
wakes it) or waits for the lock and then does; a satisfying commit that happened before the
finalize's look is seen by it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from engine.faults import crash_point
from workflows import dispatch
from workflows.models import (
    TERMINAL_STATUSES,
    Promise,
    RunStatus,
    Signal,
    TaskCall,
    UpdateRequest,
    WorkflowInstance,
    chain_ends,
)
from workflows.store.sql import array_literal, queries
from workflows.tenancy import tenant_context

log = logging.getLogger("cleat.store")

NOTIFY_CHANNEL = "cleat_wake"


def wake_now(tenant: uuid.UUID, instance_id: uuid.UUID | str) -> bool:
    """Make a ready run due now. Returns whether it was waiting.

    The row is read with a lock first, and only then judged: an ``UPDATE ... WHERE status =
    'ready'`` alone skipped a run whose finalize was in flight -- PostgreSQL (READ COMMITTED)
    matches the WHERE against the last committed version, still ``running``, and so neither
    waits for the finalize's lock nor sees its ``ready`` -- and the run slept until its
    re-check although its child had finished (found by the fault soak: a child completing on
    one thread while its parent's finalize ran on another). The locking read waits for the
    finalize and returns the row as it committed."""
    now = timezone.now()
    with tenant_context(tenant):
        found = (
            WorkflowInstance.objects.select_for_update()
            .filter(id=instance_id, tenant_id=tenant)
            .values_list("status", "next_wake_at", "task_queue", "priority")
            .first()
        )
        if found is None:
            return False
        status, wake_at, task_queue, priority = found
        if status != RunStatus.READY or (wake_at is not None and wake_at <= now):
            return False
        broker = dispatch.on_broker()
        woken = WorkflowInstance.objects.filter(id=instance_id, tenant_id=tenant).update(
            next_wake_at=now, **({"dispatched_at": now} if broker else {})
        )
    if woken:
        notify()
        if broker:  # committed: published at once (or after an outer transaction commits)
            dispatch.published_after_commit(tenant, instance_id, task_queue, priority)
    return bool(woken)


# A wake that fails -- the connection broke just after the satisfying commit (a restart, a
# cut) -- is tried again on a new connection after each pause; only if the database stays
# away that long is the run left to its periodic re-check. Without the retries a child that
# finished as the database restarted left its parent asleep for CLEAT_WAIT_RECHECK_SECONDS
# (found by the fault soak).
WAKE_RETRY_S = (0.2, 0.5, 1.0, 2.0)


def after_commit(tenant: uuid.UUID, instance_id: uuid.UUID | str) -> None:
    def run() -> None:
        # A crash here: the satisfying transaction committed, its wake-up never ran (the
        # wake sweep finds the run).
        crash_point("before_wake")
        for attempt, pause in enumerate((0.0, *WAKE_RETRY_S)):
            time.sleep(pause)
            try:
                wake_now(tenant, instance_id)
                return
            except DatabaseError as exc:
                log.warning(
                    "event=wake_retry run=%s attempt=%d detail=%r", instance_id, attempt, str(exc)
                )
                if not connection.in_atomic_block:
                    connection.close()  # the next try opens a new one
            except Exception:  # the periodic re-check recovers a missed wake
                log.exception("could not wake run %s", instance_id)
                return
        log.error(
            "could not wake run %s (the database stayed away; its re-check will)", instance_id
        )

    transaction.on_commit(run)


def wait_sources(wait: Mapping[str, object]) -> dict[str, Any]:
    """What the wait ``wait`` (a ``WaitCondition.as_dict()``) names, source by source, as
    ``cleat.wakeup_arrived`` (sql/postgresql.py) takes them: its signals' names, the
    children it waits for, its task call, its promise -- None for a source it does not name
    (the function skips its read)."""
    return {
        "signals": list(wait.get("signals") or []) or None,  # type: ignore[call-overload]
        "children": list(wait.get("run_ids") or []) or None,  # type: ignore[call-overload]
        "task": wait.get("task_id") or None,
        "promise": wait.get("promise_id") or None,
    }


def wakeup_arrived(instance: WorkflowInstance, wait: Mapping[str, object]) -> bool:
    """Whether something ``instance`` can be woken by has arrived: a cancellation request, a
    pending update, or what its wait names (``wait``: a ``WaitCondition.as_dict()``, as
    ``waiting_on`` stores it) -- an unconsumed signal of its names, an ended child (the run
    that ends its continue-as-new chain has ended: a child that continued as new has not), its
    task call's reported outcome, its settled promise.

    The one readiness rule: the finalize asks it about what arrived while the segment ran,
    the wake sweep about waiting runs whose wake-up may have been lost. On PostgreSQL it is
    the function ``cleat.wakeup_arrived`` (sql/postgresql.py), which the one-call finalize
    of a wait calls too; elsewhere the ORM reads the sources the wait names, one by one."""
    named = wait_sources(wait)
    names, run_ids = named["signals"], named["children"]
    task_id, promise_id = named["task"], named["promise"]
    statement = queries(connection).get("wakeup_arrived")
    if statement is not None:
        arguments = [
            bool(instance.cancel_requested),
            str(instance.id),
            None if names is None else array_literal(names),
            None if run_ids is None else array_literal(run_ids),
            task_id,
            promise_id,
        ]
        with connection.cursor() as cursor:
            cursor.execute(statement, arguments)
            row = cursor.fetchone()
        return bool(row and row[0])
    if instance.cancel_requested:
        return True
    if UpdateRequest.objects.filter(
        instance_id=instance.id, status=UpdateRequest.State.PENDING
    ).exists():
        return True
    if (
        names
        and Signal.objects.filter(
            instance_id=instance.id, consumed_at__isnull=True, name__in=names
        ).exists()
    ):
        return True
    if run_ids and any(
        status in TERMINAL_STATUSES
        for (status,) in chain_ends({uuid.UUID(str(r)) for r in run_ids}, ("status",)).values()
    ):
        return True
    if task_id and TaskCall.objects.filter(id=task_id, state=TaskCall.State.REPORTED).exists():
        return True
    return bool(
        promise_id
        and Promise.objects.filter(id=promise_id).exclude(status=Promise.State.PENDING).exists()
    )


# How far back before its previous pass each pass of the sweep looks again. A satisfying row
# carries the time its transaction read (``now``), a little before it committed, and the
# workers' clocks may differ a little; an arrival committed later than this after its own
# timestamp is left to the run's re-check.
SWEEP_OVERLAP = timedelta(seconds=10)

# Run ids per statement when the sweep reads candidates through the ORM.
_CHUNK = 500


def missed_wake_candidates(since: datetime, now: datetime) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """(tenant, run) of every waiting run -- ``ready``, not due -- that received something since
    ``since`` (a child ended, a run it started detached ended, an unconsumed signal, a pending
    update, a reported task outcome, a settled promise) or has a cancellation request, across
    tenants. A superset of the runs to wake: :func:`wakeup_arrived` decides.

    On PostgreSQL through the definer function ``cleat.missed_wakes`` (row-level security
    hides other tenants' rows from the application role); elsewhere, where there is no such
    security, through the ORM, source by source."""
    sql = queries(connection).get("missed_wakes")
    if sql is not None:
        with connection.cursor() as cursor:
            cursor.execute(sql, [since, now])
            return [(uuid.UUID(str(t)), uuid.UUID(str(i))) for i, t in cursor.fetchall()]
    arrived: set[uuid.UUID] = set()
    sources: Iterable[Iterable[uuid.UUID | None]] = (
        WorkflowInstance.objects.filter(
            completed_at__gte=since, parent_id__isnull=False
        ).values_list("parent_id", flat=True),
        WorkflowInstance.objects.filter(
            completed_at__gte=since, detached_from__isnull=False
        ).values_list("detached_from", flat=True),
        Signal.objects.filter(created_at__gte=since, consumed_at__isnull=True).values_list(
            "instance_id", flat=True
        ),
        UpdateRequest.objects.filter(
            status=UpdateRequest.State.PENDING, created_at__gte=since
        ).values_list("instance_id", flat=True),
        TaskCall.objects.filter(state=TaskCall.State.REPORTED, reported_at__gte=since).values_list(
            "instance_id", flat=True
        ),
        Promise.objects.filter(settled_at__gte=since).values_list("instance_id", flat=True),
    )
    for source in sources:
        arrived.update(run_id for run_id in source if run_id is not None)
    waiting = WorkflowInstance.objects.filter(status=RunStatus.READY).filter(
        Q(next_wake_at__isnull=True) | Q(next_wake_at__gt=now)
    )
    found = set(waiting.filter(cancel_requested=True).values_list("tenant_id", "id"))
    ids = sorted(arrived)
    for start in range(0, len(ids), _CHUNK):
        found.update(
            waiting.filter(id__in=ids[start : start + _CHUNK]).values_list("tenant_id", "id")
        )
    return sorted(found)


def sweep_missed_wakes(since: datetime, now: datetime) -> int:
    """Wake the waiting runs whose wait something since ``since`` satisfies (the module
    docstring says when a wake-up is lost). Each run is judged in its tenant's context by
    :func:`wakeup_arrived` and woken by :func:`wake_now`; a run whose waiting state cannot be
    read (a malformed ``waiting_on``) is logged and passed over. Returns the runs woken."""
    woken = 0
    for tenant, run_id in missed_wake_candidates(since, now):
        try:
            with tenant_context(tenant):
                instance = (
                    WorkflowInstance.objects.filter(
                        id=run_id, tenant_id=tenant, status=RunStatus.READY
                    )
                    .only("id", "tenant_id", "next_wake_at", "waiting_on", "cancel_requested")
                    .first()
                )
                if instance is None or (
                    instance.next_wake_at is not None and instance.next_wake_at <= now
                ):
                    continue
                wait = instance.waiting_on if isinstance(instance.waiting_on, dict) else {}
                if not wakeup_arrived(instance, wait):
                    continue
        except DatabaseError:
            raise
        except Exception:
            log.exception("event=wake_sweep_error run=%s", run_id)
            continue
        if wake_now(tenant, run_id):
            woken += 1
            log.info("event=wake_swept run=%s tenant=%s", run_id, tenant)
    return woken


def _send_notify() -> bool:
    """Send the NOTIFY that wakes idle workers; False where the database has none."""
    statement = queries(connection).get("notify_wake")
    if statement is None:
        return False
    with connection.cursor() as cursor:
        cursor.execute(statement, [NOTIFY_CHANNEL])
    return True


def notify() -> None:
    """Wake idle workers (PostgreSQL LISTEN/NOTIFY); a no-op elsewhere (they poll)."""
    try:
        _send_notify()
    except Exception:
        log.debug("pg_notify failed", exc_info=True)


def notify_after_commit() -> None:
    """Wake idle workers once the current transaction commits.

    On PostgreSQL the NOTIFY is sent inside the transaction: the server delivers it when,
    and only if, the transaction commits, so the listener hears of the run in the commit's
    own round trip, without a second statement and a second commit after it. (A NOTIFY the
    server cannot queue -- its queue full behind a listener stuck in a transaction -- then
    fails the commit, where a NOTIFY after it failed alone.) Elsewhere, and outside a
    transaction, it is sent after the commit, or at once."""
    if connection.in_atomic_block and _send_notify():
        return
    transaction.on_commit(notify)


def ready_after_commit(
    tenant: uuid.UUID | str, instance_id: uuid.UUID | str, *, inserted: bool = False
) -> None:
    """A run made due now (started, resumed, retried): idle workers are told after the
    commit, and in broker dispatch the run is published (``workflows.dispatch``).

    ``inserted``: the run was inserted ready in this transaction. Where the insert itself
    wakes the workers (PostgreSQL's trigger, ``ready_insert_wakes`` in sql/postgresql.py),
    nothing more is sent for it."""
    if not (inserted and "ready_insert_wakes" in queries(connection)):
        notify_after_commit()
    dispatch.ready_after_commit(tenant, instance_id)
