"""The wasmtime runtime for core modules: one engine, host functions defined once, a fresh
store per execution segment, compiled modules cached in memory and on disk.

Budgets: epoch interruption is always on (a ticker thread advances the epoch every
``epoch_tick_s``), so a guest that never calls the host still stops at its deadline; fuel is
optional. Time a host call spends waiting on I/O (a service call) is given back to the
deadline: the deadline bounds the guest's own work, not the latency of the services it uses.

Every trap is mapped to an :class:`~engine.errors.ErrorCode` here, at the boundary; nothing
from wasmtime leaks to callers.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.metadata
import logging
import os
import re
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import wasmtime
import wasmtime._func as wasmtime_func
from wasmtime import _ffi as wasmtime_ffi

from engine.abi import (
    DEFAULT_ENTRY_POINT,
    EXPORT_ABI_VERSION,
    EXPORT_ALLOC,
    EXPORT_MEMORY,
    IMPORTS,
    IMPORTS_BY_NAME,
    SUPPORTED_ABI_VERSIONS,
    HostImport,
    unpack,
    wasm_param_types,
)
from engine.config import WASM_PAGE, EngineConfig
from engine.errors import (
    EngineError,
    ErrorCode,
    FenceLost,
    GuestFault,
    HistoryCorrupt,
    InvalidModule,
    NondeterminismError,
    StorageError,
    UnsupportedAbiVersion,
    WorkflowExit,
)
from engine.events import EncodedEvent
from engine.outcomes import (
    ContinueAsNew,
    ContinuedAsNew,
    Outcome,
    SegmentResult,
    Suspend,
    Suspended,
    failed,
)
from engine.services import Services
from engine.session import ExecutionSession, Reply, RunInfo
from engine.status import Status
from engine.storage import WorkflowStorage

if TYPE_CHECKING:
    from engine.component import ComponentBackend

log = logging.getLogger("cleat.engine")

WASMTIME_VERSION = importlib.metadata.version("wasmtime")
CORE_HEADER = b"\x00asm\x01\x00\x00\x00"
COMPONENT_LAYER = b"\x00asm\x0d\x00\x01\x00"

# Names that, in a trap's backtrace, mean the guest's allocator gave up: wasmtime returns -1
# from memory.grow at the store limit instead of trapping, so an out-of-memory guest usually
# ends in its own abort path. See ``_classify_trap``.
_OOM_MARKERS = ("alloc_error", "handle_alloc_error", "out_of_memory", "oom", "malloc_fail")


def detect_kind(wasm: bytes) -> str:
    """``"core"`` or ``"component"`` from the binary header; raises InvalidModule otherwise."""
    if wasm[:8] == CORE_HEADER:
        return "core"
    if wasm[:8] == COMPONENT_LAYER:
        return "component"
    if wasm[:4] == b"\x00asm":
        raise InvalidModule(f"unsupported WebAssembly binary version {wasm[4:8].hex()}")
    raise InvalidModule("not a WebAssembly binary (missing the \\0asm header)")


@dataclass(frozen=True, slots=True)
class ModuleInfo:
    """What deploy records about a module."""

    sha256: str
    kind: str
    abi_version: int
    entry_points: tuple[str, ...]  # exports with the entry signature (i32, i32) -> i64
    imports: tuple[str, ...]
    size: int


@dataclass(frozen=True, slots=True)
class LoadedModule:
    info: ModuleInfo
    module: wasmtime.Module
    pre: wasmtime.InstancePre


class EpochTicker:
    """Advances the engine's epoch every ``tick_s`` so deadlines fire without guest help."""

    def __init__(self, engine: wasmtime.Engine, tick_s: float) -> None:
        self._engine = engine
        self._tick_s = tick_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cleat-epoch-ticker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._tick_s):
            self._engine.increment_epoch()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)


# The hot path of a host call calls libwasmtime through a handle of its own. wasmtime-py's
# declarations check and convert every argument and wrap every pointer they return, which
# costs several times the call itself; these take pointers wasmtime-py made (so their types
# are right), integers as explicit ctypes values, and return plain integers. A separate
# handle leaves wasmtime-py's own declarations as they are.
_libwasmtime = ctypes.CDLL(wasmtime_ffi.dll._name)
_CONTEXT_PTR = ctypes.POINTER(wasmtime_ffi.wasmtime_context_t)
_ERROR_PTR = ctypes.POINTER(wasmtime_ffi.wasmtime_error_t)
_memory_data = _libwasmtime.wasmtime_memory_data
_memory_data.restype = ctypes.c_void_p
_memory_data_size = _libwasmtime.wasmtime_memory_data_size
_memory_data_size.restype = ctypes.c_size_t
_func_call = _libwasmtime.wasmtime_func_call
_func_call.restype = ctypes.c_void_p  # wasmtime_error_t*, NULL on success
_caller_context = _libwasmtime.wasmtime_caller_context
_caller_context.argtypes = [ctypes.c_void_p]
_caller_context.restype = _CONTEXT_PTR
_define_func_unchecked = _libwasmtime.wasmtime_linker_define_func_unchecked
_define_func_unchecked.restype = ctypes.c_void_p  # wasmtime_error_t*, NULL on success
_set_epoch_deadline = _libwasmtime.wasmtime_context_set_epoch_deadline
_set_epoch_deadline.restype = None
_ONE = ctypes.c_size_t(1)
_TRAP_PTR = ctypes.POINTER(wasmtime_ffi.wasm_trap_t)
_U64 = ctypes.c_uint64
# The status byte of a reply, for each status a byte can hold.
_STATUS_BYTE = tuple(bytes((i,)) for i in range(256))

