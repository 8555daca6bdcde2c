"""Making waiting runs due, and telling idle workers there is work.

A run that waits (for a signal, a child, a promise) has ``next_wake_at`` NULL or in the
future. Whatever satisfies the wait makes it due: ``next_wake_at = now`` if it is ``ready``.
That is done after the satisfying transaction commits, in a short transaction of its own, so
no transaction ever holds two runs' row locks (no deadlocks between runs signalling each
other). If the process dies between the two, the run's periodic re-check
(``CLEAT_WAIT_RECHECK_SECONDS``) still finds it.

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

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from workflows import dispatch
from workflows.models import RunStatus, WorkflowInstance
from workflows.store.sql import queries
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


def notify() -> None:
    """Wake idle workers (PostgreSQL LISTEN/NOTIFY); a no-op elsewhere (they poll)."""
    statement = queries(connection).get("notify_wake")
    if statement is None:
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute(statement, [NOTIFY_CHANNEL])
    except Exception:
        log.debug("pg_notify failed", exc_info=True)


def notify_after_commit() -> None:
    transaction.on_commit(notify)


def ready_after_commit(tenant: uuid.UUID | str, instance_id: uuid.UUID | str) -> None:
    """A run made due now (started, resumed, retried): idle workers are told after the
    commit, and in broker dispatch the run is published (``workflows.dispatch``)."""
    notify_after_commit()
    dispatch.ready_after_commit(tenant, instance_id)
