"""The fast paths of the host boundary: libwasmtime called directly, past wasmtime-py's
checked wrappers, where a durable step pays for every call.

wasmtime-py converts and checks every argument and wraps every pointer its declarations
return; on the hot path (every host call reads guest memory, every reply calls
``cleat_alloc``) that cost several times the call itself. The declarations here take
pointers wasmtime-py made and integers as explicit ctypes values. The core backend
(``engine.core_backend``) uses all of them; the component backend shares ``CallerContext``
and ``NO_FINALIZER``.
"""

from __future__ import annotations

import ctypes
from typing import Any

import wasmtime
from wasmtime import _ffi as wasmtime_ffi
from wasmtime._extern import wrap_extern
from wasmtime._func import enter_wasm

# The hot path of a host call calls libwasmtime through a handle of its own. wasmtime-py's
# declarations check and convert every argument and wrap every pointer they return, which
# costs several times the call itself; these take pointers wasmtime-py made (so their types
# are right), integers as explicit ctypes values, and return plain integers. A separate
# handle leaves wasmtime-py's own declarations as they are.
libwasmtime = ctypes.CDLL(wasmtime_ffi.dll._name)
# The calls that never enter the guest and return at once (a memory's address and size, a
# host call's context, the epoch deadline, a value's allocation) go through a handle that
# keeps the GIL during the call (``PyDLL``). A ``CDLL`` call releases the GIL and takes it
# back after; on a worker whose segment threads all want it, taking it back waits for
# another thread to let go of it -- a context switch, or the interpreter's switch interval
# (5 ms) when that thread computes -- several times per host call. Calls that run guest
# code (``func_call``) still release it: a guest may run for its whole deadline.
libwasmtime_held = ctypes.PyDLL(wasmtime_ffi.dll._name)
CONTEXT_PTR = ctypes.POINTER(wasmtime_ffi.wasmtime_context_t)
ERROR_PTR = ctypes.POINTER(wasmtime_ffi.wasmtime_error_t)
memory_data = libwasmtime_held.wasmtime_memory_data
memory_data.restype = ctypes.c_void_p
memory_data_size = libwasmtime_held.wasmtime_memory_data_size
memory_data_size.restype = ctypes.c_size_t
func_call = libwasmtime.wasmtime_func_call
func_call.restype = ctypes.c_void_p  # wasmtime_error_t*, NULL on success
caller_context = libwasmtime_held.wasmtime_caller_context
caller_context.argtypes = [ctypes.c_void_p]
caller_context.restype = CONTEXT_PTR
define_func_unchecked = libwasmtime.wasmtime_linker_define_func_unchecked
define_func_unchecked.restype = ctypes.c_void_p  # wasmtime_error_t*, NULL on success
set_epoch_deadline = libwasmtime_held.wasmtime_context_set_epoch_deadline
set_epoch_deadline.restype = None
store_limiter = libwasmtime_held.wasmtime_store_limiter
store_limiter.argtypes = [ctypes.c_void_p, *[ctypes.c_int64] * 5]
store_limiter.restype = None
_instance_export_get = libwasmtime_held.wasmtime_instance_export_get
_instance_export_get.argtypes = [
    ctypes.c_void_p,  # wasmtime_context_t*
    ctypes.c_void_p,  # const wasmtime_instance_t*
    ctypes.c_char_p,
    ctypes.c_size_t,
    ctypes.c_void_p,  # wasmtime_extern_t* (out)
]
_instance_export_get.restype = ctypes.c_bool
ONE = ctypes.c_size_t(1)
TWO = ctypes.c_size_t(2)


def instance_export(context: Any, instance: Any, name: str) -> Any:
    """The export ``name`` of a core ``wasmtime.Instance`` (a ``Func``, ``Memory``, ... as
    wasmtime-py wraps it), or None. ``Instance.exports()`` wraps every export of the
    instance, each through a call that releases the GIL: about 24 µs a segment for three."""
    raw = name.encode()
    item = wasmtime_ffi.wasmtime_extern_t()
    found = _instance_export_get(
        context, ctypes.byref(instance._instance), raw, len(raw), ctypes.byref(item)
    )
    if not found:
        return None
    # A function or a memory (what a segment asks for) wrapped as wrap_extern wraps them,
    # without its imports at every call (about a third of an export's cost).
    kind: Any = item.kind  # an int (ctypes reads the field as one; the stub says c_ubyte)
    if kind == _EXTERN_FUNC:
        return wasmtime.Func._from_raw(item.of.func)
    if kind == _EXTERN_MEMORY:
        return wasmtime.Memory._from_raw(item.of.memory)
    return wrap_extern(item)


_EXTERN_FUNC = wasmtime_ffi.WASMTIME_EXTERN_FUNC.value
_EXTERN_MEMORY = wasmtime_ffi.WASMTIME_EXTERN_MEMORY.value


