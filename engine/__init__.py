"""cleat's framework-free engine: the wasmtime host for guest ABI v1, deterministic
record/replay, event history and its codec, storage protocols and an in-memory storage.

Never imports Django. See ``docs/architecture.md``.
"""

from engine.backend import LoadedModule, ModuleInfo, detect_kind
from engine.config import EngineConfig
from engine.determinism import idempotency_key
from engine.errors import (
    EngineError,
    ErrorCode,
    FenceLost,
    GuestFault,
    InvalidModule,
    NondeterminismError,
    PermanentError,
    Refused,
    StorageError,
    UnsupportedAbiVersion,
)
from engine.events import EncodedEvent, Event, EventType
from engine.outcomes import (
    Completed,
    ContinuedAsNew,
    Failed,
    Outcome,
    SegmentResult,
    Suspended,
    WaitCondition,
    WaitKind,
)
from engine.runtime import WasmRuntime
from engine.services import CallContext, CallResult, Services
from engine.session import RunInfo
from engine.status import AbiStatus, RunStatus
from engine.storage import RunRef, WorkflowStorage

__all__ = [
    "AbiStatus",
    "CallContext",
    "CallResult",
    "Completed",
    "ContinuedAsNew",
    "EncodedEvent",
    "EngineConfig",
    "EngineError",
    "ErrorCode",
    "Event",
    "EventType",
    "Failed",
    "FenceLost",
    "GuestFault",
    "InvalidModule",
    "LoadedModule",
    "ModuleInfo",
    "NondeterminismError",
    "Outcome",
    "PermanentError",
    "Refused",
    "RunInfo",
    "RunRef",
    "RunStatus",
    "SegmentResult",
    "Services",
    "StorageError",
    "Suspended",
    "UnsupportedAbiVersion",
    "WaitCondition",
    "WaitKind",
    "WasmRuntime",
    "WorkflowStorage",
    "detect_kind",
    "idempotency_key",
]
