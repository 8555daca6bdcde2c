"""Guest ABI v1 for core modules: the host imports of module ``"env"``, exactly as ABI.md names
and types them.

Each import is declared once in :data:`IMPORTS` with a compact signature:
``s`` a string passed as ``(ptr: i32, len: i32)``, ``I`` an ``i64``, ``i`` an ``i32``; the
result is always one ``i64``: a packed buffer (``P``) or a scalar (``V``). The host function
decodes the arguments from guest memory, calls the session method of the same name, and
writes a packed buffer back through the guest's ``cleat_alloc``.
"""

from __future__ import annotations

from typing import NamedTuple

ABI_VERSION = 1
SUPPORTED_ABI_VERSIONS = frozenset({1})


class HostImport(NamedTuple):
    name: str
    params: str  # "s" string (ptr, len), "I" i64, "i" i32
    returns: str  # "P" packed buffer, "V" scalar i64
    blocking: bool = False


IMPORTS: tuple[HostImport, ...] = (
    # Calls to the outside world
    HostImport("durable_call", "sss", "P"),
    HostImport("durable_call_with_retry", "sssIIIIs", "P", blocking=True),
    HostImport("durable_call_with_heartbeat", "sssI", "P"),
    HostImport("durable_send", "sss", "P"),
    HostImport("durable_schedule_invoke", "sssI", "P"),
    HostImport("fetch", "ssss", "P"),
    HostImport("plugin_call", "sss", "P"),
    HostImport("plugin_call_streaming", "sss", "P"),
    # Time, randomness, identity, logging
    HostImport("now", "", "V"),
    HostImport("random", "", "V"),
    HostImport("uuid", "s", "P"),
    HostImport("side_effect", "s", "P"),
    HostImport("workflow_id", "", "P"),
    HostImport("run_id", "", "P"),
    HostImport("version", "", "V"),
    HostImport("min_version", "", "V"),
    HostImport("durable_log", "is", "V"),
    HostImport("json_parse", "s", "P"),
    HostImport("json_stringify", "s", "P"),
    # Timers, signals, promises, updates, queries
    HostImport("durable_sleep", "I", "V", blocking=True),
    HostImport("durable_await_signals", "sI", "P", blocking=True),
    HostImport("poll_signal", "s", "P"),
    HostImport("poll_cancellation", "", "P"),
    HostImport("signal_workflow", "sss", "P"),
    HostImport("send_signal_and_wait", "sssI", "P", blocking=True),
    HostImport("reply_to_signal", "ss", "P"),
    HostImport("create_promise", "s", "P"),
    HostImport("await_promise", "sI", "P", blocking=True),
    HostImport("resolve_promise", "ss", "P"),
    HostImport("reject_promise", "ss", "P"),
    HostImport("register_update_handler", "s", "V"),
    HostImport("set_query_state", "ss", "V"),
    # Children, continue-as-new, detached runs, defers
    HostImport("child_workflow", "ss", "P"),
    HostImport("child_workflow_with_options", "ssIIs", "P"),
    HostImport("await_child", "s", "P", blocking=True),
    HostImport("await_all_children", "s", "P", blocking=True),
    HostImport("await_any_child", "s", "P", blocking=True),
    HostImport("poll_child", "s", "P"),
    HostImport("continue_as_new", "s", "V"),
    HostImport("continue_as_new_with_version", "sI", "V"),
    HostImport("run_detached", "ss", "P"),
    HostImport("durable_defer", "s", "P"),
    # State, locks, scopes, schedules
    HostImport("set_state", "ss", "V"),
    HostImport("get_state", "s", "P"),
    HostImport("delete_state", "s", "V"),
    HostImport("incr_state", "sI", "V"),
    HostImport("has_state", "s", "V"),
    HostImport("list_state", "s", "P"),
    HostImport("set_scope", "ss", "P"),
    HostImport("get_scope", "", "P"),
    HostImport("acquire_lock", "sI", "V"),
    HostImport("release_lock", "s", "V"),
    HostImport("schedule_cron", "ssss", "P"),
    HostImport("delete_cron", "s", "P"),
    HostImport("list_crons", "", "P"),
)

IMPORTS_BY_NAME: dict[str, HostImport] = {imp.name: imp for imp in IMPORTS}

# Optional extensions of ABI v1: additive host imports that are not part of the fixed v1
# contract (ABI.md). A module that does not import them is a plain v1 module; one that does
# runs on this host (and on any host that serves the extension), never on a host that serves
# v1 alone. Nothing of v1 is renamed or re-signed for them. docs/abi.md describes each.
EXTENSION_IMPORTS: tuple[HostImport, ...] = (
    # Several durable calls made concurrently, one recorded call event each, in order.
    HostImport("durable_call_many", "s", "P"),
)

# Everything the host serves: ABI v1, then the extensions.
HOST_IMPORTS: tuple[HostImport, ...] = IMPORTS + EXTENSION_IMPORTS
HOST_IMPORTS_BY_NAME: dict[str, HostImport] = {imp.name: imp for imp in HOST_IMPORTS}

# Exports the host looks for in a core module.
EXPORT_MEMORY = "memory"
EXPORT_ALLOC = "cleat_alloc"
EXPORT_ABI_VERSION = "cleat_abi_version"
DEFAULT_ENTRY_POINT = "run"


def wasm_param_types(params: str) -> list[str]:
    """The wasm value types of a signature: ``"sI"`` -> ``["i32", "i32", "i64"]``."""
    out: list[str] = []
    for ch in params:
        if ch == "s":
            out += ["i32", "i32"]
        elif ch == "I":
            out.append("i64")
        elif ch == "i":
            out.append("i32")
        else:
            raise ValueError(f"unknown parameter code {ch!r}")
    return out


def pack(ptr: int, length: int) -> int:
    """``(ptr << 32) | len`` as the signed i64 wasm expects."""
    value = ((ptr & 0xFFFFFFFF) << 32) | (length & 0xFFFFFFFF)
    return value - (1 << 64) if value >= 1 << 63 else value


def unpack(value: int) -> tuple[int, int]:
    value &= 0xFFFFFFFFFFFFFFFF
    return value >> 32, value & 0xFFFFFFFF
