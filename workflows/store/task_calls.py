"""Task calls in the database: the outcome a task's worker reports (the Celery hook, the
callback endpoint), and the records a run leaves when it ends from outside.

:func:`report_outcome` applies the one rule of :func:`engine.task_calls.disposition`: the
outcome of a call the run still waits for is recorded and wakes the run (after commit, in
its own short transaction, like a signal: see ``wake.py``); a duplicate (the task ran
again after its worker died) records nothing twice; an outcome for a call the run no
longer waits for (it timed out, was cancelled, the run ended) is dropped and logged; one
without the call's token is refused.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Callable
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from engine.faults import crash_point
from engine.task_calls import Disposition, disposition
from workflows.crypto import seal_column
from workflows.models import TERMINAL_STATUSES, TaskCall, WorkflowInstance
from workflows.store import wake
from workflows.tenancy import tenant_context

log = logging.getLogger("cleat.tasks")

# Called with (service, task id) for each task call a run abandoned when it ended from
# outside (terminate, force-complete, force-fail): the Celery integration revokes the task.
abandon_hooks: list[Callable[[str, str], None]] = []


def report_outcome(
    tenant: uuid.UUID | str,
    task_id: str,
    token: str,
    status: int,
    payload: str,
    now: datetime | None = None,
) -> Disposition:
    """Record what a task call's task came to (an ABI status, the result's JSON or the
    error message). Returns what became of it; never raises for a stale or forged report."""
    now = now or timezone.now()
    try:
        tenant_id = uuid.UUID(str(tenant))
        call_id = uuid.UUID(str(task_id))
    except ValueError:
        log.warning("event=task_outcome_refused task=%s reason=malformed ids", task_id)
        return Disposition.REFUSED
    with tenant_context(tenant_id), transaction.atomic():
        row = (
            TaskCall.objects.select_for_update()
            .filter(id=call_id, tenant_id=tenant_id)
            .values_list("instance_id", "state", "token", "status", "step")
            .first()
        )
        if row is None:
            verdict = disposition(None, False, had_outcome=False, run_ended=False)
            instance_id, state, step = None, None, 0
        else:
            instance_id, state, expected, reported, step = row
            run_status = (
                WorkflowInstance.objects.filter(id=instance_id)
                .values_list("status", flat=True)
                .first()
            )
            verdict = disposition(
                state,
                secrets.compare_digest(expected, token),
                had_outcome=reported is not None,
                run_ended=run_status is None or run_status in TERMINAL_STATUSES,
            )
        if verdict is Disposition.RECORDED:
            TaskCall.objects.filter(id=call_id).update(
                state=TaskCall.State.REPORTED,
                status=int(status),
                payload=seal_column(TaskCall, "payload", tenant_id, (instance_id, step), payload),
                reported_at=now,
            )
    if verdict is Disposition.RECORDED:
        assert instance_id is not None
        crash_point("before_wake")  # the outcome committed, the run not yet woken
        woke = wake.wake_now(tenant_id, instance_id)
        log.info(
            "event=task_outcome task=%s run=%s status=%d woke=%s",
            task_id,
            instance_id,
            status,
            woke,
        )
    elif verdict is Disposition.DUPLICATE:
        # The first report's process may have died between its commit and its wake-up
        # (the reason the task ran again): wake the run if it still has to take it.
        woke = state == TaskCall.State.REPORTED and wake.wake_now(tenant_id, instance_id)
        log.info("event=task_outcome_duplicate task=%s run=%s woke=%s", task_id, instance_id, woke)
    elif verdict is Disposition.STALE:
        log.warning(
            "event=task_outcome_stale task=%s run=%s (the run no longer waits for it: dropped)",
            task_id,
            instance_id,
        )
    else:
        log.warning("event=task_outcome_refused task=%s reason=token mismatch", task_id)
    return verdict


def abandon(instance: WorkflowInstance) -> None:
    """The run ended from outside while task calls were out: close their records (a later
    outcome is stale) and, after commit, tell the abandon hooks (revoke the tasks)."""
    pending = list(
        TaskCall.objects.filter(instance_id=instance.id, state=TaskCall.State.PENDING).values_list(
            "id", "service"
        )
    )
    if not pending:
        return
    TaskCall.objects.filter(id__in=[p[0] for p in pending]).update(state=TaskCall.State.ABANDONED)

    def revoke() -> None:
        for task_id, service in pending:
            for hook in abandon_hooks:
                try:
                    hook(service, str(task_id))
                except Exception:
                    log.exception("could not revoke task %s", task_id)

    transaction.on_commit(revoke)
