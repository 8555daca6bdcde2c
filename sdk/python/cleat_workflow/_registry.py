"""Which workflows and handlers a module offers, filled by the decorators at import time.

componentize-py imports the workflow module when it builds the component, so the registry
is part of the component's initial state: the host reads it once (``describe``) and knows
every entry point and handler name without calling into the guest again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from cleat_workflow._context import Context

WorkflowFn = Callable[["Context", Any], Any]
F = TypeVar("F", bound=Callable[..., Any])

workflows: dict[str, WorkflowFn] = {}
handlers: dict[str, WorkflowFn] = {}


def _register(table: dict[str, WorkflowFn], kind: str, fn: F, name: str | None) -> F:
    key = name or fn.__name__
    if not key or not key.replace("_", "").replace("-", "").replace(".", "").isalnum():
        raise ValueError(f"{kind} name {key!r} must be letters, digits, '_', '-' or '.'")
    known = table.get(key)
    if known is not None and known is not fn:
        raise ValueError(f"two {kind}s are named {key!r}; give one a name= of its own")
    table[key] = fn
    return fn


@overload
def workflow(fn: F, /) -> F: ...
@overload
def workflow(*, name: str | None = None) -> Callable[[F], F]: ...
def workflow(fn: F | None = None, /, *, name: str | None = None) -> F | Callable[[F], F]:
    """Declare a workflow entry point: ``def order(ctx: Context, input) -> result``.

    Its name (the function's, or ``name=``) is the entry point the host starts. A run of
    the default entry (``"run"``) starts the workflow named like the definition, or the
    module's only workflow.
    """

    def register(f: F) -> F:
        f.__cleat_workflow__ = name or f.__name__  # type: ignore[attr-defined]
        return _register(workflows, "workflow", f, name)

    return register(fn) if fn is not None else register


@overload
def handler(fn: F, /) -> F: ...
@overload
def handler(*, name: str | None = None) -> Callable[[F], F]: ...
def handler(fn: F | None = None, /, *, name: str | None = None) -> F | Callable[[F], F]:
    """Declare a defer or update handler: ``def cleanup(ctx: Context, payload) -> result``.

    Pass it to ``ctx.defer(...)`` or ``ctx.on_update(...)``. Handlers must be declared at
    module level (the host learns their names when it loads the component).
    """

    def register(f: F) -> F:
        f.__cleat_handler__ = name or f.__name__  # type: ignore[attr-defined]
        return _register(handlers, "handler", f, name)

    return register(fn) if fn is not None else register


def entry_names() -> list[str]:
    return sorted(workflows)


def resolve_entry(entry: str) -> WorkflowFn | None:
    return workflows.get(entry)
