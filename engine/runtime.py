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

import ctypes
import hashlib
import importlib.metadata
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import wasmtime
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
    arg_decoder,
    pack,
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
from engine.services import Services
from engine.session import (
    ContinueAsNew,
    ContinuedAsNew,
    ExecutionSession,
    Outcome,
    Reply,
    RunInfo,
    SegmentResult,
    Suspend,
    Suspended,
    failed,
)
from engine.status import Status
from engine.storage import WorkflowStorage

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


# The session and instance of the segment running on this thread, for the host functions
# (defined once per engine, so they cannot close over a segment).
_current = threading.local()


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
        self.ctx: Any = store  # the store, or the Caller of the host call in progress
        self.config = config
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

    # --- memory ---

    def _base_and_size(self) -> tuple[int, int]:
        ctx = self.ctx
        size = self.memory.data_len(ctx)
        base = ctypes.addressof(self.memory.data_ptr(ctx).contents)
        return base, size

    def read_bytes(self, function: str, ptr: int, length: int, limit: int) -> bytes:
        ptr &= 0xFFFFFFFF
        length &= 0xFFFFFFFF
        if length > limit:
            raise GuestFault(
                function, f"a string of {length} bytes exceeds the {limit}-byte maximum"
            )
        base, size = self._base_and_size()
        if ptr + length > size:
            raise GuestFault(
                function,
                f"pointer {ptr} with length {length} is outside linear memory ({size} bytes)",
            )
        return ctypes.string_at(base + ptr, length)

    def read_string(self, function: str, ptr: int, length: int) -> str:
        raw = self.read_bytes(function, ptr, length, self.config.max_string_bytes)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GuestFault(
                function, f"string at {ptr} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None

    def write(self, function: str, data: bytes) -> int:
        """Allocate ``len(data)`` bytes through ``cleat_alloc`` and copy ``data`` there."""
        n = len(data)
        ptr = int(self._alloc(self.ctx, n)) & 0xFFFFFFFF
        base, size = self._base_and_size()
        if ptr + n > size:
            raise GuestFault(
                function,
                f"{EXPORT_ALLOC}({n}) returned {ptr}, outside linear memory ({size} bytes)",
            )
        ctypes.memmove(base + ptr, data, n)
        return ptr

    def write_reply(self, function: str, reply: Reply) -> int:
        data = bytes((reply.status,)) + reply.payload.encode()
        return pack(self.write(function, data), len(data))

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
            raise GuestFault(name, f"the module has no export {name!r}")
        data = payload.encode()
        ptr = self.write(name, data)
        return self.read_reply(name, fn(self.ctx, ptr, len(data)))

    def refresh_deadline(self, io_seconds: float) -> None:
        guest_seconds = time.monotonic() - self._started - self._io_seconds()
        remaining = self.config.segment_timeout_s - guest_seconds
        ticks = max(1, round(remaining / self.config.epoch_tick_s))
        wasmtime_ffi.wasmtime_context_set_epoch_deadline(self.ctx._context(), ticks)

    def memory_size(self) -> int:
        try:
            return int(self.memory.data_len(self.store))
        except Exception:
            return 0


def _host_function(imp: HostImport) -> Callable[..., int]:
    decode = arg_decoder(imp.params)
    name = imp.name
    packed = imp.returns == "P"

    def host(caller: Any, *raw: Any) -> int:
        frame = getattr(_current, "frame", None)
        if frame is None:
            # Only reachable from a start function at inspection time.
            raise GuestFault(name, "host functions cannot be called while the module starts")
        session, instance = frame
        previous = instance.ctx
        instance.ctx = caller
        try:
            args = decode(lambda p, n: instance.read_string(name, p, n), raw)
            result = getattr(session, name)(*args)
            if packed:
                return int(instance.write_reply(name, result))
            return int(result)
        except BaseException as exc:
            if session.exit is None:
                session.exit = exc
            raise
        finally:
            instance.ctx = previous

    return host


def _func_type(imp: HostImport) -> wasmtime.FuncType:
    kinds = {"i32": wasmtime.ValType.i32(), "i64": wasmtime.ValType.i64()}
    return wasmtime.FuncType(
        [kinds[k] for k in wasm_param_types(imp.params)], [wasmtime.ValType.i64()]
    )


def _signature(ty: wasmtime.FuncType) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return tuple(str(p) for p in ty.params), tuple(str(r) for r in ty.results)


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
        self._lock = threading.Lock()
        self.hits = 0
        self.disk_hits = 0
        self.misses = 0

    def _path(self, sha: str) -> Path | None:
        if self._dir is None:
            return None
        fingerprint = self._runtime.config.fingerprint()
        return self._dir / f"{sha}-wasmtime{WASMTIME_VERSION}-{fingerprint}.cwasm"

    def get(self, wasm: bytes, sha: str | None = None) -> LoadedModule:
        sha = sha or hashlib.sha256(wasm).hexdigest()
        with self._lock:
            found = self._entries.get(sha)
            if found is not None:
                self._entries.move_to_end(sha)
                self.hits += 1
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
        kind = detect_kind(wasm)
        if kind != "core":
            raise InvalidModule("this is a component; it needs the component backend")
        path = self._path(sha)
        module: wasmtime.Module | None = None
        if path is not None and path.exists():
            try:
                module = wasmtime.Module.deserialize_file(runtime.engine, str(path))
                self.disk_hits += 1
            except wasmtime.WasmtimeError:
                log.warning("discarding unreadable cached module %s", path)
                path.unlink(missing_ok=True)
        if module is None:
            self.misses += 1
            module = runtime.compile(wasm)
            if path is not None:
                self._store(path, bytes(module.serialize()))
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
            self.linker.define_func(
                "env", imp.name, _func_type(imp), _host_function(imp), access_caller=True
            )
        self._ticker = EpochTicker(self.engine, self.config.epoch_tick_s)
        self.modules = ModuleCache(
            self, self.config.module_cache_size, self.config.module_cache_dir
        )

    def close(self) -> None:
        self._ticker.stop()

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
