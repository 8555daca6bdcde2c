"""The operations clients and operators perform on workflows. The REST API, the admin and the
management commands all call these; nothing durable happens anywhere else.

Every function takes the tenant explicitly and runs in its tenant context. Errors are
:class:`ServiceError` subclasses carrying a stable ``code``, the HTTP status the API maps them
to, and (for bad input) the offending ``field``.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from engine import lifecycle
from engine.compaction import CompactionCorrupt
from engine.errors import ErrorCode
from engine.events import AdminActionEvent, encode
from engine.policies import external_signal_refusal
from engine.recorded import RecordedRun
from engine.storable import json_text_fault
from engine.versions import move_refusal
from workflows import tracing
from workflows.models import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    TERMINAL_STATUSES,
    AuditLog,
    Promise,
    RunStatus,
    Signal,
    Tenant,
    UpdateRequest,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
    name_validator,
)
from workflows.policies import require_signal_auth
from workflows.store import wake
from workflows.store.columns import create_run
from workflows.store.lifecycle import (
    close_instance,
    forget_failed_call,
    plan_retry,
    retake_locks,
    terminate_instance,
)
from workflows.tenancy import tenant_context

MAX_PAYLOAD_BYTES = 1024 * 1024


class ServiceError(Exception):
    code = "error"
    http_status = 400

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(ServiceError):
    code = "invalid"
    http_status = 400


class NotFound(ServiceError):
    code = "not_found"
    http_status = 404


class Conflict(ServiceError):
    """A stale generation, or a transition the run's status does not allow."""

    code = "conflict"
    http_status = 409


class HistoryUnreadable(ServiceError):
    """The run's compaction checkpoint does not read back (a damaged or altered row)."""

    code = "history_corrupt"
    http_status = 409


class Forbidden(ServiceError):
    """A policy refuses the caller (signal authorization). ``audit`` is the refusal's audit
    row, which the caller keeps with :func:`keep_refusal_audit` once the refused request's
    transaction has rolled back (the API and the console do)."""

    code = "denied"
    http_status = 403

    def __init__(
        self, message: str, field: str | None = None, audit: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, field)
        self.audit = audit


def keep_refusal_audit(tenant: Tenant, exc: Exception) -> None:
    """Write the audit row a refusal carries, in a transaction of its own (call it after
    the refused request's transaction rolled back)."""
    audit = getattr(exc, "audit", None)
    if not audit:
        return
    with tenant_context(tenant.id):
        AuditLog.objects.create(tenant=tenant, **audit)


class QuotaExceeded(ServiceError):
    """One more would break a quota (engine/policies.py); the message names it."""

    code = "quota_exceeded"
    http_status = 409


class PayloadTooLarge(ServiceError):
    code = "payload_too_large"
    http_status = 413


# --- helpers -------------------------------------------------------------------------------------


def get_tenant(name_or_id: str | uuid.UUID | Tenant) -> Tenant:
    if isinstance(name_or_id, Tenant):
        return name_or_id
    text = str(name_or_id)
    try:
        found = Tenant.objects.filter(id=uuid.UUID(text)).first()
    except ValueError:
        found = Tenant.objects.filter(name=text).first()
    if found is None:
        raise NotFound(f"unknown tenant {text!r}", field="tenant")
    if not found.is_active:
        raise Conflict(f"tenant {found.name!r} is deactivated", field="tenant")
    return found


def json_text(value: Any, field: str) -> str:
    """A JSON document as text: strings must parse, other values are serialised. Either way
    the document must be storable (``engine.storable``: no lone surrogate)."""
    if value is None:
        return "null"
    if isinstance(value, bytes | bytearray):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError as exc:
            raise InvalidInput(
                f"{field} is not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})",
                field,
            ) from None
        except RecursionError:
            raise InvalidInput(f"{field} is nested too deeply to be read", field) from None
        text = value
    else:
        try:
            text = json.dumps(value, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"{field} cannot be represented as JSON: {exc}", field) from None
        except RecursionError:
            raise InvalidInput(f"{field} is nested too deeply to be stored", field) from None
    fault = json_text_fault(text)
    if fault is not None:
        raise InvalidInput(f"{field} {fault}", field)
    if len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(f"{field} is larger than {MAX_PAYLOAD_BYTES} bytes", field)
    return text


