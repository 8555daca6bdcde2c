"""Making waiting runs due, and telling idle workers there is work.

A run that waits (for a signal, a child, a promise) has ``next_wake_at`` NULL or in the
future. Whatever satisfies the wait makes it due: ``next_wake_at = now`` if it is ``ready``.
That is done after the satisfying transaction commits, in a short transaction of its own, so
no transaction ever holds two runs' row locks (no deadlocks between runs signalling each
other). If the process dies between the two, the run's periodic re-check
(``CLEAT_WAIT_RECHECK_SECONDS``) still finds it.

Ordering argument for the race with a finalizing run: the finalize holds the run's row lock
while it looks for wake-ups that arrived during the segment; a wake issued after the
satisfying commit either sees the finalize's ``ready`` (and wakes it) or waits for the lock
and then does; a satisfying commit that happened before the finalize's look is seen by it.
"""

from __future__ import annotations

import logging
import uuid

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from workflows.models import RunStatus, WorkflowInstance
from workflows.store.sql import queries
from workflows.tenancy import tenant_context

log = logging.getLogger("cleat.store")

NOTIFY_CHANNEL = "cleat_wake"


def wake_now(
    tenant: uuid.UUID, instance_id: uuid.UUID | str, *, through_finalize: bool = False
) -> bool:
    """Make a ready run due now. Returns whether it was waiting.

    ``through_finalize``: when the run is not ``ready`` yet, wait for a finalize in flight
    (its row lock) and try once more. Without it the wake is lost in one interleaving: the
    finalize locked the row and looked for wake-ups before the satisfying commit, and this
    UPDATE, reading the committed ``running`` row, matches nothing without waiting for the
    lock (PostgreSQL re-checks a locked row only when its visible version matched); the run
    then sleeps until its recheck. Task outcomes, which often arrive while the segment that
    sent the task is finalizing, use it."""
    now = timezone.now()
    with tenant_context(tenant):
        woken = (
            WorkflowInstance.objects.filter(
                id=instance_id, tenant_id=tenant, status=RunStatus.READY
            )
            .filter(Q(next_wake_at__isnull=True) | Q(next_wake_at__gt=now))
            .update(next_wake_at=now)
        )
    if not woken and through_finalize:
        with tenant_context(tenant):
            status = (
                WorkflowInstance.objects.select_for_update(
                    no_key=connection.features.has_select_for_no_key_update
                )
                .filter(id=instance_id, tenant_id=tenant)
                .values_list("status", flat=True)
                .first()
            )
        if status == RunStatus.READY:
            return wake_now(tenant, instance_id)
    if woken:
        notify()
    return bool(woken)


def after_commit(tenant: uuid.UUID, instance_id: uuid.UUID | str) -> None:
    def run() -> None:
        try:
            wake_now(tenant, instance_id)
        except Exception:  # the periodic re-check recovers a missed wake
            log.exception("could not wake run %s", instance_id)

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
