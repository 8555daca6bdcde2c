"""The world's exports for componentize-py: ``run``, ``dispatch`` and ``describe``.

Only importable inside a component build (it subclasses the generated ``wit_world``);
``manage.py build_workflow`` generates the module that imports it next to the workflows.
"""

from __future__ import annotations

import sys
import time
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
# Written to stderr before time.sleep waits on the clock, which the host refuses (a guest
# fault): the host cannot see Python frames, so the SDK tells it the workflow's file and
# line. The same text is GUEST_WAIT_MARK in engine.component.
WAIT_MARK = "cleat:clock-wait-at "

# The context of the run in progress: defers are dispatched after ``run`` has returned, in
# the same instance, and see the state the workflow left.
_context: Context | None = None


def _short_path(path: str) -> str:
    """componentize-py runs modules from numbered directories (``/1/app.py``): drop the
    number."""
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "" and parts[1].isdigit():
        return "/".join(parts[2:])
    return path


_clock_sleep = time.sleep


def _announced_sleep(seconds: float) -> None:
    """``time.sleep`` in a workflow: say where it was called, then wait on the clock as
    before (the host faults the run there, naming this place)."""
    frame = sys._getframe(1)
    sys.stderr.write(
        f"{WAIT_MARK}time.sleep at {_short_path(frame.f_code.co_filename)}:{frame.f_lineno}"
        f" in {frame.f_code.co_name}\n"
    )
    sys.stderr.flush()
    _clock_sleep(seconds)


time.sleep = _announced_sleep


def _where(exc: BaseException) -> list[str]:
    """The workflow's own frames of a traceback, innermost last, as ``file:line in name``.
    componentize-py runs modules from numbered directories (``/1/app.py``): the number is
    dropped, and so are the SDK's frames."""
    lines = []
    for frame in traceback.extract_tb(exc.__traceback__)[-TRACEBACK_FRAMES:]:
        path = frame.filename
        if "/cleat_workflow/" in path:
            continue
        path = _short_path(path)
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