def check_name(value: str, field: str) -> None:
    """Refuse a workflow, schedule or tag name that breaks :data:`workflows.models.NAME_PATTERN`."""
    try:
        name_validator(value)
    except ValidationError:
        raise InvalidInput(
            f"{field} {value!r} is not a valid name: {name_validator.message}", field
        ) from None


def get_instance(
    tenant: Tenant, run_id: str | uuid.UUID, *, lock: bool = False
) -> WorkflowInstance:
    try:
        run_uuid = uuid.UUID(str(run_id))
    except ValueError:
        raise NotFound(f"no workflow run {run_id!r}", field="run_id") from None
    query = WorkflowInstance.objects.filter(tenant_id=tenant.id, id=run_uuid)
    if lock:
        query = query.select_for_update()
    found = query.first()
    if found is None:
        raise NotFound(f"no workflow run {run_id}", field="run_id")
    return found


# --- runs ---


def start_workflow(
    tenant: Tenant,
    name: str,
    input: Any = None,
    *,
    version: int | None = None,
    tag: str | None = None,
    idempotency_key: str | None = None,
    priority: int = 0,
    task_queue: str = "default",
    workflow_id: str | None = None,
    entry_point: str = "run",
    max_priority: int = PRIORITY_MAX,
    traceparent: str | None = None,
) -> tuple[WorkflowInstance, bool]:
    """Start a run. A repeated ``idempotency_key`` returns the existing run (created=False).
    ``max_priority`` is the caller's ceiling (an API key's role: :func:`priority_ceiling`).
    With tracing on, the run joins the caller's trace: ``traceparent`` (a W3C header value;
    a malformed one is ignored), else the current span, else a new trace (workflows.tracing)."""
    text = json_text(input, "input")
    check_priority(priority, max_priority)
    if idempotency_key is not None and not (0 < len(idempotency_key) <= 255):
        raise InvalidInput("idempotency_key must be 1-255 characters", "idempotency_key")
    if not task_queue or len(task_queue) > 64:
        raise InvalidInput("task_queue must be 1-64 characters", "task_queue")
    if workflow_id is not None and not (0 < len(workflow_id) <= 128):
        raise InvalidInput("workflow_id must be 1-128 characters", "workflow_id")
    # Imported here: definitions raises this module's errors, so it imports this module.
    from workflows.definitions import resolve_definition

    with tenant_context(tenant.id):
        if idempotency_key:
            existing = _unexpired_start(tenant, idempotency_key)
            if existing is not None:
                return existing, False
        definition = resolve_definition(tenant, name, version=version, tag=tag)
        if entry_point not in (definition.entry_points or []):
            raise InvalidInput(
                f"{definition} has no entry point {entry_point!r} "
                f"(it exports: {', '.join(definition.entry_points)})",
                "entry_point",
            )
        run_id = uuid.uuid4()
        attributes = {
            "cleat.tenant": str(tenant.id),
            "cleat.run_id": str(run_id),
            "cleat.definition": definition.name,
            "cleat.version": definition.version,
        }
        # Only a start with a key can collide (the key's unique constraint): it alone needs a
        # savepoint to read the winner after the conflict. Without one a start is the insert
        # and the commit, two round trips fewer; an error then ends the start as it is.
        try:
            with (
                tracing.start_span(traceparent, attributes) as span,
                transaction.atomic() if idempotency_key else contextlib.nullcontext(),
            ):
                instance = create_run(
                    id=run_id,
                    tenant=tenant,
                    workflow_id=workflow_id or str(run_id),
                    definition=definition,
                    definition_name=definition.name,
                    definition_version=definition.version,
                    entry_point=entry_point,
                    input=text,
                    priority=priority,
                    task_queue=task_queue,
                    start_idempotency_key=idempotency_key,
                    **tracing.stored_context(span),
                )
        except IntegrityError:
            if not idempotency_key:
                raise
            existing = WorkflowInstance.objects.filter(
                tenant_id=tenant.id, start_idempotency_key=idempotency_key
            ).first()
            if existing is None:
                raise
            return existing, False
        wake.ready_after_commit(tenant.id, instance.id, inserted=True)
    return instance, True


