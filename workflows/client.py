"""cleat's public Python API for the project that embeds it: start, signal, read and cancel
runs from a view, a task or a shell, and deploy workflow modules.

::

    from workflows import client

    def checkout(request):
        run = client.start("checkout", {"order_id": order.id}, idempotency_key=f"order-{order.id}")
        return redirect("order", run_id=run.id)

    def order(request, run_id):
        run = client.get(run_id)          # status, result, error, waiting_on, query state
        ...

    client.signal(run_id, "shipped", {"carrier": "ups"})

Everything here calls :mod:`workflows.services`, the layer the REST API, the admin and the
management commands share, so a run started from a view is the same as one started over the
API: a worker (``manage.py runworker``) executes it. Each function works in the default
tenant unless given ``tenant`` (a :class:`~workflows.models.Tenant`, its name or its id).
Errors are :class:`ClientError` subclasses carrying ``code``, ``http_status`` and (for bad
input) ``field``: :class:`InvalidInput`, :class:`NotFound`, :class:`Conflict`,
:class:`PayloadTooLarge`. Calls are synchronous and short (one transaction); nothing here
waits for a run to finish. See ``docs/embedding.md``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from workflows import services
from workflows.models import DEFAULT_TENANT_ID, TERMINAL_STATUSES, Tenant, WorkflowInstance
from workflows.services import Conflict, InvalidInput, NotFound, PayloadTooLarge
from workflows.services import ServiceError as ClientError
from workflows.tenancy import tenant_context

__all__ = [
    "ClientError",
    "Conflict",
    "InvalidInput",
    "NotFound",
    "PayloadTooLarge",
    "Run",
    "cancel",
    "deploy",
    "get",
    "signal",
    "start",
]

TenantLike = Tenant | str | uuid.UUID | None


@dataclass(frozen=True)
class Run:
    """A run as its caller reads it; JSON values (``input``, ``result``, query state) are
    parsed."""

    id: str
    workflow_id: str
    definition: str
    version: int
    status: str  # ready, running, done, failed, dead_lettered, terminated, paused
    input: Any
    result: Any  # the workflow's return value once ``done``, else None
    error: str | None
    error_code: str | None
    waiting_on: str | None  # what a suspended run waits for ("signals shipped", "timer ...")
    query_state: dict[str, Any]
    created_at: datetime
    completed_at: datetime | None

    @property
    def finished(self) -> bool:
        """The run has ended (done, failed, dead-lettered or terminated)."""
        return self.status in TERMINAL_STATUSES

    @classmethod
    def of(cls, instance: WorkflowInstance) -> Run:
        return cls(
            id=str(instance.id),
            workflow_id=instance.workflow_id,
            definition=instance.definition_name,
            version=instance.definition_version,
            status=str(instance.status),
            input=_parsed(instance.input),
            result=_parsed(instance.result),
            error=instance.error,
            error_code=instance.error_code,
            waiting_on=instance.waiting_description or None,
            query_state={k: _parsed(v) for k, v in (instance.query_state or {}).items()},
            created_at=instance.created_at,
            completed_at=instance.completed_at,
        )


def _parsed(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _tenant(tenant: TenantLike) -> Tenant:
    return services.get_tenant(tenant if tenant is not None else DEFAULT_TENANT_ID)


def start(
    name: str,
    input: Any = None,
    *,
    version: int | None = None,
    tag: str | None = None,
    idempotency_key: str | None = None,
    workflow_id: str | None = None,
    priority: int = 0,
    task_queue: str = "default",
    tenant: TenantLike = None,
    traceparent: str | None = None,
) -> Run:
    """Start a run of workflow ``name`` with ``input`` (any JSON-serialisable value).

    The version is ``version``, else the one ``tag`` names, else the routing rules', else the
    latest. A repeated ``idempotency_key`` returns the run it started the first time (a
    double-clicked form starts one order). The run is committed with the caller's
    transaction; a worker picks it up after the commit. With tracing on, the run joins the
    trace of ``traceparent`` (a W3C header value), else of the current span."""
    instance, _ = services.start_workflow(
        _tenant(tenant),
        name,
        input,
        version=version,
        tag=tag,
        idempotency_key=idempotency_key,
        workflow_id=workflow_id,
        priority=priority,
        task_queue=task_queue,
        traceparent=traceparent,
    )
    return Run.of(instance)


def signal(run_id: str, name: str, payload: Any = None, *, tenant: TenantLike = None) -> None:
    """Deliver signal ``name`` with ``payload`` to a run; a run waiting for it wakes up.
    :class:`Conflict` for a run that has ended."""
    services.signal_workflow(_tenant(tenant), run_id, name, payload)


def get(run_id: str, *, tenant: TenantLike = None) -> Run:
    """The run as it is now. :class:`NotFound` for an id that is not a run of the tenant."""
    found = _tenant(tenant)
    with tenant_context(found.id):
        return Run.of(services.get_instance(found, run_id))


def cancel(run_id: str, reason: str = "", *, tenant: TenantLike = None) -> Run:
    """Ask a run to cancel: its next wait returns ``Cancelled`` to the workflow, which
    decides what to do (compensate, return)."""
    found = _tenant(tenant)
    services.cancel_workflow(found, run_id, reason, operator="client")
    return get(run_id, tenant=found)


def deploy(
    name: str, module: bytes | str | Path, *, min_version: int = 0, tenant: TenantLike = None
) -> int:
    """Deploy a built module (its bytes or its ``.wasm`` path) as the next version of
    ``name``; returns the version. ``manage.py deploy_workflow`` does the same."""
    from workflows.definitions import deploy_definition

    wasm = module if isinstance(module, bytes) else Path(module).read_bytes()
    return deploy_definition(_tenant(tenant), name, wasm, min_version=min_version).version
