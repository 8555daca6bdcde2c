"""The backend of core modules: guest ABI v1 as ``env`` imports, host functions defined once
per engine, a fresh store per execution segment.

Budgets: epoch interruption is always on (the runtime's ticker thread advances the epoch
every ``epoch_tick_s``), so a guest that never calls the host still stops at its deadline;
fuel is optional. Time a host call spends waiting on I/O (a service call) is given back to
the deadline: the deadline bounds the guest's own work, not the latency of the services it
uses.

What ends a segment is mapped to an :class:`~engine.errors.ErrorCode` by ``engine.traps``,
at the boundary; nothing from wasmtime leaks to callers.
"""

from __future__ import annotations

import ctypes
import logging
import struct
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import wasmtime
import wasmtime._func as wasmtime_func
from wasmtime import _ffi as wasmtime_ffi

from engine.abi import (
    DEFAULT_ENTRY_POINT,
    EXPORT_ABI_VERSION,
    EXPORT_ALLOC,
    EXPORT_MEMORY,
    HOST_IMPORTS,
    HOST_IMPORTS_BY_NAME,
    SUPPORTED_ABI_VERSIONS,
    HostImport,
    unpack,
    wasm_param_types,
)
from engine.backend import (
    ArtifactCache,
    LoadedModule,
    ModuleInfo,
    has_start_function,
    new_store,
)
from engine.config import EngineConfig
from engine.errors import (
    ErrorCode,
    GuestFault,
    HistoryCorrupt,
    InvalidModule,
    UnsupportedAbiVersion,
    WorkflowExit,
)
from engine.events import EncodedEvent
from engine.ffi import (
    ERROR_PTR,
    NO_FINALIZER,
    ONE,
    SLOT_FORMAT,
    STATUS_BYTE,
    TRAP_PTR,
    TWO,
    U64,
    CallerContext,
    HostCallback,
    caller_context,
    define_func_unchecked,
    func_call,
    instance_export,
    instantiate,
    memory_data,
    memory_data_size,
    set_epoch_deadline,
)
from engine.outcomes import Outcome, SegmentResult, failed
from engine.services import Services
from engine.session import ExecutionSession, Reply, RunInfo
from engine.storage import WorkflowStorage
from engine.traps import classify

log = logging.getLogger("cleat.engine")

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
        # The store, or the CallerContext of the host call in progress; and its
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
        self._instance = instance
        memory = instance_export(self._context_ptr, instance, EXPORT_MEMORY)
        alloc = instance_export(self._context_ptr, instance, EXPORT_ALLOC)
        if not isinstance(memory, wasmtime.Memory):
            raise InvalidModule(f"the module does not export its memory as {EXPORT_MEMORY!r}")
        if not isinstance(alloc, wasmtime.Func):
            raise InvalidModule(f"the module does not export {EXPORT_ALLOC}(size: i32) -> i32")
        self.memory: wasmtime.Memory = memory
        self._alloc: wasmtime.Func = alloc
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
        at = (memory_data(context, ref) or 0, memory_data_size(context, ref))
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
        self._checked_call(self._alloc_ref, self._alloc_params, self._alloc_results)
        return self._alloc_ptr.value

    def _call_entry(self, name: str, fn: wasmtime.Func, ptr: int, length: int) -> int:
        """An entry point ``(ptr: i32, len: i32) -> i64`` (checked when the module was
        loaded), called through the C API as :meth:`_call_alloc` is: ``Func.__call__``'s
        generic layer cost about as much as the rest of a timer's segment in the engine."""
        params = (wasmtime_ffi.wasmtime_val_t * 2)()
        for slot, value in zip(params, (ptr, length), strict=True):
            slot.kind = wasmtime_ffi.WASMTIME_I32.value
            slot.of.i32 = value
        results = (wasmtime_ffi.wasmtime_val_t * 1)()
        self._checked_call(ctypes.byref(fn._func), params, results, TWO)
        result = results[0]
        kind = cast(int, result.kind)  # a c_uint8 field reads as an int
        if kind == wasmtime_ffi.WASMTIME_I64.value:
            return int(result.of.i64)
        if kind == wasmtime_ffi.WASMTIME_I32.value:  # read as Func.__call__ reads it
            return int(result.of.i32)
        raise GuestFault(name, "returned a value that is not an integer")

    def _checked_call(self, func: Any, params: Any, results: Any, n_params: Any = ONE) -> None:
        """``wasmtime_func_call`` in this instance's store, one result: an error or a trap
        raised as wasmtime-py's ``Func.__call__`` raises it, a host function's exception
        first (wasmtime-py keeps it aside while the trap unwinds the guest)."""
        trap = TRAP_PTR()
        error = func_call(
            self._context_ptr, func, params, n_params, results, ONE, ctypes.byref(trap)
        )
        if error:
            failure = wasmtime.WasmtimeError._from_ptr(ctypes.cast(error, ERROR_PTR))
            wasmtime_func.maybe_raise_last_exn()
            raise failure
        if trap:
            trapped = wasmtime.Trap._from_ptr(trap)
            wasmtime_func.maybe_raise_last_exn()
            raise trapped

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
        head = STATUS_BYTE[status] if 0 <= status < 256 else bytes((status,))
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
            found = instance_export(self._context_ptr, self._instance, name)
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
        packed = self._call_entry(name, fn, ptr, len(data))
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
        set_epoch_deadline(self._context_ptr, U64(ticks))

    def memory_size(self) -> int:
        try:
            return int(self.memory.data_len(self.store))
        except Exception:
            return 0


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
    layout = struct.Struct("=" + "".join(SLOT_FORMAT[t] for t in wasm_param_types(imp.params)))
    slots = ctypes.c_char * layout.size
    unpack_slots = layout.unpack_from
    result_slot = ctypes.c_int64

    def host(env: int | None, caller: int, values: int, count: int) -> int:
        pointer = caller_context(caller)
        context = CallerContext(pointer)
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

    return HostCallback(host)


