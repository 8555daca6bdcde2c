"""The component backend: Python workflows (componentize-py) on wasmtime's component model.

A component runs on the same engine, epoch ticker, limits and :class:`ExecutionSession` as
a core module; only the boundary differs. ``sdk/wit/workflow.wit`` (world
``cleat:workflow/workflow@1.0.0``) is the contract: its ``host`` interface offers every
ABI v1 operation under the same name in kebab-case, and each is served by the session
method of the same name, exactly as the core module's ``env`` imports are. So recording,
replay, suspension (raising out of the host function) and non-determinism checks are the
core ones, not a second implementation.

Design note
-----------
**WASI.** CPython needs about 25 WASI interfaces (streams, environment, filesystem types,
...). They come from wasmtime's own implementation (``Linker.add_wasip2``) with a WASI
context that has no preopened directory, no network and no inherited environment, so a
workflow can neither read files nor open sockets. Five interfaces are replaced by our own
definitions, because their answers must replay: ``wasi:clocks/wall-clock`` and
``wasi:clocks/monotonic-clock`` serve the run's virtual time (``session.now()``), and
``wasi:random/random``, ``insecure`` and ``insecure-seed`` serve the run's random stream
(``session.random_bytes``). ``time.time()``, ``datetime.now()``, ``time.monotonic()``,
``random.random()`` (componentize-py seeds it from ``wasi:random`` when the instance first
runs) and ``uuid.uuid4()`` thus return the same values on every replay. Waiting on the
monotonic clock (``time.sleep``, asyncio timers) is a guest fault: it would block the worker
and not survive a crash; ``ctx.sleep`` is the durable wait.

The replacements are defined under the exact versioned names the component imports (for
example ``wasi:clocks/wall-clock@0.2.9``), with shadowing allowed, so they win over
wasmtime's semver-compatible definitions. ``define_unknown_imports_as_traps`` was tried and
dropped: it defines traps at the exact import names, which then also win over wasmtime's
semver-matched WASI, and CPython trapped in ``wasi:cli/environment#get-environment``.

**Updates and defers without re-entry.** A component cannot be entered while it is inside
a host call, so the host cannot call an update handler from within a blocking operation the
way it does for a core module (``GuestBackend.supports_reentry`` is False here). Instead the
guest SDK asks before each blocking operation: ``updates.take`` answers with the next update
to apply at this point of the run, recorded as an ``UpdateAppliedEvent`` on first execution
and replayed from it afterwards; the SDK runs its handler in the guest and reports the
outcome with ``updates.complete``. Defers need no such thing: the session calls them after
the entry point has returned, through the world's ``dispatch`` export.

**Loading.** Components are compiled once and cached like core modules (memory LRU, then
the disk cache of serialized artifacts keyed by sha256 + wasmtime version + configuration).
At load the component is instantiated once and its ``describe`` export read: the entry
points and handler names it offers. ``has_export`` answers from that list, because it is
asked from inside host calls (``durable_defer``, ``register_update_handler``), when the guest
cannot be asked. wasmtime's C API has no component ``InstancePre``: every segment links
through ``Linker.instantiate``.
"""

from __future__ import annotations

import ctypes
import json
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import wasmtime
import wasmtime.component as wc
import wasmtime.component._enter as component_enter
from wasmtime import _ffi as wasmtime_ffi

from engine.abi import (
    DEFAULT_ENTRY_POINT,
    EXTENSION_IMPORTS,
    HOST_IMPORTS,
    IMPORTS,
    SUPPORTED_ABI_VERSIONS,
    HostImport,
)
from engine.backend import ArtifactCache, LoadedModule, ModuleInfo, new_store
from engine.config import EngineConfig
from engine.errors import (
    ErrorCode,
    GuestFault,
    HistoryCorrupt,
    InvalidModule,
    UnsupportedAbiVersion,
    WorkflowExit,
)
from engine.events import EncodedEvent, UpdateAppliedEvent
from engine.ffi import NO_FINALIZER, CallerContext, libwasmtime_held, set_epoch_deadline
from engine.module_cache import description_path
from engine.outcomes import AppliedUpdate, Outcome, SegmentResult, failed
from engine.ready_instances import GuestOutput, ReadyInstances
from engine.services import Services
from engine.session import ExecutionSession, Reply, RunInfo
from engine.status import AbiStatus
from engine.storage import WorkflowStorage
from engine.traps import classify_component, classify_component_reply
from engine.warm_pages import WarmPages

log = logging.getLogger("cleat.engine")
guest_log = logging.getLogger("cleat.guest")

WIT_PACKAGE = "cleat:workflow"
WIT_VERSION = "1.0.0"
HOST_INTERFACE = f"{WIT_PACKAGE}/host@{WIT_VERSION}"
UPDATES_INTERFACE = f"{WIT_PACKAGE}/updates@{WIT_VERSION}"
# The optional extension interface (sdk/wit/batch.wit), not part of ABI v1's world: it holds
# the extension imports (engine.abi.EXTENSION_IMPORTS) under their kebab-case names.
BATCH_INTERFACE = f"{WIT_PACKAGE}/batch@{WIT_VERSION}"
EXPORT_RUN = "run"
EXPORT_DISPATCH = "dispatch"
EXPORT_DESCRIBE = "describe"

# WASI interfaces the host answers itself, deterministically (see the design note).
WALL_CLOCK = "wasi:clocks/wall-clock"
MONOTONIC_CLOCK = "wasi:clocks/monotonic-clock"
RANDOM = "wasi:random/random"
INSECURE_RANDOM = "wasi:random/insecure"
INSECURE_SEED = "wasi:random/insecure-seed"
DETERMINISTIC_WASI = (WALL_CLOCK, MONOTONIC_CLOCK, RANDOM, INSECURE_RANDOM, INSECURE_SEED)

_NS_PER_MS = 1_000_000


def wit_name(abi_name: str) -> str:
    """The WIT name of an ABI v1 import: ``durable_call`` -> ``durable-call``."""
    return abi_name.replace("_", "-")


def _unversioned(name: str) -> str:
    return name.split("@", 1)[0]


# The session and instance of the segment running on this thread (host functions are
# defined once per linker, so they cannot close over a segment).
_current = threading.local()


def _frame() -> tuple[ComponentSession, ComponentInstance] | None:
    frame: tuple[ComponentSession, ComponentInstance] | None = getattr(_current, "frame", None)
    return frame


def _record(**fields: Any) -> wc.Record:
    record = wc.Record()
    for key, value in fields.items():
        setattr(record, key, value)
    return record