# The session and instance of the segment running on this thread, for the host functions
# (defined once per engine, so they cannot close over a segment).
_current = threading.local()


def _claim(fault: GuestFault) -> GuestFault:
    """Mark a fault the host raised itself on this thread (not one that came back through a
    trap) as this segment's own, so ``_classify`` does not take it for another segment's."""
    frame = getattr(_current, "frame", None)
    if frame is not None and frame[0].exit is None:
        frame[0].exit = fault
    return fault


class CoreInstance:
    """One instantiated core module for one segment: memory access and export calls."""

    supports_reentry = True

    def __init__(
        self,
        store: wasmtime.Store,
        instance: wasmtime.Instance,
        config: EngineConfig,
        started: float,
        io_seconds: Callable[[], float],
    ) -> None:
        self.store = store
        # The store, or the _CallerContext of the host call in progress; and its
        # ``_context()``, which the fast paths below pass to libwasmtime (the host function
        # sets and restores both).
        self.ctx: Any = store
        self._context_ptr: Any = store._context()
        self.config = config
        self._max_string = config.max_string_bytes
        self._timeout_s = config.segment_timeout_s
        self._tick_s = config.epoch_tick_s
        self._started = started
        self._io_seconds = io_seconds
        exports = instance.exports(store)
        memory = exports.get(EXPORT_MEMORY)
        alloc = exports.get(EXPORT_ALLOC)
        if not isinstance(memory, wasmtime.Memory):
            raise InvalidModule(f"the module does not export its memory as {EXPORT_MEMORY!r}")
        if not isinstance(alloc, wasmtime.Func):
            raise InvalidModule(f"the module does not export {EXPORT_ALLOC}(size: i32) -> i32")
        self.memory: wasmtime.Memory = memory
        self._alloc: wasmtime.Func = alloc
        self._exports = exports
        self._funcs: dict[str, wasmtime.Func] = {}
        # Made once, used by every host call (see _memory_view and _call_alloc).
        self._memory_ref = ctypes.byref(memory._memory)
        self._alloc_ref = ctypes.byref(alloc._func)
        self._alloc_params = (wasmtime_ffi.wasmtime_val_t * 1)()
        self._alloc_results = (wasmtime_ffi.wasmtime_val_t * 1)()
        # The fields of each wasmtime_val_t that are used, as objects sharing its memory
        # (building a wasmtime_val_t from keywords costs ten times as much).
        val = wasmtime_ffi.wasmtime_val_t
        kind = ctypes.c_uint8.from_buffer(self._alloc_params)  # the struct's first field
        kind.value = wasmtime_ffi.WASMTIME_I32.value
        self._alloc_size = ctypes.c_int32.from_buffer(self._alloc_params, val.of.offset)
        self._alloc_ptr = ctypes.c_int32.from_buffer(self._alloc_results, val.of.offset)
        self._view_at = (-1, -1)
        self._view: Any = None
        self._view_bytes: memoryview = memoryview(b"")

    # --- memory ---

    def _memory_view(self) -> tuple[Any, int]:
        """Linear memory as it is now: a ``c_char`` array over it (slices are ``bytes``) and
        its size. Memory moves or grows only when guest code runs, so the view is made again
        only when its address or size changed; both are asked for at every host call and
        after every ``cleat_alloc``, never assumed."""
        context = self._context_ptr
        ref = self._memory_ref
        at = (_memory_data(context, ref) or 0, _memory_data_size(context, ref))
        if at != self._view_at:
            base, size = at
            self._view = (ctypes.c_char * size).from_address(base)
            self._view_bytes = memoryview(self._view).cast("B")
            self._view_at = at
        return self._view, at[1]

    def read_bytes(self, function: str, ptr: int, length: int, limit: int) -> bytes:
        view, size = self._memory_view()
        return _guest_bytes(function, view, size, ptr, length, limit)

    def read_string(self, function: str, ptr: int, length: int) -> str:
        raw = self.read_bytes(function, ptr, length, self.config.max_string_bytes)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _not_utf8(function, ptr, exc) from None

    def string_reader(self, function: str) -> Callable[[int, int], str]:
        """``read(ptr, len)`` for the string arguments of one host call. Memory is looked up
        once for all of them: no guest code runs while the arguments are read."""
        view, size = self._memory_view()
        limit = self.config.max_string_bytes

        def read(ptr: int, length: int) -> str:
            raw = _guest_bytes(function, view, size, ptr, length, limit)
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _not_utf8(function, ptr, exc) from None

        return read

    def _call_alloc(self, n: int) -> int:
        """``cleat_alloc(n)``, called through the C API: ``Func.__call__`` rebuilds the
        function's type and converts each value through wasmtime-py's generic layer (about
        30 µs a call, more than the rest of a host call). This is the same checked call
        (wasmtime still validates the types), with errors and traps raised exactly as
        ``Func.__call__`` raises them, including a host function's exception."""
        self._alloc_size.value = n
        trap = _TRAP_PTR()
        error = _func_call(
            self._context_ptr,
            self._alloc_ref,
            self._alloc_params,
            _ONE,
            self._alloc_results,
            _ONE,
            ctypes.byref(trap),
        )
        if error:
            failure = wasmtime.WasmtimeError._from_ptr(ctypes.cast(error, _ERROR_PTR))
            wasmtime_func.maybe_raise_last_exn()
            raise failure
        if trap:
            trapped = wasmtime.Trap._from_ptr(trap)
            wasmtime_func.maybe_raise_last_exn()
            raise trapped
        return self._alloc_ptr.value

    def write(self, function: str, data: bytes) -> int:
        """Allocate ``len(data)`` bytes through ``cleat_alloc`` and copy ``data`` there."""
        n = len(data)
        ptr = self._call_alloc(n) & 0xFFFFFFFF
        self._memory_view()
        size = self._view_at[1]
        if ptr + n > size:
            raise _claim(
                GuestFault(
                    function,
                    f"{EXPORT_ALLOC}({n}) returned {ptr}, outside linear memory ({size} bytes)",
                )
            )
        self._view_bytes[ptr : ptr + n] = data
        return ptr

    def write_reply(self, function: str, reply: Reply) -> int:
        """Write ``reply`` as a packed buffer (status byte, UTF-8 payload); its ``pack``ed
        pointer and length."""
        status, payload = reply
        head = _STATUS_BYTE[status] if 0 <= status < 256 else bytes((status,))
        data = head + payload.encode()
        n = len(data)
        ptr = self.write(function, data)  # already below 2**32
        value = (ptr << 32) | (n & 0xFFFFFFFF)  # pack(ptr, n), written out
        return value - (1 << 64) if value >= 1 << 63 else value

    def read_reply(self, function: str, packed: int) -> Reply:
        ptr, length = unpack(packed)
        if length == 0:
            raise GuestFault(function, "returned an empty buffer; a status byte is required")
        raw = self.read_bytes(function, ptr, length, self.config.max_string_bytes + 1)
        try:
            payload = raw[1:].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GuestFault(
                function, f"returned a payload that is not valid UTF-8 ({exc.reason})"
            ) from None
        return Reply(raw[0], payload)

    # --- exports ---

    def _func(self, name: str) -> wasmtime.Func | None:
        fn = self._funcs.get(name)
        if fn is None:
            found = self._exports.get(name)
            if not isinstance(found, wasmtime.Func):
                return None
            self._funcs[name] = fn = found
        return fn

    def has_export(self, name: str) -> bool:
        return self._func(name) is not None

    def call_export(self, name: str, payload: str) -> Reply:
        fn = self._func(name)
        if fn is None:
            raise _claim(GuestFault(name, f"the module has no export {name!r}"))
        data = payload.encode()
        ptr = self.write(name, data)
        packed = fn(self.ctx, ptr, len(data))
        try:
            return self.read_reply(name, packed)
        except GuestFault as fault:
            raise _claim(fault) from None

    def refresh_deadline(self, io_seconds: float) -> None:
        guest_seconds = time.monotonic() - self._started - self._io_seconds()
        remaining = self._timeout_s - guest_seconds
        ticks = max(1, round(remaining / self._tick_s))
        # wasmtime_context_set_epoch_deadline(context, ticks), without wasmtime-py's checked
        # wrapper (the context is one wasmtime-py made; the count an explicit uint64).
        _set_epoch_deadline(self._context_ptr, _U64(ticks))

    def memory_size(self) -> int:
        try:
            return int(self.memory.data_len(self.store))
        except Exception:
            return 0


