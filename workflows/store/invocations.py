"""Delivery of the calls workflows hand to the host (``durable_send``,
``durable_schedule_invoke``): at least once, with the idempotency key of the step that
asked for them, even after the workflow has ended.

A due invocation is leased by pushing its ``deliver_at`` forward before the call, so a worker
that dies mid-call leaves it to be retried after the lease; a service that honours the key
turns that retry into the original outcome.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from django.db import connection, transaction

from engine.services import CallContext, Services
from engine.status import AbiStatus
from workflows.models import Invocation
from workflows.store.sql import queries
from workflows.tenancy import tenant_context

log = logging.getLogger("cleat.worker")

LEASE = timedelta(seconds=60)
MAX_ATTEMPTS = 20


def claim_due(now: datetime, limit: int) -> list[tuple[str, uuid.UUID]]:
    until = now + LEASE
    sql = queries(connection)
    if "claim_invocations" in sql:
        with connection.cursor() as cursor:
            cursor.execute(sql["claim_invocations"], [now, limit, until])
            return [(str(i), uuid.UUID(str(t))) for i, t in cursor.fetchall()]
    with transaction.atomic():
        rows = list(
            Invocation.objects.select_for_update(
                skip_locked=connection.features.has_select_for_update_skip_locked
            )
            .filter(status=Invocation.State.PENDING, deliver_at__lte=now, tenant__is_active=True)
            .order_by("deliver_at")
            .values_list("id", "tenant_id")[:limit]
        )
        Invocation.objects.filter(id__in=[r[0] for r in rows]).update(deliver_at=until)
    return [(str(i), t) for i, t in rows]


def deliver(invocation_id: str, tenant: uuid.UUID, services: Services, now: datetime) -> str:
    """Make the call; record delivered, failed (permanent) or due again with backoff."""
    with tenant_context(tenant):
        row = Invocation.objects.filter(id=invocation_id, status=Invocation.State.PENDING).first()
    if row is None:
        return "gone"
    context = CallContext(
        tenant_id=str(tenant),
        workflow_id="",
        run_id=str(row.instance_id or ""),
        step=-1,
        service=row.service,
        operation=row.operation,
        idempotency_key=row.idempotency_key,
        attempt=row.attempts + 1,
    )
    try:
        result = services.caller.call(row.service, row.operation, row.request, context)
    except Exception as exc:  # a caller must not take the worker down
        result = None
        error = f"{type(exc).__name__}: {exc}"
    else:
        error = result.payload if result.status != AbiStatus.OK else ""
    with tenant_context(tenant):
        row.attempts += 1
        if result is not None and result.status == AbiStatus.OK:
            row.status, row.delivered_at, row.last_error = Invocation.State.DELIVERED, now, ""
        elif (
            result is not None and result.status == AbiStatus.PERMANENT
        ) or row.attempts >= MAX_ATTEMPTS:
            row.status, row.last_error = Invocation.State.FAILED, error
        else:
            row.last_error = error
            row.deliver_at = now + timedelta(seconds=min(300, 2**row.attempts))
        row.save(update_fields=["attempts", "status", "delivered_at", "last_error", "deliver_at"])
    log.info(
        "event=invocation id=%s service=%s.%s status=%s attempts=%d",
        row.id,
        row.service,
        row.operation,
        row.status,
        row.attempts,
    )
    return row.status