def _unexpired_start(tenant: Tenant, key: str) -> WorkflowInstance | None:
    """The run started with ``key``, unless the key has outlived its time to live (the
    retention policy's start keys, workflows/retention.py): an expired key is cleared here,
    as the purge would, and the start goes ahead as a new run."""
    from workflows.retention import start_key_cutoff

    existing = (
        WorkflowInstance.objects.select_for_update()
        .filter(tenant_id=tenant.id, start_idempotency_key=key)
        .first()
    )
    if existing is None:
        return None
    cutoff = start_key_cutoff(tenant.id, existing.definition_name, timezone.now())
    if cutoff is None or existing.created_at >= cutoff:
        return existing
    WorkflowInstance.objects.filter(id=existing.id).update(start_idempotency_key=None)
    return None


def priority_ceiling(role: str) -> int:
    """The highest priority a caller of ``role`` may give a run (CLEAT_PRIORITY_MAX_BY_ROLE;
    a role it does not name gets the default priority, 0, at most)."""
    ceilings = getattr(settings, "CLEAT_PRIORITY_MAX_BY_ROLE", None) or {}
    return min(PRIORITY_MAX, int(ceilings.get(str(role), 0)))


def check_priority(priority: Any, max_priority: int = PRIORITY_MAX) -> None:
    """Priorities order a tenant's own runs within -100..100, up to the caller's ceiling."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidInput("priority must be an integer", "priority")
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise InvalidInput(
            f"priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}, not {priority}",
            "priority",
        )
    if priority > max_priority:
        raise InvalidInput(
            f"priority {priority} is above the {max_priority} these credentials may give",
            "priority",
        )


def signal_workflow(
    tenant: Tenant,
    run_id: str,
    name: str,
    payload: Any = None,
    *,
    operator: str | None = None,
    reason: str = "",
    permitted: bool = True,
    caller: str = "",
) -> Signal:
    """Deliver a signal. Sent by an operator (``operator`` given), it is also audited.

    With signal authorization on (``CLEAT_REQUIRE_SIGNAL_AUTH``) the sender -- ``caller``,
    an API key or a console user -- needs the permission to signal (``permitted``: the
    key's ``may_signal``, the user's ``workflows.signal_workflowinstance``); the command
    line, which holds the database's credentials, is always permitted. A refusal is
    Forbidden (403) carrying its audit row (:func:`keep_refusal_audit`)."""
    if not name or len(name) > 256:
        raise InvalidInput("signal name must be 1-256 characters", "name")
    text = json_text(payload, "payload")
    refusal = external_signal_refusal(
        require_auth=require_signal_auth(), permitted=permitted, who=caller or "the caller"
    )
    if refusal is not None:
        with tenant_context(tenant.id):
            instance = get_instance(tenant, run_id)
        audit = {
            "instance_id": instance.id,
            "action": "signal_denied",
            "operator": caller or "api",
            "reason": refusal,
            "detail": {"signal": name},
        }
        raise Forbidden(refusal, "name", audit=audit)
    with tenant_context(tenant.id):
        instance = get_instance(tenant, run_id, lock=True)
        if instance.is_terminal:
            raise Conflict(
                f"run {run_id} is {instance.status}; it cannot receive signals", "run_id"
            )
        if instance.allowed_signals is not None and name not in instance.allowed_signals:
            raise Conflict(f"run {run_id} does not accept signal {name!r}", "name")
        signal = Signal.objects.create(
            tenant=tenant, instance=instance, name=name, payload=text, sender=operator or "api"
        )
        if operator is not None:
            AuditLog.record(tenant, "signal", operator, reason, instance=instance, name=name)
        wake.after_commit(tenant.id, instance.id)
    return signal


def _audit(
    tenant: Tenant,
    instance: WorkflowInstance,
    action: str,
    operator: str,
    reason: str,
    detail: dict[str, Any] | None = None,
) -> None:
    """The audit row and an ``admin_action`` event in the run's history, in the caller's
    transaction (so they exist exactly when the change does)."""
    AuditLog.record(tenant, action, operator, reason, instance=instance, **(detail or {}))
    step = instance.event_count
    stored = encode(
        AdminActionEvent(
            step=step, ts=int(time.time() * 1000), action=action, operator=operator, reason=reason
        )
    )
    WorkflowEvent.objects.create(
        tenant=tenant,
        instance=instance,
        step=step,
        type_code=stored.type_code,
        payload=stored.payload,
        timestamp_ms=stored.ts,
        checksum=stored.checksum,
    )
    WorkflowInstance.objects.filter(id=instance.id).update(event_count=F("event_count") + 1)


def _check_generation(instance: WorkflowInstance, generation: int | None) -> None:
    if generation is not None and generation != instance.generation:
        raise Conflict(
            f"run {instance.id} is at generation {instance.generation}, not {generation}; "
            "reload it and try again",
            "generation",
        )


def _refuse_close(action: str, instance: WorkflowInstance) -> None:
    """A Conflict when the run's status does not allow ``action`` (the lifecycle's rule)."""
    refusal = lifecycle.close_refusal(action, instance.status)
    if refusal is not None:
        raise Conflict(f"run {instance.id} is {refusal}", "run_id")


def cancel_workflow(
    tenant: Tenant, run_id: str, reason: str = "", operator: str = "api"
) -> WorkflowInstance:
    with tenant_context(tenant.id):
        instance = get_instance(tenant, run_id, lock=True)
        _refuse_close("cancel", instance)
        instance.cancel_requested = True
        instance.cancel_reason = reason or f"cancelled by {operator}"
        instance.save(update_fields=["cancel_requested", "cancel_reason", "updated_at"])
        AuditLog.record(tenant, "cancel", operator, reason, instance=instance)
        wake.after_commit(tenant.id, instance.id)
    return instance


def terminate_workflow(
    tenant: Tenant, run_id: str, reason: str = "", operator: str = "api"
) -> WorkflowInstance:
    with tenant_context(tenant.id):
        instance = get_instance(tenant, run_id, lock=True)
        _refuse_close("terminate", instance)
        _audit(tenant, instance, "terminate", operator, reason)
        terminate_instance(instance, reason or f"terminated by {operator}", timezone.now())
    return instance


def pause_workflow(
    tenant: Tenant, run_id: str, operator: str = "api", reason: str = ""
) -> WorkflowInstance:
    with tenant_context(tenant.id):
        instance = get_instance(tenant, run_id, lock=True)
        if instance.status != RunStatus.READY:
            raise Conflict(
                f"only a ready run can be paused; {run_id} is {instance.status}", "run_id"
            )
        instance.paused_from, instance.status = instance.status, RunStatus.PAUSED
        instance.paused_by_deactivation = False  # the operator's: reactivation leaves it
        instance.save(
            update_fields=["status", "paused_from", "paused_by_deactivation", "updated_at"]
        )
        # Ready, so no worker holds it: the history can take an annotation (replay skips it).
        _audit(tenant, instance, "pause", operator, reason)
    return instance


def resume_workflow(
    tenant: Tenant, run_id: str, operator: str = "api", reason: str = ""
) -> WorkflowInstance:
    with tenant_context(tenant.id):
        instance = get_instance(tenant, run_id, lock=True)
        if instance.status != RunStatus.PAUSED:
            raise Conflict(f"run {run_id} is not paused (it is {instance.status})", "run_id")
        instance.status, instance.paused_from = RunStatus.READY, None
        instance.paused_by_deactivation = False
        instance.next_wake_at = timezone.now()
        instance.save(
            update_fields=[
                "status",
                "paused_from",
                "paused_by_deactivation",
                "next_wake_at",
                "updated_at",
            ]
        )
        _audit(tenant, instance, "resume", operator, reason)
        wake.ready_after_commit(tenant.id, instance.id)
    return instance


def retry_workflow(
    tenant: Tenant,
    run_id: str,
    operator: str = "api",
    reason: str = "",
    mode: str = lifecycle.RETRY_REPLAY,
) -> WorkflowInstance:
    """Move a dead-lettered (or failed) run back to ready; it replays its history.

    ``mode`` (``engine.lifecycle.RETRY_MODES``): ``replay`` makes again only a last call that
    failed retryably; ``reexecute_last_call`` makes again a last call that failed in any way
    (a service configured wrongly, since fixed). What the retry does is on the returned
    instance as ``retry_plan`` (an ``engine.lifecycle.RetryPlan``) and in the audit row."""
    if mode not in lifecycle.RETRY_MODES:
        raise InvalidInput(
            f"mode must be one of {', '.join(lifecycle.RETRY_MODES)}, not {mode!r}", "mode"
        )
    with tenant_context(tenant.id):
        instance = get_instance(tenant, run_id, lock=True)
        if instance.status not in (RunStatus.DEAD_LETTERED, RunStatus.FAILED):
            raise Conflict(
                f"only failed or dead-lettered runs can be retried; {run_id} is {instance.status}",
                "run_id",
            )
        _refuse_purging(instance)
        plan = plan_retry(instance, mode)
        refusal = retake_locks(instance, timezone.now())
        if refusal is not None:
            raise Conflict(refusal, "run_id")
        forgotten = forget_failed_call(instance, mode)
        _audit(
            tenant,
            instance,
            "retry",
            operator,
            reason,
            {
                "error_code": instance.error_code,
                "mode": mode,
                "forgotten_step": forgotten,
                "effect": plan.effect,
            },
        )
        _reopen(instance)
    instance.retry_plan = plan  # type: ignore[attr-defined]
    return instance


def retry_plan(
    tenant: Tenant, run_id: str, mode: str = lifecycle.RETRY_REPLAY
) -> lifecycle.RetryPlan:
    """What :func:`retry_workflow` in ``mode`` would do to the run now (nothing changes)."""
    if mode not in lifecycle.RETRY_MODES:
        raise InvalidInput(
            f"mode must be one of {', '.join(lifecycle.RETRY_MODES)}, not {mode!r}", "mode"
        )
    with tenant_context(tenant.id):
        return plan_retry(get_instance(tenant, run_id), mode)


def _refuse_purging(instance: WorkflowInstance) -> None:
    """A run the retention purge is deleting (or the child of one) cannot be reopened: its
    history is being deleted. The parent's row is locked, so a purge deciding whether the
    parent may go (workflows/retention.py) sees this child reopened, or this sees the mark."""
    if instance.purge_batch is not None:
        raise Conflict(f"run {instance.id} is being deleted by the retention purge", "run_id")
    if instance.parent_id is not None:
        parent_batch = (
            WorkflowInstance.objects.select_for_update()
            .filter(id=instance.parent_id)
            .values_list("purge_batch", flat=True)
            .first()
        )
        if parent_batch is not None:
            raise Conflict(
                f"run {instance.id}'s parent {instance.parent_id} is being deleted by the "
                "retention purge",
                "run_id",
            )


def _reopen(instance: WorkflowInstance) -> None:
    WorkflowInstance.objects.filter(id=instance.id).update(
        status=RunStatus.READY,
        error=None,
        error_code=None,
        assigned_to=None,
        attempt=1,
        completed_at=None,
        next_wake_at=timezone.now(),
        generation=F("generation") + 1,
        waiting_on=None,
    )
    instance.refresh_from_db()
    wake.ready_after_commit(instance.tenant_id, instance.id)


def force_complete(
    tenant: Tenant,
    run_id: str,
    generation: int | None,
    result: Any,
    operator: str,
    reason: str = "",
) -> WorkflowInstance:
    text = json_text(result, "result")
    with tenant_context(tenant.id):
        instance = get_instance(tenant, run_id, lock=True)
        _check_generation(instance, generation)
        _refuse_close("force_complete", instance)
        _audit(tenant, instance, "force_complete", operator, reason)
        close_instance(
            instance,
            "force_complete",
            lifecycle.force_complete(instance.workflow_id, text),
            timezone.now(),
        )
    return instance


def force_fail(
    tenant: Tenant,
    run_id: str,
    generation: int | None,
    message: str,
    code: str = "error",
    operator: str = "api",
    reason: str = "",
) -> WorkflowInstance:
    if not message:
        raise InvalidInput("an error message is required", "message")
    if code not in {c.value for c in ErrorCode}:
        raise InvalidInput(f"unknown error code {code!r}", "code")
    with tenant_context(tenant.id):
        instance = get_instance(tenant, run_id, lock=True)
        _check_generation(instance, generation)
        _refuse_close("force_fail", instance)
        _audit(tenant, instance, "force_fail", operator, reason, {"code": code})
        close_instance(
            instance,
            "force_fail",
            lifecycle.force_fail(instance.workflow_id, message, code),
            timezone.now(),
        )
    return instance


def re_replay(
    tenant: Tenant, run_id: str, generation: int | None, operator: str, reason: str = ""
) -> WorkflowInstance:
    """Reset a run to ready so a worker re-executes it from its existing history."""
    with tenant_context(tenant.id):
        instance = get_instance(tenant, run_id, lock=True)
        _check_generation(instance, generation)
        if instance.status in (RunStatus.RUNNING, RunStatus.PAUSED):
            raise Conflict(
                f"run {run_id} is {instance.status}; re-replay needs a settled run", "run_id"
            )
        _refuse_purging(instance)
        refusal = retake_locks(instance, timezone.now())  # as a retry: the replay holds them
        if refusal is not None:
            raise Conflict(refusal, "run_id")
        _audit(tenant, instance, "re_replay", operator, reason)
        _reopen(instance)
    return instance


def export_history(tenant: Tenant, run_id: str) -> RecordedRun:
    """A run's history and what replaying it needs, as ``engine.recorded`` defines the
    document (``manage.py export_history``, ``GET /api/v1/workflows/{id}/history``); replay it
    against a new build with ``engine.testing.replay``."""
    with tenant_context(tenant.id):
        instance = get_instance(tenant, run_id)
        definition = instance.definition
        try:
            history = WorkflowEvent.history(
                tenant.id, instance.id, checkpoint=instance.compaction_state
            )
        except CompactionCorrupt as exc:
            raise HistoryUnreadable(f"run {run_id}'s history cannot be exported: {exc}") from None
        return RecordedRun(
            definition=instance.definition_name,
            version=instance.definition_version,
            workflow_id=instance.workflow_id,
            run_id=str(instance.id),
            input=instance.input,
            start_ms=instance.start_ms,
            history=tuple(history),
            entry_point=instance.entry_point,
            min_version=definition.min_version,
            status=instance.status,
            result=instance.result,
            error=instance.error,
            error_code=instance.error_code,
            compacted_events=instance.compacted_events,
        )


def move_to_version(
    tenant: Tenant,
    run_id: str,
    version: Any,
    operator: str = "api",
    reason: str = "",
    generation: int | None = None,
) -> WorkflowInstance:
    """An operator's "move to version N": a waiting, paused or dead-lettered run replays its
    history on another deployed version of its definition from its next segment on.
    Refused -- nothing changes -- for a running or finished run (Conflict), a version that
    is not deployed (NotFound), and one that cannot take the run over (Conflict with the
    first incompatibility, :func:`engine.versions.move_refusal`)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidInput("version must be a positive integer", "version")
    with tenant_context(tenant.id):
        instance = get_instance(tenant, run_id, lock=True)
        _check_generation(instance, generation)
        refused = lifecycle.move_refusal_by_status(instance.status)
        if refused is not None:
            raise Conflict(f"run {run_id} is {refused}", "run_id")
        target = (
            WorkflowDefinition.objects.filter(
                tenant_id=tenant.id, name=instance.definition_name, version=version
            )
            .defer("wasm")
            .first()
        )
        current = WorkflowDefinition.objects.defer("wasm").get(id=instance.definition_id)
        refusal = move_refusal(
            instance.definition_name,
            current.deployed_version,
            target.deployed_version if target is not None else None,
            version,
            entry_point=instance.entry_point,
        )
        if refusal is not None:
            code, message = refusal
            if code == ErrorCode.NOT_FOUND:
                raise NotFound(message, "version")
            raise Conflict(message, "version")
        assert target is not None
        _audit(
            tenant,
            instance,
            "move_to_version",
            operator,
            reason,
            {"from_version": instance.definition_version, "to_version": version},
        )
        WorkflowInstance.objects.filter(id=instance.id).update(
            definition=target, definition_version=version
        )
        instance.refresh_from_db()
    return instance


