"""The world's exports for componentize-py: ``run``, ``dispatch`` and ``describe``.

Only importable inside a component build (it subclasses the generated ``wit_world``);
``manage.py build_workflow`` generates the module that imports it next to the workflows.
"""

from __future__ import annotations

import traceback
from typing import Any

import wit_world  # type: ignore[import-not-found]
from componentize_py_types import Err  # type: ignore[import-not-found]
from wit_world.imports import types  # type: ignore[import-not-found]

from cleat_workflow import _registry
from cleat_workflow._context import Context, _dumps, _loads
from cleat_workflow._errors import ERROR, PERMANENT, WorkflowError

ABI_VERSION = 1
# The message of a failure by MemoryError (see engine.component).
MEMORY_ERROR = "MemoryError: the workflow ran out of memory"
# Frames of a failure's traceback kept in its message.
TRACEBACK_FRAMES = 8

# The context of the run in progress: defers are dispatched after ``run`` has returned, in
# the same instance, and see the state the workflow left.
_context: Context | None = None


def _where(exc: BaseException) -> list[str]:
    """The workflow's own frames of a traceback, innermost last, as ``file:line in name``.
    componentize-py runs modules from numbered directories (``/1/app.py``): the number is
    dropped, and so are the SDK's frames."""
    lines = []
    for frame in traceback.extract_tb(exc.__traceback__)[-TRACEBACK_FRAMES:]:
        path = frame.filename
        if "/cleat_workflow/" in path:
            continue
        parts = path.split("/")
        if len(parts) > 2 and parts[0] == "" and parts[1].isdigit():
            path = "/".join(parts[2:])
        lines.append(f"  at {path}:{frame.lineno} in {frame.name}")
    return lines


def _failure(exc: BaseException) -> Any:
    if isinstance(exc, WorkflowError):
        return Err(types.WorkflowError(exc.status, exc.message))
    if isinstance(exc, MemoryError):
        # CPython's allocator hit the store's memory limit; the host reports the prefix as
        # resource_limit, like a core module trapping at the limit.
        return Err(types.WorkflowError(ERROR, MEMORY_ERROR))
    headline = "".join(traceback.format_exception_only(exc)).strip()
    return Err(types.WorkflowError(ERROR, "\n".join([headline, *_where(exc)])))


def _result(value: Any) -> str:
    try:
        return _dumps(value)
    except (TypeError, ValueError) as exc:
        raise Err(
            types.WorkflowError(PERMANENT, f"the result is not JSON-serialisable: {exc}")
        ) from None


class WitWorld(wit_world.WitWorld):  # type: ignore[misc]
    def run(self, entry: str, input: str) -> str:
        global _context
        fn = _registry.resolve_entry(entry)
        if fn is None:
            offered = ", ".join(_registry.entry_names()) or "none"
            raise Err(
                types.WorkflowError(
                    PERMANENT, f"no workflow named {entry!r} (this module offers: {offered})"
                )
            )
        ctx = Context(entry, _loads(input))
        _context = ctx
        try:
            value = fn(ctx, ctx.input)
        except Exception as exc:
            raise _failure(exc) from None
        return _result(value)

    def dispatch(self, handler: str, payload: str) -> str:
        fn = _registry.handlers.get(handler)
        if fn is None:
            raise Err(types.WorkflowError(PERMANENT, f"no handler named {handler!r}"))
        ctx = _context if _context is not None else Context(handler)
        try:
            value = fn(ctx, _loads(payload))
        except Exception as exc:
            raise _failure(exc) from None
        return _result(value)

    def describe(self) -> Any:
        return types.GuestInfo(ABI_VERSION, _registry.entry_names(), sorted(_registry.handlers))