# Host functions are defined on the linker "unchecked": wasmtime hands the callback the
# address of the raw argument slots (and takes the result in slot 0) instead of wasmtime-py
# converting every value through its generic ``Val`` layer, which costs about 30 µs a call,
# more than the whole budget of a durable step. The import types are still checked when a
# module is linked. Exceptions leave the callback the way wasmtime-py's own trampoline lets
# them: parked in ``wasmtime._func.LAST_EXCEPTION`` behind a trap, and re-raised by
# wasmtime-py (or ``_call_alloc``) where the guest was entered.
_HostCallback = ctypes.CFUNCTYPE(
    ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t
)
_VALUE_SLOT = ctypes.sizeof(wasmtime_ffi.wasmtime_val_raw_t)
_SLOT_FORMAT = {"i32": f"i{_VALUE_SLOT - 4}x", "i64": f"q{_VALUE_SLOT - 8}x"}


class _CallerContext:
    """The store context of the host call in progress, as the ``Storelike`` wasmtime-py
    expects (it reads ``_context()``). Like a ``wasmtime.Caller``, invalid once the call has
    returned."""

    __slots__ = ("_pointer",)

    def __init__(self, pointer: Any) -> None:
        self._pointer = pointer

    def _context(self) -> Any:
        if self._pointer is None:
            raise ValueError("caller is no longer valid")
        return self._pointer

    def invalidate(self) -> None:
        """Never usable after the host call returns."""
        self._pointer = None