# --- the session, extended with update delivery for guests that cannot be re-entered --------


class ComponentSession(ExecutionSession):
    """An :class:`ExecutionSession` whose updates are taken by the guest (``updates.take``)
    instead of being pushed into it from inside a blocking call.

    The recorded events are the core ones: an ``UpdateAppliedEvent`` at the step where the
    update was applied, followed by the steps of its handler. Replay reaches a recorded update
    through the session's usual look-ahead, which hands it to :meth:`_run_update`; here that
    queues it for the guest's next ``take`` rather than calling the handler.
    """

    def __init__(
        self,
        run: RunInfo,
        history: Sequence[EncodedEvent],
        storage: WorkflowStorage,
        services: Services,
        config: EngineConfig,
        clock: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(run, history, storage, services, config, clock)
        self._updates_due: deque[UpdateAppliedEvent] = deque()
        self._updates_taken: set[str] = set()
        # Where the guest's code was when it last announced a clock wait (GUEST_WAIT_MARK).
        self.wait_location = ""

    def _run_update(self, event: UpdateAppliedEvent) -> None:
        self._applied_update_ids.add(event.update_id)
        self._updates_due.append(event)

    def take_update(self) -> UpdateAppliedEvent | None:
        """The next update to apply at this point of the run, or None.

        Replaying, the updates recorded here; at the end of the history, the pending updates
        in storage, each recorded now. An update without a registered handler is answered
        NOT_FOUND at once, like the core path does, and not handed to the guest.
        """
        while True:
            if not self._updates_due and self._peek_recorded() is None:
                self._apply_pending_updates()
            if not self._updates_due:
                return None
            event = self._updates_due.popleft()
            if event.name in self._update_handlers:
                self._updates_taken.add(event.update_id)
                return event
            self._applied_updates.append(
                AppliedUpdate(
                    event.update_id,
                    AbiStatus.NOT_FOUND,
                    f"no update handler named {event.name!r} is registered",
                )
            )

    def complete_update(self, update_id: str, status: int, payload: str) -> None:
        """The guest's handler for ``update_id`` returned ``status`` and ``payload``."""
        if update_id not in self._updates_taken:
            raise GuestFault("updates.complete", f"update {update_id!r} was not taken")
        self._updates_taken.discard(update_id)
        self._applied_updates.append(AppliedUpdate(update_id, status, payload))


def resolve_entry(guest: GuestInfo, run: RunInfo) -> str | None:
    """The workflow a run starts. A Python module may hold several workflows; the default
    entry point ("run") starts the one named like the definition, else the module's only
    one. Children and schedules start definitions by name, so deploying a module under a
    workflow's name is all it takes to start that workflow."""
    entry = run.entry_point
    if entry in guest.entries:
        return entry
    if entry == DEFAULT_ENTRY_POINT:
        if run.definition in guest.entries:
            return run.definition
        if len(guest.entries) == 1:
            return guest.entries[0]
    return None


# --- one instantiated component -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GuestInfo:
    """What a built guest offers (its ``describe`` export)."""

    abi_version: int
    entries: tuple[str, ...]
    handlers: frozenset[str]


@dataclass(frozen=True, slots=True)
class LoadedComponent(LoadedModule):
    """A compiled component, cached and passed around like a core module. The inherited
    ``module`` and ``pre`` hold an empty core module: a component has none, and the runtime
    routes kind "component" here before it would use them."""

    component: wc.Component
    guest: GuestInfo


class ComponentInstance:
    """One instantiated component for one segment: the :class:`GuestBackend` of a session."""

    supports_reentry = False

    def __init__(
        self,
        store: wasmtime.Store,
        instance: wc.Instance,
        guest: GuestInfo,
        config: EngineConfig,
        started: float,
        io_seconds: Callable[[], float],
        exports: tuple[wc.Func, wc.Func] | None = None,
    ) -> None:
        """``exports``: ``run`` and ``dispatch``, when they were looked up with the instance
        (:attr:`Prepared.exports`); else looked up here."""
        self.store = store
        # The store, or the StoreContext of the host call in progress.
        self.ctx: Any = store
        self.guest = guest
        self.config = config
        self._started = started
        self._io_seconds = io_seconds
        if exports is None:
            exports = _segment_exports(store, instance)
        if exports is None:
            raise InvalidModule(
                f"the component does not export {EXPORT_RUN!r} and {EXPORT_DISPATCH!r}"
            )
        self._run, self._dispatch = exports

    def _reply(self, function: str, value: Any) -> Reply:
        limit = self.config.max_string_bytes
        if isinstance(value, str):
            if len(value) > limit // 4 and len(value.encode()) > limit:
                raise GuestFault(function, f"returned a result over the {limit}-byte maximum")
            return Reply(AbiStatus.OK, value)
        status = int(getattr(value, "status", AbiStatus.ERROR))
        message = str(getattr(value, "message", ""))
        if status == AbiStatus.OK:
            raise GuestFault(function, "returned an error with status 0 (OK)")
        return Reply(status, message[: limit + 1])

    def _call(self, function: str, func: wc.Func, *args: str) -> Reply:
        value = _call_export(function, func, self.store, args)
        func.post_return(self.store)
        return self._reply(function, value)

    def run(self, entry: str, input: str) -> Reply:
        return self._call(EXPORT_RUN, self._run, entry, input)

    # --- GuestBackend ---

    def has_export(self, name: str) -> bool:
        return name in self.guest.handlers

    def call_export(self, name: str, payload: str) -> Reply:
        if name not in self.guest.handlers:
            raise GuestFault(name, f"the component has no handler {name!r}")
        return self._call(EXPORT_DISPATCH, self._dispatch, name, payload)

    def refresh_deadline(self, io_seconds: float) -> None:
        guest_seconds = time.monotonic() - self._started - self._io_seconds()
        remaining = self.config.segment_timeout_s - guest_seconds
        ticks = max(1, round(remaining / self.config.epoch_tick_s))
        context = self.ctx._context()
        if isinstance(context, int):  # a host call's context (``_RawCallback``)
            context = ctypes.c_void_p(context)
        set_epoch_deadline(context, ctypes.c_uint64(ticks))


@dataclass(frozen=True, slots=True)
class Prepared:
    """A store and a fresh instance in it, not yet called; ``output`` routes its guest
    output to the run that takes it."""

    store: wasmtime.Store
    instance: wc.Instance
    output: GuestOutput
    # ``run`` and ``dispatch``, looked up with the instance (about 35 µs, off a ready
    # instance's segment); None when the component lacks one (the segment reports it).
    exports: tuple[wc.Func, wc.Func] | None = None


def _segment_exports(
    store: wasmtime.Store, instance: wc.Instance
) -> tuple[wc.Func, wc.Func] | None:
    """The component's ``run`` and ``dispatch`` exports, or None if it lacks one."""
    run = instance.get_func(store, EXPORT_RUN)
    dispatch = instance.get_func(store, EXPORT_DISPATCH)
    return (run, dispatch) if run is not None and dispatch is not None else None


def _close_store(prepared: Prepared) -> None:
    prepared.store.close()


def _component_key(loaded: LoadedComponent) -> str:
    return loaded.info.sha256


# --- host functions -----------------------------------------------------------------------


# The ABI operations are the hot path (one call per durable step), so they are served by C
# callbacks of their own instead of wasmtime-py's generic ``LinkerInstance.add_func``, which
# rebuilds the function's type and converts every value through its ``ValType`` classes on
# each call (it cost about 115 µs more per durable step). Each callback knows its import's
# WIT signature: it reads the arguments straight from the ``wasmtime_component_val_t`` slots
# and writes the result the same way. wasmtime does not check the types of a dynamically
# defined function when it links a component, so ``ComponentBackend.describe`` checks every
# imported host function against ABI v1 before any instance is made, and each call checks its
# argument count.
_ffi: Any = wasmtime_ffi
_KIND_U8 = _ffi.WASMTIME_COMPONENT_U8.value
_KIND_S64 = _ffi.WASMTIME_COMPONENT_S64.value
_KIND_STRING = _ffi.WASMTIME_COMPONENT_STRING.value
_KIND_RECORD = _ffi.WASMTIME_COMPONENT_RECORD.value
_KIND_RESULT = _ffi.WASMTIME_COMPONENT_RESULT.value


def _write_error_reply(out: Any, reply: Reply) -> None:
    """``out`` := ``err({status, message})`` of ``result<string, call-error>`` for ``reply``
    (an ``ok`` reply is ``_write_ok_string``'s)."""
    fields = _ffi.wasmtime_component_valrecord_t()
    _ffi.wasmtime_component_valrecord_new_uninit(fields, 2)
    status, message = fields.data[0], fields.data[1]
    status.name = _ffi.str_to_capi("status")
    status.val.kind = _KIND_U8
    status.val.of.u8 = int(reply.status)
    message.name = _ffi.str_to_capi("message")
    message.val.kind = _KIND_STRING
    message.val.of.string = _ffi.str_to_capi(reply.payload)
    inner = _ffi.wasmtime_component_val_t()
    inner.kind = _KIND_RECORD
    inner.of.record = fields
    out.kind = _KIND_RESULT
    out.of.result.is_ok = False
    out.of.result.val = _ffi.wasmtime_component_val_new(ctypes.byref(inner))


# The hot path reads and writes the value slots as bytes at their addresses: ctypes makes a
# Python object for every struct, union and pointer it is asked to look through, several per
# argument, and that cost more than the rest of the boundary. Offsets come from wasmtime-py's
# declarations of the C API's types; ``_RawCallback`` passes the slots' addresses as integers.
_VAL = _ffi.wasmtime_component_val_t
_OF_AT = _VAL.of.offset
_SLOT_SIZE = ctypes.sizeof(_VAL)
_VEC_SIZE_AT = _OF_AT + _ffi.wasm_byte_vec_t.size.offset
_VEC_DATA_AT = _OF_AT + _ffi.wasm_byte_vec_t.data.offset
_RESULT_OK_AT = _OF_AT + _ffi.wasmtime_component_valresult_t.is_ok.offset
_RESULT_VAL_AT = _OF_AT + _ffi.wasmtime_component_valresult_t.val.offset
# A string slot: its kind byte, the size and the data pointer of its byte vector.
_SLOT = struct.Struct(f"<B{_VEC_SIZE_AT - 1}xQ{_VEC_DATA_AT - _VEC_SIZE_AT - 8}xQ")
_S64_SLOT = struct.Struct(f"<B{_OF_AT - 1}xq")
_S32_SLOT = struct.Struct(f"<B{_OF_AT - 1}xi")
_OK_RESULT = struct.Struct(f"<B{_RESULT_OK_AT - 1}x?{_RESULT_VAL_AT - _RESULT_OK_AT - 1}xQ")
_RawCallback = ctypes.CFUNCTYPE(
    ctypes.c_size_t,
    ctypes.c_void_p,  # env
    ctypes.c_void_p,  # wasmtime_context_t*
    ctypes.c_void_p,  # the function's type
    ctypes.c_void_p,  # the argument slots
    ctypes.c_size_t,
    ctypes.c_void_p,  # the result slots
    ctypes.c_size_t,
)
_byte_vec_new = libwasmtime_held.wasm_byte_vec_new
_byte_vec_new.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_byte_vec_new.restype = None
_byte_vec_delete = libwasmtime_held.wasm_byte_vec_delete
_byte_vec_delete.argtypes = [ctypes.c_void_p]
_byte_vec_delete.restype = None
_val_new = libwasmtime_held.wasmtime_component_val_new
_val_new.argtypes = [ctypes.c_void_p]
_val_new.restype = ctypes.c_void_p
_val_delete = libwasmtime_held.wasmtime_component_val_delete
_val_delete.argtypes = [ctypes.c_void_p]
_val_delete.restype = None
_vallist_new_uninit = libwasmtime_held.wasmtime_component_vallist_new_uninit
_vallist_new_uninit.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_vallist_new_uninit.restype = None
_VAL_POINTER = ctypes.POINTER(_VAL)
# The signature of the exports the host calls (``run`` and ``dispatch``) as ``_wit_type``
# writes it, checked when a component is loaded (ComponentBackend.describe).
EXPORT_SIGNATURE = (("string", "string"), "result<string, {status: u8, message: string}>")


@dataclass(frozen=True, slots=True)
class CallError:
    """The ``err`` of an export's ``result<string, call-error>``."""

    status: int
    message: str


def check_export_signatures(exported: dict[str, Any]) -> None:
    """``run`` and ``dispatch`` (in a component's exports, as wasmtime-py lists them) must
    have the world's signature: the host calls them by it (``_call_export``)."""
    for name in (EXPORT_RUN, EXPORT_DISPATCH):
        func = exported[name].ty
        found = _wit_func_signature(func) if isinstance(func, wc.FuncType) else None
        if found != EXPORT_SIGNATURE:
            raise InvalidModule(
                f"the component exports {name} with type {found}, but the world "
                f"{WIT_PACKAGE}/workflow@{WIT_VERSION} declares {EXPORT_SIGNATURE}"
            )


def _call_export(
    function: str, func: wc.Func, store: wasmtime.Store, args: Sequence[str]
) -> str | CallError:
    """``func(store, *args)`` for an export of ``EXPORT_SIGNATURE``: the arguments written
    and the result read straight from the value slots, each value made and freed through
    the handle that keeps the GIL. wasmtime-py's generic call asks the function for its type
    at every call and converts through it: about 25 calls into libwasmtime a segment, each
    letting the GIL go; here only the call itself does, which runs the guest."""
    count = len(args)
    params = (ctypes.c_char * (_SLOT_SIZE * count))()
    base = ctypes.addressof(params)
    made = 0
    try:
        for index, arg in enumerate(args):
            _write_string(base + index * _SLOT_SIZE, arg)
            made += 1
        result = (ctypes.c_char * _SLOT_SIZE)()
        result_at = ctypes.addressof(result)

        def call() -> Any:
            return _ffi.wasmtime_component_func_call(
                ctypes.byref(func._func),
                store._context(),
                ctypes.cast(base, _VAL_POINTER),
                count,
                ctypes.cast(result_at, _VAL_POINTER),
                1,
            )

        component_enter.enter_wasm(call)
        try:
            return _read_result(function, result_at)
        finally:
            _val_delete(result_at)
    finally:
        for index in range(made):
            _val_delete(base + index * _SLOT_SIZE)


def _read_result(function: str, at: int) -> str | CallError:
    """The ``result<string, call-error>`` in the value slot at ``at`` (left for the caller
    to free)."""
    kind, ok, inner = _OK_RESULT.unpack(ctypes.string_at(at, _OK_RESULT.size))
    if kind != _KIND_RESULT or not inner:
        raise GuestFault(function, "returned a value that is not a result with a payload")
    if ok:
        kind, size, data = _SLOT.unpack(ctypes.string_at(inner, _SLOT.size))
        if kind != _KIND_STRING:
            raise GuestFault(function, "returned an ok that is not a string")
        return ctypes.string_at(data, size).decode("utf-8")
    value = _VAL.from_address(inner)
    if value.kind != _KIND_RECORD:
        raise GuestFault(function, "returned an error that is not a call-error")
    status, message = int(AbiStatus.ERROR), ""
    record = value.of.record
    for index in range(record.size):
        field = record.data[index]
        name = ctypes.string_at(field.name.data, field.name.size)
        if name == b"status" and field.val.kind == _KIND_U8:
            status = int(field.val.of.u8)
        elif name == b"message" and field.val.kind == _KIND_STRING:
            text = field.val.of.string
            message = ctypes.string_at(text.data, text.size).decode("utf-8")
    return CallError(status, message)


# One value slot per thread that builds a reply: ``wasmtime_component_val_new`` moves its
# contents into the box the result points to (and leaves a bool behind), and the next reply
# writes it again.
_scratch = threading.local()


def _string_scratch() -> int:
    address: int | None = getattr(_scratch, "address", None)
    if address is None:
        buffer = (ctypes.c_char * _SLOT_SIZE)()
        _scratch.buffer = buffer
        address = _scratch.address = ctypes.addressof(buffer)
    return address


def _write_string(slot: int, text: str) -> None:
    """The value slot at ``slot`` := the string ``text`` (a byte vector the slot owns)."""
    encoded = text.encode("utf-8")
    ctypes.memset(slot, _KIND_STRING, 1)
    _byte_vec_new(slot + _OF_AT, len(encoded), encoded)


def _write_ok_string(results: int, payload: str) -> None:
    """The result slot at ``results`` := ``ok(payload)`` of ``result<string, call-error>``."""
    inner = _string_scratch()
    _write_string(inner, payload)
    ctypes.memmove(results, _OK_RESULT.pack(_KIND_RESULT, True, _val_new(inner)), _OK_RESULT.size)


def _write_s64(results: int, value: int) -> None:
    """The result slot at ``results`` := ``value`` as an ``s64``, wrapped to 64 bits as the
    core backend's ``c_int64`` result slot does (``incr_state`` counts in unbounded
    integers)."""
    ctypes.memmove(results, _S64_SLOT.pack(_KIND_S64, ctypes.c_int64(value).value), _S64_SLOT.size)


def _host_operation(imp: HostImport) -> Any:
    """The C callback serving ``imp``: the session method of the same name, with the answer
    in WIT form (``result<string, call-error>`` or ``s64``)."""
    name = imp.name
    params = imp.params
    count = len(params)
    packed = imp.returns == "P"
    string_at = ctypes.string_at
    unpack_slot = _SLOT.unpack_from
    unpack_s64 = _S64_SLOT.unpack_from
    unpack_s32 = _S32_SLOT.unpack_from

    def host(
        env: Any, context: int, ty: Any, args: int, nargs: int, results: int, nresults: int
    ) -> int:
        session: ComponentSession | None = None
        store = CallerContext(context)
        try:
            if nargs != count or nresults != 1:
                raise GuestFault(name, f"called with {nargs} arguments; ABI v1 declares {count}")
            raw = string_at(args, _SLOT_SIZE * count)
            try:
                frame = _frame()
                if frame is None:
                    raise GuestFault(name, "host functions cannot be called outside a workflow run")
                session, instance = frame
                limit = instance.config.max_string_bytes
                values: list[Any] = []
                for index, code in enumerate(params):
                    if code == "s":
                        _, size, data = unpack_slot(raw, index * _SLOT_SIZE)
                        if size > limit:  # refused before it is copied
                            raise GuestFault(
                                name, f"a string of {size} bytes exceeds the {limit}-byte maximum"
                            )
                        values.append(string_at(data, size).decode("utf-8"))
                    elif code == "I":
                        values.append(unpack_s64(raw, index * _SLOT_SIZE)[1])
                    else:
                        values.append(unpack_s32(raw, index * _SLOT_SIZE)[1])
            finally:  # every string argument's buffer is freed, whatever happened
                for index, code in enumerate(params):
                    if code == "s":
                        _byte_vec_delete(args + index * _SLOT_SIZE + _OF_AT)
            previous = instance.ctx
            instance.ctx = store
            try:
                result = getattr(session, name)(*values)
            finally:
                instance.ctx = previous
            if not packed:
                _write_s64(results, int(result))
            elif result.status == AbiStatus.OK:
                _write_ok_string(results, result.payload)
            else:
                _write_error_reply(_VAL.from_address(results), result)
            return 0
        except BaseException as exc:
            if session is not None and session.exit is None:
                session.exit = exc
            # Parked where wasmtime-py's component calls look for it when the guest traps.
            component_enter.LAST_EXCEPTION = exc  # type: ignore[assignment]
            error = wasmtime.WasmtimeError("python exception")._consume()
            return ctypes.cast(error, ctypes.c_void_p).value or 0
        finally:
            store.invalidate()

    return _RawCallback(host)


def _define_host_operation(instance: wc.LinkerInstance, imp: HostImport) -> None:
    _define_callback(instance, wit_name(imp.name), _HOST_CALLBACKS[imp.name])


_PARAM_TYPES = {"s": "string", "I": "s64", "i": "s32"}
_RESULT_TYPES = {"P": "result<string, {status: u8, message: string}>", "V": "s64"}
# The host functions each interface offers, by WIT name.
_INTERFACE_IMPORTS: dict[str, dict[str, HostImport]] = {
    HOST_INTERFACE: {wit_name(imp.name): imp for imp in IMPORTS},
    BATCH_INTERFACE: {wit_name(imp.name): imp for imp in EXTENSION_IMPORTS},
}


def _wit_signature(imp: HostImport) -> tuple[tuple[str, ...], str]:
    return tuple(_PARAM_TYPES[code] for code in imp.params), _RESULT_TYPES[imp.returns]


def _wit_func_signature(func: Any) -> tuple[tuple[str, ...], str]:
    """A component function type's parameters and result as ``_wit_type`` writes them."""
    return tuple(_wit_type(t) for _, t in func.params), _wit_type(func.result)


def _wit_type(ty: Any) -> str:
    """A component value type as text, e.g. ``result<string, {status: u8, message: string}>``."""
    if ty is None:
        return "_"
    if isinstance(ty, wc.ResultType):
        return f"result<{_wit_type(ty.ok)}, {_wit_type(ty.err)}>"
    if isinstance(ty, wc.RecordType):
        return "{" + ", ".join(f"{name}: {_wit_type(t)}" for name, t in ty.fields) + "}"
    if isinstance(ty, wc.OptionType):
        return f"option<{_wit_type(ty.payload)}>"
    if isinstance(ty, wc.ListType):
        return f"list<{_wit_type(ty.element)}>"
    return type(ty).__name__.lower()


# One callback per import for the whole process (ctypes frees a callback when its object is
# collected, and every linker calls into them).
_HOST_CALLBACKS: dict[str, Any] = {imp.name: _host_operation(imp) for imp in HOST_IMPORTS}


def _guarded(function: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A host function that needs the session; faults are recorded as the segment's exit."""

    def host(store: Any, *args: Any) -> Any:
        frame = _frame()
        if frame is None:
            raise GuestFault(function, "called outside a workflow run")
        session = frame[0]
        try:
            return fn(session, *args)
        except BaseException as exc:
            if session.exit is None:
                session.exit = exc
            raise

    return host


def _take_update(session: ComponentSession) -> Any:
    event = session.take_update()
    if event is None:
        return None
    # Record fields carry their WIT (kebab-case) names.
    return _record(**{"update-id": event.update_id, "name": event.name, "payload": event.payload})


def _complete_update(session: ComponentSession, update_id: str, status: int, payload: str) -> None:
    session.complete_update(update_id, status, payload)


# Deterministic WASI. Outside a run (``describe`` at load time) time is the epoch and the
# random stream is zeros: nothing there may depend on them; a request for more than this
# many bytes there is a fault (in a run, the run's max_string_bytes is the limit).
_OUTSIDE_RUN_RANDOM_LIMIT = 1 << 20


def _virtual_ms() -> int:
    frame = _frame()
    return frame[0].now() if frame is not None else 0


def _random_bytes(function: str, length: int) -> bytes:
    frame = _frame()
    if frame is None:
        if length > _OUTSIDE_RUN_RANDOM_LIMIT:  # describe at deploy: no run's limit applies
            raise GuestFault(
                function, f"asked for {length} random bytes (at most {_OUTSIDE_RUN_RANDOM_LIMIT})"
            )
        return bytes(length)
    session, instance = frame
    limit = instance.config.max_string_bytes
    if length > limit:
        fault = GuestFault(function, f"asked for {length} random bytes (at most {limit})")
        if session.exit is None:
            session.exit = fault
        raise fault
    return session.random_bytes(length)


def _wall_clock_now(store: Any) -> wc.Record:
    ms = _virtual_ms()
    return _record(seconds=ms // 1000, nanoseconds=(ms % 1000) * _NS_PER_MS)


def _wall_clock_resolution(store: Any) -> wc.Record:
    return _record(seconds=0, nanoseconds=_NS_PER_MS)


def _monotonic_now(store: Any) -> int:
    return _virtual_ms() * _NS_PER_MS


def _monotonic_resolution(store: Any) -> int:
    return _NS_PER_MS


def _monotonic_wait(store: Any, *args: Any) -> Any:
    frame = _frame()
    location = frame[0].wait_location if frame is not None else ""
    # The SDK announces time.sleep with the workflow's file and line (GUEST_WAIT_MARK); the
    # host sees no Python frames of its own.
    where = f"{location}: " if location else ""
    fault = GuestFault(
        f"{MONOTONIC_CLOCK}#subscribe",
        f"{where}waiting on the clock (time.sleep, asyncio timers) is not durable and not "
        "replay-safe in a workflow; use ctx.sleep()",
    )
    if frame is not None and frame[0].exit is None:
        frame[0].exit = fault
    raise fault


# ``get-random-bytes`` and ``get-insecure-random-bytes`` are served by C callbacks of their
# own: wasmtime-py's generic ``add_func`` converts a ``list<u8>`` result one byte at a time
# through Python, and componentize-py seeds ``random`` with 2,496 bytes on an instance's first
# call -- 3 ms of every Python segment's start. The list is written whole: each element is a
# ``wasmtime_component_val_t`` of kind u8, laid out here in one buffer.
_KIND_U8_LIST = _ffi.WASMTIME_COMPONENT_LIST.value
_VAL_SIZE = ctypes.sizeof(_ffi.wasmtime_component_val_t)
_VAL_KIND_AT = _ffi.wasmtime_component_val_t.kind.offset
_VAL_U8_AT = _ffi.wasmtime_component_val_t.of.offset + _ffi.wasmtime_component_valunion_t.u8.offset


def _write_bytes(out: Any, data: bytes) -> None:
    """``out`` := ``list<u8>`` holding ``data``."""
    count = len(data)
    values = _ffi.wasmtime_component_vallist_t()
    _vallist_new_uninit(ctypes.byref(values), count)
    if count:
        layout = bytearray(_VAL_SIZE * count)
        layout[_VAL_KIND_AT::_VAL_SIZE] = bytes((_KIND_U8,)) * count
        layout[_VAL_U8_AT::_VAL_SIZE] = data
        ctypes.memmove(values.data, (ctypes.c_char * len(layout)).from_buffer(layout), len(layout))
    out.kind = _KIND_U8_LIST
    out.of.list = values


def _random_bytes_callback(function: str) -> Any:
    """The C callback of ``function`` (``(len: u64) -> list<u8>``)."""

    def host(
        env: Any, context: Any, ty: Any, args: Any, nargs: int, results: Any, nresults: int
    ) -> int:
        try:
            if nargs != 1 or nresults != 1:
                raise GuestFault(function, f"called with {nargs} arguments; WASI declares 1")
            _write_bytes(results[0], _random_bytes(function, int(args[0].of.u64)))
            return 0
        except BaseException as exc:
            frame = _frame()
            if frame is not None and frame[0].exit is None:
                frame[0].exit = exc
            component_enter.LAST_EXCEPTION = exc  # type: ignore[assignment]
            error = wasmtime.WasmtimeError("python exception")._consume()
            return ctypes.cast(error, ctypes.c_void_p).value or 0

    return _ffi.wasmtime_component_func_callback_t(host)


def _define_callback(instance: wc.LinkerInstance, name: str, callback: Any) -> None:
    encoded = name.encode()
    error = _ffi.wasmtime_component_linker_instance_add_func(
        instance.ptr(),
        ctypes.create_string_buffer(encoded),
        len(encoded),
        ctypes.cast(callback, _ffi.wasmtime_component_func_callback_t),
        None,
        NO_FINALIZER,
    )
    if error:
        raise wasmtime.WasmtimeError._from_ptr(error)


def _get_random_bytes(store: Any, length: int) -> bytes:
    return _random_bytes(f"{RANDOM}#get-random-bytes", length)


def _get_random_u64(store: Any) -> int:
    return int.from_bytes(_random_bytes(f"{RANDOM}#get-random-u64", 8), "little")


def _insecure_seed(store: Any) -> tuple[int, int]:
    raw = _random_bytes(f"{INSECURE_SEED}#insecure-seed", 16)
    return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")


_WASI_FUNCTIONS: dict[str, tuple[tuple[str, Callable[..., Any]], ...]] = {
    WALL_CLOCK: (("now", _wall_clock_now), ("resolution", _wall_clock_resolution)),
    MONOTONIC_CLOCK: (
        ("now", _monotonic_now),
        ("resolution", _monotonic_resolution),
        ("subscribe-instant", _monotonic_wait),
        ("subscribe-duration", _monotonic_wait),
    ),
    RANDOM: (("get-random-bytes", _get_random_bytes), ("get-random-u64", _get_random_u64)),
    INSECURE_RANDOM: (
        ("get-insecure-random-bytes", _get_random_bytes),
        ("get-insecure-random-u64", _get_random_u64),
    ),
    INSECURE_SEED: (("insecure-seed", _insecure_seed),),
}
# The functions of _WASI_FUNCTIONS served by C callbacks instead (kept alive here).
_WASI_CALLBACKS: dict[tuple[str, str], Any] = {
    (RANDOM, "get-random-bytes"): _random_bytes_callback(f"{RANDOM}#get-random-bytes"),
    (INSECURE_RANDOM, "get-insecure-random-bytes"): _random_bytes_callback(
        f"{INSECURE_RANDOM}#get-insecure-random-bytes"
    ),
}


# The line the SDK writes to stderr just before ``time.sleep`` waits on the clock (a guest
# fault), followed by ``file:line in function`` of the workflow's call; the same text is
# ``WAIT_MARK`` in ``cleat_workflow._guest`` (a wire contract, like GUEST_MEMORY_ERROR).
GUEST_WAIT_MARK = "cleat:clock-wait-at "


def _guest_output(stream: str, output: GuestOutput) -> Callable[[bytes], None]:
    """stdout/stderr of the guest, to the ``cleat.guest`` logger; dropped while the segment
    replays, so a ``print`` is logged once like ``ctx.log``. The segment's session is read
    from ``output`` (bound when a segment takes the store), not looked up per thread:
    wasmtime may call this from a thread of its own."""

    def write(data: bytes) -> None:
        session: ComponentSession | None = output.session
        text = data.decode("utf-8", "replace")
        if GUEST_WAIT_MARK in text:
            kept = []
            for line in text.splitlines():
                if line.startswith(GUEST_WAIT_MARK):
                    if session is not None:
                        session.wait_location = line[len(GUEST_WAIT_MARK) :].strip()[:300]
                else:
                    kept.append(line)
            text = "\n".join(kept)
        if session is not None and session.replaying:
            return
        run = session.ref.run_id if session is not None else "-"
        for line in text.splitlines():
            if line.strip():
                guest_log.info("run %s %s: %s", run, stream, line)

    return write


# --- loading -------------------------------------------------------------------------------


def _description_json(guest: GuestInfo, imports: tuple[str, ...]) -> bytes:
    data = {
        "abi_version": guest.abi_version,
        "entries": list(guest.entries),
        "handlers": sorted(guest.handlers),
        "imports": list(imports),
    }
    return json.dumps(data).encode()


def _read_description(path: Path) -> tuple[GuestInfo, tuple[str, ...]] | None:
    try:
        data = json.loads(path.read_bytes())
        guest = GuestInfo(
            abi_version=int(data["abi_version"]),
            entries=tuple(str(e) for e in data["entries"]),
            handlers=frozenset(str(h) for h in data["handlers"]),
        )
        return guest, tuple(str(i) for i in data["imports"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # described again, and written again


class ComponentBackend:
    """Loads and runs components on the runtime's engine (its configuration and epoch
    ticker). Thread-safe."""

    def __init__(self, engine: wasmtime.Engine, config: EngineConfig) -> None:
        self.config = config
        self.engine = engine
        self._lock = threading.Lock()
        self._wasi_names: frozenset[str] = frozenset()
        self._linker = self._build_linker(self._wasi_names)
        # LoadedModule's core fields for components: an empty core module (see LoadedComponent).
        self._no_module = wasmtime.Module(self.engine, b"\x00asm\x01\x00\x00\x00")
        self._no_pre = wasmtime.Linker(self.engine).instantiate_pre(self._no_module)
        # Instances made ahead of the segments (engine.ready_instances); None: off.
        self.ready: ReadyInstances[Prepared] | None = None
        # The pages a first call writes, made private in those instances (engine.warm_pages).
        self.warm: WarmPages | None = None
        if config.ready_instances:
            self.warm = WarmPages() if config.warm_pages else None
            self.ready = ReadyInstances(
                self._prepare_ahead,
                key=_component_key,
                per_component=config.ready_instances,
                dispose=_close_store,
            )

    # --- linking ---

    def _build_linker(self, wasi_names: frozenset[str]) -> wc.Linker:
        linker = wc.Linker(self.engine)
        linker.allow_shadowing = True
        linker.add_wasip2()
        with linker.root() as root:
            with root.add_instance(HOST_INTERFACE) as host:
                for imp in IMPORTS:
                    _define_host_operation(host, imp)
            with root.add_instance(BATCH_INTERFACE) as batch:
                for imp in EXTENSION_IMPORTS:
                    _define_host_operation(batch, imp)
            with root.add_instance(UPDATES_INTERFACE) as updates:
                updates.add_func("take", _guarded("updates.take", _take_update))
                updates.add_func("complete", _guarded("updates.complete", _complete_update))
            for full_name in sorted(wasi_names):
                with root.add_instance(full_name) as instance:
                    interface = _unversioned(full_name)
                    for name, fn in _WASI_FUNCTIONS[interface]:
                        callback = _WASI_CALLBACKS.get((interface, name))
                        if callback is not None:
                            _define_callback(instance, name, callback)
                        else:
                            instance.add_func(name, fn)
        return linker

    def _linker_for(self, imports: Sequence[str]) -> wc.Linker:
        """The linker, extended (once) with the deterministic WASI interfaces at the versions
        a component imports (``imports``: its import names)."""
        wanted = frozenset(name for name in imports if _unversioned(name) in DETERMINISTIC_WASI)
        with self._lock:
            if not wanted <= self._wasi_names:
                names = self._wasi_names | wanted
                self._linker = self._build_linker(names)
                self._wasi_names = names
            return self._linker

    def _new_store(self, output: GuestOutput | None = None) -> wasmtime.Store:
        """The core module's store (same limits, deadline and fuel), plus WASI output (to the
        session ``output`` is bound to, when the store runs a segment)."""
        # Its CPython heap takes long to unmap: deleted with the GIL let go.
        store = new_store(self.engine, self.config, keep_gil_to_delete=False)
        output = output if output is not None else GuestOutput()
        wasi = wasmtime.WasiConfig()
        wasi.stdout_custom = _guest_output("stdout", output)
        wasi.stderr_custom = _guest_output("stderr", output)
        store.set_wasi(wasi)
        return store

    def instantiate(self, loaded: LoadedComponent, store: wasmtime.Store) -> wc.Instance:
        with self._lock:
            linker = self._linker
        return linker.instantiate(store, loaded.component)

    def prepare(self, loaded: LoadedComponent, session: ComponentSession | None = None) -> Prepared:
        """A new store and a fresh instance of ``loaded`` in it, not yet called (what a ready
        instance is, see ``engine.ready_instances``)."""
        output = GuestOutput(session)
        store = self._new_store(output)
        instance = self.instantiate(loaded, store)
        return Prepared(store, instance, output, _segment_exports(store, instance))

    def _prepare_ahead(self, loaded: LoadedComponent) -> Prepared:
        """An instance made ahead (the maker's thread), its first call's pages made private."""
        prepared = self.prepare(loaded)
        if self.warm is not None:
            self.warm.warm()
        return prepared

    def _dispose(self, prepared: Prepared) -> None:
        """Close a used instance's store: on the thread that makes instances ahead when there
        is one (unmapping its memory takes about 0.25 ms, which the segment's outcome need
        not wait for), else here."""
        if self.ready is not None:
            self.ready.dispose(prepared)
        else:
            _close_store(prepared)

    def close(self) -> None:
        """Stop making instances ahead and drop the ready ones."""
        if self.ready is not None:
            self.ready.close()
        if self.warm is not None:
            self.warm.close()

    # --- loading ---

    def load(self, wasm: bytes, sha: str, cache: ArtifactCache, path: Path | None) -> LoadedModule:
        """Compile ``wasm`` (or read it from the disk cache at ``path``) and describe it."""
        component: wc.Component | None = None
        described: tuple[GuestInfo, tuple[str, ...]] | None = None
        if path is not None and path.exists():
            try:
                component = wc.Component.deserialize_file(self.engine, str(path))
                cache.disk_hits += 1
                cache.touch(path)
                described = _read_description(description_path(path))
            except wasmtime.WasmtimeError:
                log.warning("discarding unreadable cached component %s", path)
                path.unlink(missing_ok=True)
        if component is None:
            cache.misses += 1
            started = time.monotonic()
            # Compiling a Python workflow's component takes seconds (~20 MB of CPython):
            # say so before, or the first run of a new version looks hung.
            log.info(
                "compiling component %s… (%.1f MB) with wasmtime: the first run of a new "
                "version waits for this (seconds); the result is cached%s",
                sha[:12],
                len(wasm) / 1e6,
                f" in {path.parent}" if path is not None else " in memory only",
            )
            try:
                component = wc.Component(self.engine, wasm)
            except wasmtime.WasmtimeError as exc:
                raise InvalidModule(f"invalid WebAssembly component: {exc}") from None
            log.info(
                "compiled component %s… (%d bytes) in %.1f s",
                sha[:12],
                len(wasm),
                time.monotonic() - started,
            )
            if path is not None:
                cache.store_artifact(path, bytes(component.serialize()))
        if described is None:
            described = self.describe(component)
            if path is not None:
                cache.store_artifact(description_path(path), _description_json(*described))
                cache.prune_disk(keep=sha)
        else:
            # Checked when the artifact was cached (same sha256): only link what it imports.
            self._linker_for(described[1])
        guest, imports = described
        info = ModuleInfo(
            sha256=sha,
            kind="component",
            abi_version=guest.abi_version,
            # "run" is always accepted: see resolve_entry.
            entry_points=tuple(dict.fromkeys((*guest.entries, DEFAULT_ENTRY_POINT))),
            imports=imports,
            size=len(wasm),
        )
        return LoadedComponent(info, self._no_module, self._no_pre, component, guest)

    def describe(self, component: wc.Component) -> tuple[GuestInfo, tuple[str, ...]]:
        """Check the component against the world and ask it what it offers."""
        imports = tuple(component.type.imports(self.engine))
        exports = set(component.type.exports(self.engine))
        for name in imports:
            package = name.split("/", 1)[0]
            if package == WIT_PACKAGE:
                served = name in _INTERFACE_IMPORTS or name == UPDATES_INTERFACE
                if not served and not name.startswith(f"{WIT_PACKAGE}/types@"):
                    raise UnsupportedAbiVersion(
                        f"the component imports {name}; this host serves {HOST_INTERFACE}, "
                        f"{UPDATES_INTERFACE} and {BATCH_INTERFACE}"
                    )
            elif not package.startswith("wasi:"):
                raise InvalidModule(f"the component imports {name}, which is not part of ABI v1")
        self._check_host_signatures(component)
        missing = [e for e in (EXPORT_RUN, EXPORT_DISPATCH, EXPORT_DESCRIBE) if e not in exports]
        if missing:
            raise InvalidModule(
                f"the component does not export {', '.join(missing)} of the world "
                f"{WIT_PACKAGE}/workflow@{WIT_VERSION} (build it with manage.py build_workflow)"
            )
        check_export_signatures(component.type.exports(self.engine))
        store = self._new_store()
        try:
            instance = self._linker_for(imports).instantiate(store, component)
            describe = instance.get_func(store, EXPORT_DESCRIBE)
            if describe is None:
                raise InvalidModule(f"the component does not export {EXPORT_DESCRIBE!r}")
            raw = describe(store)
            describe.post_return(store)
        except (wasmtime.WasmtimeError, WorkflowExit) as exc:
            raise InvalidModule(f"cannot instantiate the component: {exc}") from None
        guest = GuestInfo(
            abi_version=int(getattr(raw, "abi-version")),
            entries=tuple(raw.entries),
            handlers=frozenset(raw.handlers),
        )
        if guest.abi_version not in SUPPORTED_ABI_VERSIONS:
            raise UnsupportedAbiVersion(
                f"the component declares guest ABI version {guest.abi_version}; this host "
                f"serves version(s) {', '.join(map(str, sorted(SUPPORTED_ABI_VERSIONS)))}"
            )
        if not guest.entries:
            raise InvalidModule("the component offers no workflow (no @workflow function)")
        return guest, imports

    def _check_host_signatures(self, component: wc.Component) -> None:
        """Every host function the component imports must have ABI v1's WIT signature (or
        its extension's): the host callbacks read their arguments by that signature (see
        ``_host_operation``)."""
        imports = component.type.imports(self.engine)
        for interface, declared_here in _INTERFACE_IMPORTS.items():
            imported = imports.get(interface)
            if imported is None:
                continue
            instance_type = imported.ty
            if not isinstance(instance_type, wc.ComponentInstanceType):
                raise InvalidModule(f"the component imports {interface} as a non-instance")
            for name, extern in instance_type.exports(self.engine).items():
                func = extern.ty
                if not isinstance(func, wc.FuncType):
                    continue  # a type the functions use (call-error)
                declared = declared_here.get(name)
                if declared is None:
                    raise InvalidModule(
                        f"the component imports {interface}#{name}, which is not part of ABI v1"
                    )
                expected = _wit_signature(declared)
                found = _wit_func_signature(func)
                if found != expected:
                    raise InvalidModule(
                        f"the component imports {interface}#{name} with type {found}, but "
                        f"ABI v1 declares {expected}"
                    )

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
        """Instantiate the component and run ``run`` from the start against ``history``
        (the component twin of :meth:`CoreBackend.run_segment`)."""
        started = time.monotonic()
        if not isinstance(module, LoadedComponent):
            raise InvalidModule("not a loaded component")
        try:
            session = ComponentSession(run, history, storage, services, self.config, clock)
        except HistoryCorrupt as exc:
            return SegmentResult(
                outcome=failed(ErrorCode.HISTORY_CORRUPT, str(exc)),
                new_events=(),
                recorded=(),
                query_state={},
                replayed_steps=0,
                next_step=0,
                elapsed_s=time.monotonic() - started,
            )
        entry = resolve_entry(module.guest, run)
        if entry is None:
            offered = ", ".join(module.guest.entries)
            message = (
                f"entry point {run.entry_point!r} is not offered (the component offers: {offered})"
            )
            if run.entry_point == DEFAULT_ENTRY_POINT:
                message = (
                    f"the component offers several workflows ({offered}) and none is named "
                    f"{run.definition!r}: deploy it under one of their names, or start the "
                    "run with an entry point"
                )
            outcome: Outcome = failed(ErrorCode.INVALID_MODULE, message)
            return session.result(outcome, time.monotonic() - started)
        prepared = self.ready.take(module) if self.ready is not None else None
        inline = False
        try:
            if prepared is None:
                prepared = self.prepare(module, session)
                inline = True
            else:
                # Made ahead: the segment's deadline starts now, and its output is this run's.
                prepared.store.set_epoch_deadline(self.config.deadline_ticks)
                prepared.output.session = session
            instance = ComponentInstance(
                prepared.store,
                prepared.instance,
                module.guest,
                self.config,
                started,
                lambda: session.io_seconds,
                prepared.exports,
            )
        except (wasmtime.WasmtimeError, InvalidModule) as exc:
            if prepared is not None:
                prepared.output.session = None  # see below
                self._dispose(prepared)
            return session.result(
                classify_component(exc, session, self.config), time.monotonic() - started
            )
        session.bind(instance)
        previous = _frame()
        _current.frame = (session, instance)
        try:
            reply = instance.run(entry, run.input)
            out_of_memory = classify_component_reply(reply, self.config)
            outcome = out_of_memory if out_of_memory is not None else session.finish(reply)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            outcome = classify_component(exc, session, self.config)
        finally:
            _current.frame = previous
            # The guest has stopped: unbind its output from the session. wasmtime-py keeps
            # the store's output callbacks in a process-wide table until the store is
            # freed, and through them the output, the session, the instance and the store
            # itself: bound, the store was never freed (a Python segment's memory, about
            # 7 MB, kept for the process's life).
            prepared.output.session = None
            if self.warm is not None:
                # What the guest wrote, while mapped: a component's first inline segment.
                self.warm.learn(_component_key(module) if inline else None)
            if self.ready is not None:
                try:
                    self.ready.replenish(module, instantiated_inline=inline)
                except Exception:  # e.g. no thread could be started: the segment stands
                    log.warning("could not ask for instances made ahead", exc_info=True)
            # Its memory is unmapped now, not when a collection finds the cycle between the
            # session and the instance: a worker running 8 segments at once kept about a
            # hundred instances mapped, and every walk of the process's memory map (the
            # warm pages', the kernel's on each mmap) went through all of them.
            self._dispose(prepared)
        return session.result(outcome, time.monotonic() - started)
