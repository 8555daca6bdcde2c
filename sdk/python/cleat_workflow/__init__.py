"""cleat's Python workflow SDK (guest side).

Write workflows as plain functions::

    from cleat_workflow import Context, workflow

    @workflow
    def order(ctx: Context, order: dict) -> dict:
        reservation = ctx.call("inventory", "reserve", {"sku": order["sku"]})
        ctx.sleep(60)
        return {"reservation": reservation}

build them with ``manage.py build_workflow app.py -o app.wasm`` (a WebAssembly component,
through componentize-py) and deploy them with ``manage.py deploy_workflow``. Every host
operation the context offers is recorded and replayed; ``time.time()``, ``datetime.now()``,
``random`` and ``uuid.uuid4()`` are replay-safe too. ``ctx.gather(Call(...), ...)`` makes
several calls as one group; a :class:`Service` subclass declares typed calls. See
``docs/python-workflows.md``.
"""

from cleat_workflow._calls import Call, Retry
from cleat_workflow._context import (
    ChildResult,
    Context,
    Lock,
    Logger,
    Promise,
    Response,
    Signal,
    State,
)
from cleat_workflow._errors import (
    Ambiguous,
    CallFailed,
    Cancelled,
    Denied,
    LockHeld,
    NotFound,
    PermanentError,
    RetriesExhausted,
    Timeout,
    WorkflowError,
    error_for,
)
from cleat_workflow._registry import handler, workflow
from cleat_workflow._service import Service, ServiceDefinitionError

__version__ = "1.0.0"

__all__ = [
    "Ambiguous",
    "Call",
    "CallFailed",
    "Cancelled",
    "ChildResult",
    "Context",
    "Denied",
    "Lock",
    "LockHeld",
    "Logger",
    "NotFound",
    "PermanentError",
    "Promise",
    "Response",
    "RetriesExhausted",
    "Retry",
    "Service",
    "ServiceDefinitionError",
    "Signal",
    "State",
    "Timeout",
    "WorkflowError",
    "error_for",
    "handler",
    "workflow",
]