def _guest_bytes(function: str, view: Any, size: int, ptr: int, length: int, limit: int) -> bytes:
    """``length`` bytes at ``ptr`` of linear memory (``view``, ``size`` bytes long), refused
    unless the whole range is inside it and no longer than ``limit``."""
    ptr &= 0xFFFFFFFF
    length &= 0xFFFFFFFF
    if length > limit:
        raise GuestFault(function, f"a string of {length} bytes exceeds the {limit}-byte maximum")
    if ptr + length > size:
        raise GuestFault(
            function,
            f"pointer {ptr} with length {length} is outside linear memory ({size} bytes)",
        )
    data: bytes = view[ptr : ptr + length]
    return data


def _not_utf8(function: str, ptr: int, exc: UnicodeDecodeError) -> GuestFault:
    return GuestFault(
        function, f"string at {ptr} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
    )


def _arg_reader(imp: HostImport) -> Callable[[CoreInstance, tuple[int, ...]], tuple[Any, ...]]:
    """``read(instance, raw)``: the raw wasm arguments of ``imp`` (one tuple of slot values)
    -> the arguments of the session method, each string read from linear memory.

    Generated for each signature with the positions and the checks written out, so that a
    call costs no closure and no function call per string. Each string is checked exactly
    as ``_guest_bytes`` checks it (length limit first, then bounds; on failure it is
    ``_guest_bytes`` that raises), then decoded as strict UTF-8; strings are read left to
    right, so the first bad one is the one reported. Memory is looked up once for all of
    them: no guest code runs while the arguments are read."""
    lines = [
        "def read(instance, raw):",
        "    view, size = instance._memory_view()",
        "    limit = instance._max_string",
    ]
    exprs: list[str] = []
    index = 0
    for ch in imp.params:
        if ch == "s":
            k = len(exprs)
            lines += [
                f"    ptr, length = raw[{index}], raw[{index + 1}]",
                "    start, n = ptr & 0xFFFFFFFF, length & 0xFFFFFFFF",
                "    if n > limit or start + n > size:",
                "        _guest_bytes(NAME, view, size, ptr, length, limit)",
                "    try:",
                f"        s{k} = view[start : start + n].decode('utf-8')",
                "    except UnicodeDecodeError as exc:",
                "        raise _not_utf8(NAME, ptr, exc) from None",
            ]
            exprs.append(f"s{k}")
            index += 2
        elif ch in ("I", "i"):
            exprs.append(f"raw[{index}]")
            index += 1
        else:
            raise ValueError(f"unknown parameter code {ch!r}")
    lines.append("    return (" + ", ".join(exprs) + ("," if len(exprs) == 1 else "") + ")")
    namespace: dict[str, Any] = {
        "NAME": imp.name,
        "_guest_bytes": _guest_bytes,
        "_not_utf8": _not_utf8,
    }
    exec("\n".join(lines) + "\n", namespace)
    read: Callable[[CoreInstance, tuple[int, ...]], tuple[Any, ...]] = namespace["read"]
    return read