# One callback per import for the whole process: every linker, and every store instantiated
# through one, calls into them, and ctypes frees a callback when its object is collected.
_HOST_CALLBACKS: dict[str, Any] = {imp.name: _host_function(imp) for imp in HOST_IMPORTS}


def _define_host_function(linker: wasmtime.Linker, imp: HostImport) -> None:
    module, name = b"env", imp.name.encode()
    ty = _func_type(imp)  # kept referenced until the call returns: it owns the C type
    error = define_func_unchecked(
        linker.ptr(),
        ctypes.create_string_buffer(module),
        ctypes.c_size_t(len(module)),
        ctypes.create_string_buffer(name),
        ctypes.c_size_t(len(name)),
        ty.ptr(),
        _HOST_CALLBACKS[imp.name],
        None,
        NO_FINALIZER,
    )
    if error:
        raise wasmtime.WasmtimeError._from_ptr(ctypes.cast(error, ERROR_PTR))


def _func_type(imp: HostImport) -> wasmtime.FuncType:
    kinds = {"i32": wasmtime.ValType.i32(), "i64": wasmtime.ValType.i64()}
    return wasmtime.FuncType(
        [kinds[k] for k in wasm_param_types(imp.params)], [wasmtime.ValType.i64()]
    )


def _signature(ty: wasmtime.FuncType) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return tuple(str(p) for p in ty.params), tuple(str(r) for r in ty.results)


class CoreBackend:
    """Loads and runs core modules on the runtime's engine: the linker with every ABI v1
    import (defined once), the ABI check, and the segment. Thread-safe."""

    def __init__(self, engine: wasmtime.Engine, config: EngineConfig) -> None:
        self.engine = engine
        self.config = config
        self.linker = wasmtime.Linker(engine)
        for imp in HOST_IMPORTS:
            _define_host_function(self.linker, imp)

    # --- loading ---

    def compile(self, wasm: bytes) -> wasmtime.Module:
        try:
            return wasmtime.Module(self.engine, wasm)
        except wasmtime.WasmtimeError as exc:
            raise InvalidModule(f"invalid WebAssembly module: {exc}") from None

    def describe(self, module: wasmtime.Module, wasm: bytes, sha: str) -> ModuleInfo:
        """Check a module against ABI v1 and say what it offers. Raises InvalidModule with
        the first problem found."""
        imports: list[str] = []
        for imp in module.imports:
            where = f"{imp.module}.{imp.name}"
            declared = HOST_IMPORTS_BY_NAME.get(imp.name or "")
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
        store = new_store(self.engine, self.config)
        try:
            instance = self.linker.instantiate(store, module)
            fn = instance.exports(store)[EXPORT_ABI_VERSION]
            assert isinstance(fn, wasmtime.Func)
            return int(fn(store))
        except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
            raise InvalidModule(f"calling {EXPORT_ABI_VERSION} failed: {exc}") from None
        except WorkflowExit as exc:
            raise InvalidModule(f"calling {EXPORT_ABI_VERSION} failed: {exc}") from None

    def load(self, wasm: bytes, sha: str, cache: ArtifactCache, path: Path | None) -> LoadedModule:
        """Compile ``wasm`` (or read it from the disk cache at ``path``), check it against
        ABI v1 and pre-link it."""
        module: wasmtime.Module | None = None
        if path is not None and path.exists():
            try:
                module = wasmtime.Module.deserialize_file(self.engine, str(path))
                cache.disk_hits += 1
                cache.touch(path)
            except wasmtime.WasmtimeError:
                log.warning("discarding unreadable cached module %s", path)
                path.unlink(missing_ok=True)
        if module is None:
            cache.misses += 1
            module = self.compile(wasm)
            if path is not None:
                cache.store_artifact(path, bytes(module.serialize()))
                cache.prune_disk(keep=sha)
        info = self.describe(module, wasm, sha)
        try:
            pre = self.linker.instantiate_pre(module)
        except wasmtime.WasmtimeError as exc:
            raise InvalidModule(f"cannot link the module: {exc}") from None
        return LoadedModule(info, module, pre, no_start=not has_start_function(wasm))

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
        store = new_store(self.engine, self.config)
        instance: CoreInstance | None = None
        try:
            if module.no_start:
                raw_instance = instantiate(module.pre, store)
            else:
                raw_instance = module.pre.instantiate(store)
            instance = CoreInstance(
                store, raw_instance, self.config, started, lambda: session.io_seconds
            )
        except (wasmtime.Trap, wasmtime.WasmtimeError, InvalidModule) as exc:
            outcome = classify(exc, session, self.config, None)
            return session.result(outcome, time.monotonic() - started)
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
            outcome = classify(exc, session, self.config, instance)
        finally:
            _current.frame = previous
        return session.result(outcome, time.monotonic() - started)


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