# A segment's store is made and dropped through the handle that keeps the GIL: neither call
# enters the guest (a finalizer of host data is a ctypes callback, which takes the GIL its
# thread already holds), and each of the three calls through wasmtime-py's declarations let
# the GIL go and took it back -- on one worker process of 16 threads draining timers, about
# six of a run's nineteen context switches.
_store_new = libwasmtime_held.wasmtime_store_new
_store_new.argtypes = [ctypes.POINTER(wasmtime_ffi.wasm_engine_t), ctypes.c_void_p, ctypes.c_void_p]
_store_new.restype = ctypes.POINTER(wasmtime_ffi.wasmtime_store_t)
_store_context = libwasmtime_held.wasmtime_store_context
_store_context.argtypes = [ctypes.POINTER(wasmtime_ffi.wasmtime_store_t)]
_store_context.restype = CONTEXT_PTR
_store_delete = libwasmtime_held.wasmtime_store_delete
_store_delete.argtypes = [ctypes.POINTER(wasmtime_ffi.wasmtime_store_t)]
_store_delete.restype = None


class Store(wasmtime.Store):
    """A ``wasmtime.Store`` without host data, made (``wasmtime_store_new``, its context)
    and deleted (``close``, or when collected) through the handle that keeps the GIL. Every
    other method is wasmtime-py's own; its ``_context`` reads the attribute set here.

    ``keep_gil_to_delete=False``: deleted through wasmtime-py's declaration, which lets the
    GIL go -- for a store whose memory takes long to unmap (a Python workflow's instance:
    about 170 µs, during which every other thread would wait for the GIL)."""

    def __init__(self, engine: wasmtime.Engine, *, keep_gil_to_delete: bool = True) -> None:
        self._set_ptr(_store_new(engine.ptr(), None, None))
        self._Store__context = _store_context(self.ptr())
        self.engine = engine
        self._delete_store = (
            _store_delete if keep_gil_to_delete else wasmtime_ffi.wasmtime_store_delete
        )

    def _delete(self, ptr: Any) -> None:
        self._delete_store(ptr)
        self._Store__context = None


_instance_pre_instantiate = libwasmtime_held.wasmtime_instance_pre_instantiate
_instance_pre_instantiate.argtypes = [
    ctypes.POINTER(wasmtime_ffi.wasmtime_instance_pre_t),
    CONTEXT_PTR,
    ctypes.POINTER(wasmtime_ffi.wasmtime_instance_t),
    ctypes.POINTER(ctypes.POINTER(wasmtime_ffi.wasm_trap_t)),
]
_instance_pre_instantiate.restype = ctypes.POINTER(wasmtime_ffi.wasmtime_error_t)


def instantiate(pre: wasmtime.InstancePre, store: wasmtime.Store) -> wasmtime.Instance:
    """``pre.instantiate(store)`` through the handle that keeps the GIL, for a module without
    a start function (``LoadedModule.no_start``): its instantiation maps and fills memory and
    tables but runs no guest code. Errors and traps are raised as wasmtime-py raises them."""
    instance = wasmtime_ffi.wasmtime_instance_t()
    with enter_wasm(store) as trap:
        error = _instance_pre_instantiate(pre.ptr(), store._context(), ctypes.byref(instance), trap)
        if error:
            raise wasmtime.WasmtimeError._from_ptr(error)
    return wasmtime.Instance._from_raw(instance)


TRAP_PTR = ctypes.POINTER(wasmtime_ffi.wasm_trap_t)
U64 = ctypes.c_uint64
# The status byte of a reply, for each status a byte can hold.
STATUS_BYTE = tuple(bytes((i,)) for i in range(256))

# Host functions are defined on the linker "unchecked": wasmtime hands the callback the
# address of the raw argument slots (and takes the result in slot 0) instead of wasmtime-py
# converting every value through its generic ``Val`` layer, which costs about 30 µs a call,
# more than the whole budget of a durable step. The import types are still checked when a
# module is linked. Exceptions leave the callback the way wasmtime-py's own trampoline lets
# them: parked in ``wasmtime._func.LAST_EXCEPTION`` behind a trap, and re-raised by
# wasmtime-py (or ``_call_alloc``) where the guest was entered.
HostCallback = ctypes.CFUNCTYPE(
    ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t
)
VALUE_SLOT = ctypes.sizeof(wasmtime_ffi.wasmtime_val_raw_t)
SLOT_FORMAT = {"i32": f"i{VALUE_SLOT - 4}x", "i64": f"q{VALUE_SLOT - 8}x"}


class CallerContext:
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


# Host functions hold no per-definition data, so there is nothing to finalize.
NO_FINALIZER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _data: None)