def _host_function(imp: HostImport) -> Any:
    """The C callback serving ``imp``: read the arguments (strings bounds- and UTF-8-checked),
    call the session method of the same name, write the answer back."""
    name = imp.name
    read_args = _arg_reader(imp) if "s" in imp.params else None
    packed = imp.returns == "P"
    # All arguments in one read: slot i holds an i32 or i64 in its first bytes.
    layout = struct.Struct("=" + "".join(_SLOT_FORMAT[t] for t in wasm_param_types(imp.params)))
    slots = ctypes.c_char * layout.size
    unpack_slots = layout.unpack_from
    result_slot = ctypes.c_int64

    def host(env: int | None, caller: int, values: int, count: int) -> int:
        pointer = _caller_context(caller)
        context = _CallerContext(pointer)
        try:
            frame = getattr(_current, "frame", None)
            if frame is None:
                # Only reachable from a start function at inspection time.
                raise GuestFault(name, "host functions cannot be called while the module starts")
            session, instance = frame
            previous, previous_pointer = instance.ctx, instance._context_ptr
            instance.ctx, instance._context_ptr = context, pointer
            try:
                raw = unpack_slots(slots.from_address(values)) if layout.size else ()
                args = read_args(instance, raw) if read_args is not None else raw
                result = getattr(session, name)(*args)
                value = instance.write_reply(name, result) if packed else int(result)
            except BaseException as exc:
                if session.exit is None:
                    session.exit = exc
                raise
            finally:
                instance.ctx, instance._context_ptr = previous, previous_pointer
            result_slot.from_address(values).value = value
            return 0
        except BaseException as exc:
            wasmtime_func.LAST_EXCEPTION = exc  # type: ignore[assignment]
            trap = wasmtime.Trap("python exception")._consume()
            return ctypes.cast(trap, ctypes.c_void_p).value or 0
        finally:
            context.invalidate()

    return _HostCallback(host)


# One callback per import for the whole process: every linker, and every store instantiated
# through one, calls into them, and ctypes frees a callback when its object is collected.
_HOST_CALLBACKS: dict[str, Any] = {imp.name: _host_function(imp) for imp in IMPORTS}
# The callbacks hold no per-definition data, so there is nothing to finalize.
_NO_FINALIZER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _data: None)


def _define_host_function(linker: wasmtime.Linker, imp: HostImport) -> None:
    module, name = b"env", imp.name.encode()
    ty = _func_type(imp)  # kept referenced until the call returns: it owns the C type
    error = _define_func_unchecked(
        linker.ptr(),
        ctypes.create_string_buffer(module),
        ctypes.c_size_t(len(module)),
        ctypes.create_string_buffer(name),
        ctypes.c_size_t(len(name)),
        ty.ptr(),
        _HOST_CALLBACKS[imp.name],
        None,
        _NO_FINALIZER,
    )
    if error:
        raise wasmtime.WasmtimeError._from_ptr(ctypes.cast(error, _ERROR_PTR))


def _func_type(imp: HostImport) -> wasmtime.FuncType:
    kinds = {"i32": wasmtime.ValType.i32(), "i64": wasmtime.ValType.i64()}
    return wasmtime.FuncType(
        [kinds[k] for k in wasm_param_types(imp.params)], [wasmtime.ValType.i64()]
    )


def _signature(ty: wasmtime.FuncType) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return tuple(str(p) for p in ty.params), tuple(str(r) for r in ty.results)


_ARTIFACT_NAME = re.compile(r"^[0-9a-f]{64}-wasmtime[^/]*\.(cwasm|guest\.json)$")


