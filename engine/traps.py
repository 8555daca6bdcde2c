"""Trap classification, for both backends: what ended a segment (an exception a host
function raised out of the guest, a wasmtime trap or error), as an outcome with an
:class:`~engine.errors.ErrorCode`. Nothing from wasmtime leaves a backend except through
here.

A core module's traps carry a trap code and frames (:func:`classify_trap`); the component
API reports a trap as a ``WasmtimeError`` with text only (:func:`classify_component_error`).
"""

from __future__ import annotations

import logging
from typing import Protocol

import wasmtime

from engine.config import WASM_PAGE, EngineConfig
from engine.errors import (
    EngineError,
    ErrorCode,
    FenceLost,
    GuestFault,
    HistoryCorrupt,
    InvalidModule,
    NondeterminismError,
    QuotaExceeded,
    StorageError,
)
from engine.outcomes import ContinueAsNew, ContinuedAsNew, Outcome, Suspend, Suspended, failed
from engine.session import ReplayCore, Reply
from engine.status import AbiStatus

log = logging.getLogger("cleat.engine")

# Names that, in a trap's backtrace, mean the guest's allocator gave up: wasmtime returns -1
# from memory.grow at the store limit instead of trapping, so an out-of-memory guest usually
# ends in its own abort path. See ``classify_trap``.
_OOM_MARKERS = ("alloc_error", "handle_alloc_error", "out_of_memory", "oom", "malloc_fail")

# How the SDK reports a MemoryError: CPython's allocator got -1 from memory.grow at the
# store's limit. Reported as resource_limit, like a core module trapping at the limit.
GUEST_MEMORY_ERROR = "MemoryError: the workflow ran out of memory"


class GuestMemory(Protocol):
    """The instance whose memory an out-of-memory trap is judged by."""

    def memory_size(self) -> int: ...


def classify(
    exc: BaseException, session: ReplayCore, config: EngineConfig, instance: GuestMemory | None
) -> Outcome:
    """What ended a core module's segment, as an outcome. The reason the session recorded
    (raised out of one of its host functions) comes first, then ``exc`` itself."""
    reason = session.exit if session.exit is not None else exc
    if session.exit is None and isinstance(reason, EngineError):
        # wasmtime-py hands a host function's exception to whichever thread traps next;
        # one that is not this session's own belongs to another segment.
        reason = wasmtime.Trap("a host function of another segment failed on this thread")
    match reason:
        case Suspend():
            return Suspended(reason.wait)
        case ContinueAsNew():
            return ContinuedAsNew(reason.new_input, reason.version)
        case FenceLost():
            raise reason
        case GuestFault():
            return failed(ErrorCode.GUEST_FAULT, str(reason))
        case QuotaExceeded():
            return failed(ErrorCode.DENIED, str(reason))
        case NondeterminismError():
            return failed(ErrorCode.NONDETERMINISM, str(reason))
        case HistoryCorrupt():
            return failed(ErrorCode.HISTORY_CORRUPT, str(reason))
        case InvalidModule():
            return failed(ErrorCode.INVALID_MODULE, str(reason))
        case StorageError():
            return failed(ErrorCode.INTERNAL, f"storage failed: {reason}")
        case wasmtime.Trap():
            return classify_trap(reason, config, instance)
        case wasmtime.WasmtimeError():
            text = str(reason)
            if "limit" in text or "exceeds" in text or "memory" in text:
                return failed(ErrorCode.RESOURCE_LIMIT, text)
            return failed(ErrorCode.PANIC, text)
    log.error("host error in run %s", session.ref.run_id, exc_info=reason)
    return failed(ErrorCode.INTERNAL, f"host error: {type(reason).__name__}: {reason}")


def classify_trap(
    trap: wasmtime.Trap, config: EngineConfig, instance: GuestMemory | None
) -> Outcome:
    """A wasmtime trap (with its trap code and frames) as an outcome."""
    code = trap.trap_code
    cfg = config
    if code == wasmtime.TrapCode.INTERRUPT:
        return failed(
            ErrorCode.TIMEOUT,
            f"the execution segment exceeded its {cfg.segment_timeout_s:g} s deadline",
        )
    if code == wasmtime.TrapCode.OUT_OF_FUEL:
        return failed(ErrorCode.RESOURCE_LIMIT, f"the guest used up its fuel ({cfg.fuel} units)")
    if code == wasmtime.TrapCode.STACK_OVERFLOW:
        return failed(ErrorCode.RESOURCE_LIMIT, "the guest exhausted its call stack")
    message = trap.message
    at_limit = instance is not None and instance.memory_size() + WASM_PAGE > cfg.memory_limit_bytes
    names = " ".join((f.func_name or "") for f in trap.frames).lower()
    if at_limit or any(marker in names for marker in _OOM_MARKERS):
        return failed(
            ErrorCode.RESOURCE_LIMIT,
            f"the guest ran out of memory (limit {cfg.memory_limit_bytes} bytes): {message}",
        )
    if "backtrace" not in message and trap.frames:
        frames = "\n".join(
            f"  {i}: {f.module_name or '<module>'}!{f.func_name or f'func[{f.func_index}]'}"
            f" @ 0x{f.module_offset:x}"
            for i, f in enumerate(trap.frames)
        )
        message = f"{message}\nwasm backtrace:\n{frames}"
    return failed(ErrorCode.PANIC, message)


def classify_component(exc: BaseException, session: ReplayCore, config: EngineConfig) -> Outcome:
    """Map what ended the segment to an outcome. Exceptions the session raised out of a
    host function come first; wasmtime's own errors are read from their text (the
    component API reports traps as ``WasmtimeError``, without a trap code)."""
    reason = session.exit if session.exit is not None else exc
    if isinstance(reason, wasmtime.WasmtimeError) and not isinstance(reason, wasmtime.Trap):
        return classify_component_error(reason, config)
    return classify(reason, session, config, None)


def classify_component_error(error: wasmtime.WasmtimeError, config: EngineConfig) -> Outcome:
    """An error of the component API (a trap reported without a trap code) as an outcome."""
    cfg = config
    text = str(error)
    lowered = text.lower()
    if "wasm trap: interrupt" in lowered:
        return failed(
            ErrorCode.TIMEOUT,
            f"the execution segment exceeded its {cfg.segment_timeout_s:g} s deadline",
        )
    if "all fuel consumed" in lowered:
        return failed(ErrorCode.RESOURCE_LIMIT, f"the guest used up its fuel ({cfg.fuel} units)")
    if "call stack exhausted" in lowered:
        return failed(ErrorCode.RESOURCE_LIMIT, "the guest exhausted its call stack")
    if "memory" in lowered and ("limit" in lowered or "exceeds" in lowered):
        return failed(
            ErrorCode.RESOURCE_LIMIT,
            f"the guest ran out of memory (limit {cfg.memory_limit_bytes} bytes): {text}",
        )
    if "forcing a resource limit" in lowered or "resource limit exceeded" in lowered:
        return failed(ErrorCode.RESOURCE_LIMIT, text)
    return failed(ErrorCode.PANIC, text)


def classify_component_reply(reply: Reply, config: EngineConfig) -> Outcome | None:
    """The outcome of a component's entry point that reported running out of memory (the
    SDK's answer to a MemoryError); None for any other reply, which the session finishes."""
    if reply.status == AbiStatus.ERROR and reply.payload.startswith(GUEST_MEMORY_ERROR):
        return failed(
            ErrorCode.RESOURCE_LIMIT,
            f"the guest ran out of memory (limit {config.memory_limit_bytes} "
            "bytes): Python raised MemoryError",
        )
    return None