# --- tenants ------------------------------------------------------------------------------------

# Runs a deactivation pauses: everything not ended, whatever it waits for.
_PAUSABLE = (RunStatus.READY, RunStatus.RUNNING)


def deactivate_tenant(tenant: Tenant, operator: str, reason: str = "") -> int:
    """Deactivate a tenant: its API keys and console stop working (they check the flag), its
    schedules stop firing and its invocations stop being delivered (their due reads skip
    inactive tenants), and every ready or running run is paused -- a running one is fenced
    out of its worker (generation bump), so its segment writes nothing more and calls no
    further service. Claims never hand out a run of an inactive tenant either, so a run
    started in the meantime (a child) waits too. Returns how many runs were paused."""
    tenant = Tenant.objects.get(id=tenant.id)  # the current flag, not the caller's copy
    if not tenant.is_active:
        raise Conflict(f"tenant {tenant.name!r} is already deactivated", "tenant")
    now = timezone.now()
    with tenant_context(tenant.id):
        Tenant.objects.filter(id=tenant.id).update(is_active=False)
        runs = WorkflowInstance.objects.filter(tenant_id=tenant.id, status__in=_PAUSABLE)
        paused = runs.update(
            paused_from=RunStatus.READY,
            status=RunStatus.PAUSED,
            paused_by_deactivation=True,
            assigned_to=None,
            generation=F("generation") + 1,
            updated_at=now,
        )
        AuditLog.record(tenant, "deactivate_tenant", operator, reason, paused_runs=paused)
    return paused