class ModuleCache:
    """LRU of compiled modules, backed by a disk cache of serialized artifacts keyed by
    sha256(wasm) + wasmtime version + engine configuration.

    The cache directory must be trusted: wasmtime deserializes its files as native code.
    """

    def __init__(self, runtime: WasmRuntime, size: int, directory: Path | None) -> None:
        self._runtime = runtime
        self._size = max(1, size)
        self._dir = directory
        self._entries: OrderedDict[str, LoadedModule] = OrderedDict()
        self._touched: dict[str, float] = {}  # sha -> monotonic time its artifact was touched
        self._lock = threading.Lock()
        self.hits = 0
        self.disk_hits = 0
        self.misses = 0

    def _path(self, sha: str) -> Path | None:
        if self._dir is None:
            return None
        fingerprint = self._runtime.config.fingerprint()
        return self._dir / f"{sha}-wasmtime{WASMTIME_VERSION}-{fingerprint}.cwasm"

    @staticmethod
    def touch(path: Path) -> None:
        """Mark a disk-cache artifact as just used (the pruning removes the oldest)."""
        with contextlib.suppress(OSError):
            os.utime(path)

    # Disk-cache bookkeeping: a module used from memory marks its artifact as used at most
    # this often; the pruning spares artifacts used more recently than the grace period (a
    # process may be about to read them).
    TOUCH_EVERY_S = 3600.0
    PRUNE_GRACE_S = 600.0

    def _touch_from_memory(self, sha: str) -> None:
        """Called under the lock on a memory hit: keep its artifact recent on disk, so a
        module every worker holds in memory is not the first another process prunes."""
        if self._dir is None:
            return
        now = time.monotonic()
        if now - self._touched.get(sha, -self.TOUCH_EVERY_S) < self.TOUCH_EVERY_S:
            return
        self._touched[sha] = now
        path = self._path(sha)
        if path is not None:
            self.touch(path)

    def prune_disk(self, keep: str = "") -> list[str]:
        """Remove the least recently used artifacts of the disk cache (each ``.cwasm`` with
        the description beside it) until it holds at most ``module_cache_max_bytes``.
        Only names this cache writes are considered (``<sha256>-wasmtime…`` and its own
        ``tmp….tmp`` files, those older than a day); artifacts used within the grace period
        and those whose name starts with ``keep`` (the one just written) stay. An error
        (a read-only directory) is logged: pruning never fails a load. Returns the artifact
        names removed."""
        try:
            return self._prune_disk(keep)
        except OSError as exc:
            log.warning("module cache: cannot prune %s: %s", self._dir, exc)
            return []

    def _prune_disk(self, keep: str) -> list[str]:
        limit = self._runtime.config.module_cache_max_bytes
        if self._dir is None or limit <= 0 or not self._dir.is_dir():
            return []
        groups: dict[str, list[tuple[Path, os.stat_result]]] = {}
        now = time.time()
        for path in self._dir.iterdir():
            name = path.name
            try:
                if name.startswith("tmp") and name.endswith(".tmp"):
                    if now - path.stat().st_mtime > 86400:
                        path.unlink(missing_ok=True)
                    continue
                if not _ARTIFACT_NAME.match(name):
                    continue
                st = path.stat()
            except FileNotFoundError:
                continue
            stem = name[: -len(".guest.json")] if name.endswith(".guest.json") else path.stem
            groups.setdefault(stem, []).append((path, st))
        total = sum(st.st_size for files in groups.values() for _, st in files)
        removed: list[str] = []
        if total <= limit:
            return removed
        by_age = sorted(groups.items(), key=lambda item: max(st.st_mtime for _, st in item[1]))
        for stem, files in by_age:
            if total <= limit:
                break
            used = max(st.st_mtime for _, st in files)
            if (keep and stem.startswith(keep)) or now - used < self.PRUNE_GRACE_S:
                continue
            for path, st in files:
                path.unlink(missing_ok=True)
                total -= st.st_size
            removed.append(stem)
        if removed:
            log.info("module cache: removed %d least recently used artifact(s)", len(removed))
        if total > limit:
            log.info("module cache: %d bytes in use, over the %d-byte budget", total, limit)
        return removed

    def peek(self, sha: str) -> LoadedModule | None:
        """The compiled module for ``sha`` if it is in memory (no bytes needed)."""
        with self._lock:
            found = self._entries.get(sha)
            if found is not None:
                self._entries.move_to_end(sha)
                self.hits += 1
                self._touch_from_memory(sha)
            return found

    def get(self, wasm: bytes, sha: str | None = None) -> LoadedModule:
        sha = sha or hashlib.sha256(wasm).hexdigest()
        with self._lock:
            found = self._entries.get(sha)
            if found is not None:
                self._entries.move_to_end(sha)
                self.hits += 1
                self._touch_from_memory(sha)
                return found
        loaded = self._load(wasm, sha)
        with self._lock:
            self._entries[sha] = loaded
            self._entries.move_to_end(sha)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return loaded

    def _load(self, wasm: bytes, sha: str) -> LoadedModule:
        runtime = self._runtime
        path = self._path(sha)
        if detect_kind(wasm) == "component":
            return runtime.components.load(wasm, sha, self, path)
        module: wasmtime.Module | None = None
        if path is not None and path.exists():
            try:
                module = wasmtime.Module.deserialize_file(runtime.engine, str(path))
                self.disk_hits += 1
                self.touch(path)
            except wasmtime.WasmtimeError:
                log.warning("discarding unreadable cached module %s", path)
                path.unlink(missing_ok=True)
        if module is None:
            self.misses += 1
            module = runtime.compile(wasm)
            if path is not None:
                self._store(path, bytes(module.serialize()))
                self.prune_disk(keep=sha)
        info = runtime.describe(module, wasm, sha)
        try:
            pre = runtime.linker.instantiate_pre(module)
        except wasmtime.WasmtimeError as exc:
            raise InvalidModule(f"cannot link the module: {exc}") from None
        return LoadedModule(info, module, pre)

    @staticmethod
    def _store(path: Path, data: bytes) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except OSError as exc:  # a read-only cache is a slower cache, not an error
            log.warning("cannot write module cache %s: %s", path, exc)

    def clear_memory(self) -> None:
        with self._lock:
            self._entries.clear()