def reactivate_tenant(tenant: Tenant, operator: str, reason: str = "") -> int:
    """Reactivate a tenant: the runs its deactivation paused are ready and due again (a run
    an operator paused stays paused); schedules fire again from their next instant (under
    their misfire policy). Returns how many runs were resumed."""
    tenant = Tenant.objects.get(id=tenant.id)
    if tenant.is_active:
        raise Conflict(f"tenant {tenant.name!r} is active", "tenant")
    now = timezone.now()
    with tenant_context(tenant.id):
        Tenant.objects.filter(id=tenant.id).update(is_active=True)
        resumed = WorkflowInstance.objects.filter(
            tenant_id=tenant.id, status=RunStatus.PAUSED, paused_by_deactivation=True
        ).update(
            status=RunStatus.READY,
            paused_from=None,
            paused_by_deactivation=False,
            next_wake_at=now,
            updated_at=now,
        )
        AuditLog.record(tenant, "reactivate_tenant", operator, reason, resumed_runs=resumed)
        wake.notify_after_commit()
    return resumed


def settle_promise(
    tenant: Tenant, promise_id: str, *, value: Any = None, error: str = "", reject: bool = False
) -> Promise:
    from engine.errors import Refused
    from workflows.store.storage import settle_promise as settle

    text = "" if reject else json_text(value, "value")
    if reject and not error:
        raise InvalidInput("a rejection needs a message", "message")
    with tenant_context(tenant.id):
        try:
            return settle(tenant.id, promise_id, text, error, reject, timezone.now())
        except Refused as exc:
            if exc.status == 7:
                raise NotFound(exc.message, "promise_id") from None
            raise Conflict(exc.message, "promise_id") from None


def send_update(
    tenant: Tenant, run_id: str, name: str, payload: Any = None, *, wait_s: float = 0.0
) -> UpdateRequest:
    """Queue an update for the run's handler; with ``wait_s``, wait that long for the answer."""
    if not name or len(name) > 128:
        raise InvalidInput("update name must be 1-128 characters", "name")
    text = json_text(payload, "payload")
    with tenant_context(tenant.id):
        instance = get_instance(tenant, run_id, lock=True)
        if instance.is_terminal:
            raise Conflict(f"run {run_id} is {instance.status}; it cannot take updates", "run_id")
        update = UpdateRequest.objects.create(
            tenant=tenant, instance=instance, name=name, payload=text
        )
        wake.after_commit(tenant.id, instance.id)
    deadline = time.monotonic() + wait_s
    while wait_s > 0 and time.monotonic() < deadline:
        with tenant_context(tenant.id):
            update.refresh_from_db()
        if update.status != UpdateRequest.State.PENDING:
            break
        time.sleep(0.05)
    return update


def query_state(tenant: Tenant, run_id: str, key: str | None = None) -> Any:
    with tenant_context(tenant.id):
        instance = get_instance(tenant, run_id)
    state = instance.query_state or {}
    if key is None:
        return state
    if key not in state:
        raise NotFound(f"run {run_id} has no query state {key!r}", "key")
    return state[key]


__all__ = [
    "TERMINAL_STATUSES",
    "Conflict",
    "InvalidInput",
    "NotFound",
    "PayloadTooLarge",
    "ServiceError",
]