class WasmRuntime:
    """Owns the wasmtime engine, the linker with every ABI v1 import, the epoch ticker and
    the module cache. Thread-safe: segments may run on several threads at once."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        wasm_config = wasmtime.Config()
        wasm_config.epoch_interruption = True
        if self.config.fuel:
            wasm_config.consume_fuel = True
        self.engine = wasmtime.Engine(wasm_config)
        self.linker = wasmtime.Linker(self.engine)
        for imp in IMPORTS:
            _define_host_function(self.linker, imp)
        self._ticker = EpochTicker(self.engine, self.config.epoch_tick_s)
        self.modules = ModuleCache(
            self, self.config.module_cache_size, self.config.module_cache_dir
        )

    def close(self) -> None:
        self._ticker.stop()

    @functools.cached_property
    def components(self) -> ComponentBackend:
        """The backend of kind "component" (Python workflows), made on first use."""
        from engine.component import ComponentBackend

        return ComponentBackend(self)

    # --- loading ---

    def compile(self, wasm: bytes) -> wasmtime.Module:
        try:
            return wasmtime.Module(self.engine, wasm)
        except wasmtime.WasmtimeError as exc:
            raise InvalidModule(f"invalid WebAssembly module: {exc}") from None

    def _new_store(self) -> wasmtime.Store:
        cfg = self.config
        store = wasmtime.Store(self.engine)
        store.set_limits(
            memory_size=cfg.memory_limit_bytes,
            table_elements=cfg.max_table_elements,
            instances=cfg.max_instances,
            tables=cfg.max_tables,
            memories=cfg.max_instances,
        )
        store.set_epoch_deadline(cfg.deadline_ticks)
        if cfg.fuel:
            store.set_fuel(cfg.fuel)
        return store

    def describe(self, module: wasmtime.Module, wasm: bytes, sha: str) -> ModuleInfo:
        """Check a module against ABI v1 and say what it offers. Raises InvalidModule with
        the first problem found."""
        imports: list[str] = []
        for imp in module.imports:
            where = f"{imp.module}.{imp.name}"
            declared = IMPORTS_BY_NAME.get(imp.name or "")
            if imp.module != "env" or declared is None:
                raise InvalidModule(f"the module imports {where}, which is not part of ABI v1")
            if not isinstance(imp.type, wasmtime.FuncType):
                raise InvalidModule(f"the module imports {where} as a non-function")
            expected = _signature(_func_type(declared))
            if _signature(imp.type) != expected:
                raise InvalidModule(
                    f"the module imports {where} with type {_signature(imp.type)}, "
                    f"but ABI v1 declares {expected}"
                )
            imports.append(imp.name or "")
        entry_sig = (("i32", "i32"), ("i64",))
        entries: list[str] = []
        exports: dict[str, Any] = {}
        for exp in module.exports:
            exports[exp.name] = exp.type
            if isinstance(exp.type, wasmtime.FuncType) and _signature(exp.type) == entry_sig:
                entries.append(exp.name)
        if not isinstance(exports.get(EXPORT_MEMORY), wasmtime.MemoryType):
            raise InvalidModule(f"the module must export its linear memory as {EXPORT_MEMORY!r}")
        alloc = exports.get(EXPORT_ALLOC)
        if not isinstance(alloc, wasmtime.FuncType) or _signature(alloc) != (("i32",), ("i32",)):
            raise InvalidModule(f"the module must export {EXPORT_ALLOC}: (size: i32) -> i32")
        if not entries:
            raise InvalidModule(
                "the module exports no entry point: an export (ptr: i32, len: i32) -> i64, "
                f"by default named {DEFAULT_ENTRY_POINT!r}"
            )
        abi_version = 1
        version_type = exports.get(EXPORT_ABI_VERSION)
        if version_type is not None:
            if not isinstance(version_type, wasmtime.FuncType) or _signature(version_type) != (
                (),
                ("i32",),
            ):
                raise InvalidModule(f"{EXPORT_ABI_VERSION} must be a function () -> i32")
            abi_version = self._read_abi_version(module)
            if abi_version not in SUPPORTED_ABI_VERSIONS:
                raise UnsupportedAbiVersion(
                    f"the module declares guest ABI version {abi_version}; this host serves "
                    f"version(s) {', '.join(map(str, sorted(SUPPORTED_ABI_VERSIONS)))}"
                )
        return ModuleInfo(
            sha256=sha,
            kind="core",
            abi_version=abi_version,
            entry_points=tuple(entries),
            imports=tuple(imports),
            size=len(wasm),
        )

    def _read_abi_version(self, module: wasmtime.Module) -> int:
        store = self._new_store()
        try:
            instance = self.linker.instantiate(store, module)
            fn = instance.exports(store)[EXPORT_ABI_VERSION]
            assert isinstance(fn, wasmtime.Func)
            return int(fn(store))
        except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
            raise InvalidModule(f"calling {EXPORT_ABI_VERSION} failed: {exc}") from None
        except WorkflowExit as exc:
            raise InvalidModule(f"calling {EXPORT_ABI_VERSION} failed: {exc}") from None

    def inspect(self, wasm: bytes) -> ModuleInfo:
        """Validate ``wasm`` for deployment (compiling and caching it) and describe it."""
        if not wasm:
            raise InvalidModule("the module is empty")
        return self.load(wasm).info

    def load(self, wasm: bytes, sha: str | None = None) -> LoadedModule:
        return self.modules.get(wasm, sha)

    # --- running ---

    def run_segment(
        self,
        module: LoadedModule,
        run: RunInfo,
        history: Sequence[EncodedEvent],
        storage: WorkflowStorage,
        services: Services,
        clock: Callable[[], int] | None = None,
    ) -> SegmentResult:
        """Instantiate ``module`` and run ``run`` from the start against ``history``.

        Returns the segment's result; raises :class:`FenceLost` when another worker owns the
        run now (nothing of this segment may be written then).
        """
        if module.info.kind == "component":
            return self.components.run_segment(module, run, history, storage, services, clock)
        started = time.monotonic()
        try:
            session = ExecutionSession(run, history, storage, services, self.config, clock)
        except HistoryCorrupt as exc:
            return _without_session(failed(ErrorCode.HISTORY_CORRUPT, str(exc)), started)
        if run.entry_point not in module.info.entry_points:
            outcome: Outcome = failed(
                ErrorCode.INVALID_MODULE,
                f"entry point {run.entry_point!r} is not exported (the module offers: "
                f"{', '.join(module.info.entry_points)})",
            )
            return session.result(outcome, time.monotonic() - started)
        store = self._new_store()
        instance: CoreInstance | None = None
        try:
            raw_instance = module.pre.instantiate(store)
            instance = CoreInstance(
                store, raw_instance, self.config, started, lambda: session.io_seconds
            )
        except (wasmtime.Trap, wasmtime.WasmtimeError, InvalidModule) as exc:
            return session.result(self._classify(exc, session, None), time.monotonic() - started)
        except GuestFault as exc:  # a start function called a host import
            outcome = failed(ErrorCode.GUEST_FAULT, str(exc))
            return session.result(outcome, time.monotonic() - started)
        session.bind(instance)
        previous = getattr(_current, "frame", None)
        _current.frame = (session, instance)
        try:
            reply = instance.call_export(run.entry_point, run.input)
            outcome = session.finish(reply)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            outcome = self._classify(exc, session, instance)
        finally:
            _current.frame = previous
        return session.result(outcome, time.monotonic() - started)

    def _classify(
        self, exc: BaseException, session: ExecutionSession, instance: CoreInstance | None
    ) -> Outcome:
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
            case NondeterminismError():
                return failed(ErrorCode.NONDETERMINISM, str(reason))
            case HistoryCorrupt():
                return failed(ErrorCode.HISTORY_CORRUPT, str(reason))
            case InvalidModule():
                return failed(ErrorCode.INVALID_MODULE, str(reason))
            case StorageError():
                return failed(ErrorCode.INTERNAL, f"storage failed: {reason}")
            case wasmtime.Trap():
                return self._classify_trap(reason, instance)
            case wasmtime.WasmtimeError():
                text = str(reason)
                if "limit" in text or "exceeds" in text or "memory" in text:
                    return failed(ErrorCode.RESOURCE_LIMIT, text)
                return failed(ErrorCode.PANIC, text)
        log.error("host error in run %s", session.ref.run_id, exc_info=reason)
        return failed(ErrorCode.INTERNAL, f"host error: {type(reason).__name__}: {reason}")

    def _classify_trap(self, trap: wasmtime.Trap, instance: CoreInstance | None) -> Outcome:
        code = trap.trap_code
        cfg = self.config
        if code == wasmtime.TrapCode.INTERRUPT:
            return failed(
                ErrorCode.TIMEOUT,
                f"the execution segment exceeded its {cfg.segment_timeout_s:g} s deadline",
            )
        if code == wasmtime.TrapCode.OUT_OF_FUEL:
            return failed(
                ErrorCode.RESOURCE_LIMIT, f"the guest used up its fuel ({cfg.fuel} units)"
            )
        if code == wasmtime.TrapCode.STACK_OVERFLOW:
            return failed(ErrorCode.RESOURCE_LIMIT, "the guest exhausted its call stack")
        message = trap.message
        at_limit = (
            instance is not None and instance.memory_size() + WASM_PAGE > cfg.memory_limit_bytes
        )
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


def _without_session(outcome: Outcome, started: float) -> SegmentResult:
    return SegmentResult(
        outcome=outcome,
        new_events=(),
        recorded=(),
        query_state={},
        replayed_steps=0,
        next_step=0,
        elapsed_s=time.monotonic() - started,
    )


__all__ = [
    "CoreInstance",
    "LoadedModule",
    "ModuleCache",
    "ModuleInfo",
    "Status",
    "WasmRuntime",
    "detect_kind",
]
