"""The raw ABI v1 import declarations of the guest SDKs, generated from ``engine.abi.IMPORTS``.

Each SDK (Rust, C, Zig, AssemblyScript) declares the host imports of module ``"env"`` in a
block between two marker lines; this script writes those blocks, so the four SDKs and the
host agree on every name and signature by construction::

    python sdk/guest_imports.py            # rewrite the blocks
    python sdk/guest_imports.py --check    # exit 1 if a block is out of date (a unit test)

The parameter names are those of the import tables in ``docs/abi.md``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.abi import IMPORTS, HostImport  # noqa: E402

BEGIN = "BEGIN GENERATED IMPORTS (sdk/guest_imports.py)"
END = "END GENERATED IMPORTS"

# Parameter names, in the order of each import's signature.
PARAM_NAMES: dict[str, tuple[str, ...]] = {
    "durable_call": ("service", "operation", "request"),
    "durable_call_with_retry": (
        "service",
        "operation",
        "request",
        "max_attempts",
        "initial_interval_ms",
        "backoff_coefficient_x100",
        "max_interval_ms",
        "non_retryable_errors",
    ),
    "durable_call_with_heartbeat": ("service", "operation", "request", "heartbeat_interval_ms"),
    "durable_send": ("service", "operation", "request"),
    "durable_schedule_invoke": ("service", "operation", "request", "delay_ms"),
    "fetch": ("method", "url", "headers", "body"),
    "plugin_call": ("plugin", "function", "input"),
    "plugin_call_streaming": ("plugin", "function", "input"),
    "now": (),
    "random": (),
    "uuid": ("seed",),
    "side_effect": ("value",),
    "workflow_id": (),
    "run_id": (),
    "version": (),
    "min_version": (),
    "durable_log": ("level", "message"),
    "json_parse": ("input",),
    "json_stringify": ("input",),
    "durable_sleep": ("duration_ms",),
    "durable_await_signals": ("names", "timeout_ms"),
    "poll_signal": ("name",),
    "poll_cancellation": (),
    "signal_workflow": ("target_id", "name", "payload"),
    "send_signal_and_wait": ("target_id", "name", "payload", "timeout_ms"),
    "reply_to_signal": ("correlation_id", "response"),
    "create_promise": ("name",),
    "await_promise": ("promise_id", "timeout_ms"),
    "resolve_promise": ("promise_id", "value"),
    "reject_promise": ("promise_id", "message"),
    "register_update_handler": ("export_name",),
    "set_query_state": ("key", "value"),
    "child_workflow": ("name", "input"),
    "child_workflow_with_options": (
        "name",
        "input",
        "version",
        "priority",
        "parent_close_policy",
    ),
    "await_child": ("run_id",),
    "await_all_children": ("run_ids",),
    "await_any_child": ("run_ids",),
    "poll_child": ("run_id",),
    "continue_as_new": ("input",),
    "continue_as_new_with_version": ("input", "version"),
    "run_detached": ("name", "input"),
    "durable_defer": ("export_name",),
    "set_state": ("key", "value"),
    "get_state": ("key",),
    "delete_state": ("key",),
    "incr_state": ("key", "delta"),
    "has_state": ("key",),
    "list_state": ("prefix",),
    "set_scope": ("object_type", "instance_key"),
    "get_scope": (),
    "acquire_lock": ("key", "ttl_ms"),
    "release_lock": ("key",),
    "schedule_cron": ("workflow_name", "cron_expr", "timezone", "input"),
    "delete_cron": ("schedule_id",),
    "list_crons": (),
}


def _params(imp: HostImport) -> list[tuple[str, str]]:
    """``(name, code)`` per wasm-level parameter group: ``s`` is one string (two params)."""
    names = PARAM_NAMES[imp.name]
    if len(names) != len(imp.params):
        raise SystemExit(f"{imp.name}: {len(names)} names for signature {imp.params!r}")
    return list(zip(names, imp.params, strict=True))


def _comment(imp: HostImport) -> str:
    kind = "packed buffer" if imp.returns == "P" else "scalar"
    return f"{kind}{', blocking' if imp.blocking else ''}"


def rust(imp: HostImport) -> list[str]:
    args: list[str] = []
    for name, code in _params(imp):
        if code == "s":
            args += [f"{name}_ptr: *const u8", f"{name}_len: usize"]
        else:
            args.append(f"{name}: {'i64' if code == 'I' else 'i32'}")
    return [f"    /// {_comment(imp)}", f"    pub fn {imp.name}({', '.join(args)}) -> i64;"]


def c(imp: HostImport) -> list[str]:
    args: list[str] = []
    for name, code in _params(imp):
        if code == "s":
            args += [f"const char *{name}", f"size_t {name}_len"]
        else:
            args.append(f"{'int64_t' if code == 'I' else 'int32_t'} {name}")
    return [
        f"/* {_comment(imp)} */",
        f'__attribute__((import_module("env"), import_name("{imp.name}")))',
        f"int64_t cleat_sys_{imp.name}({', '.join(args) or 'void'});",
    ]


def zig(imp: HostImport) -> list[str]:
    args: list[str] = []
    for name, code in _params(imp):
        if code == "s":
            args += [f"{name}_ptr: [*]const u8", f"{name}_len: usize"]
        else:
            args.append(f"{name}: {'i64' if code == 'I' else 'i32'}")
    return [
        f"    /// {_comment(imp)}",
        f'    pub extern "env" fn {imp.name}({", ".join(args)}) i64;',
    ]


def assemblyscript(imp: HostImport) -> list[str]:
    args: list[str] = []
    for name, code in _params(imp):
        if code == "s":
            args += [f"{name}_ptr: usize", f"{name}_len: usize"]
        else:
            args.append(f"{name}: {'i64' if code == 'I' else 'i32'}")
    return [
        f"// {_comment(imp)}",
        f'@external("env", "{imp.name}")',
        f"export declare function {imp.name}({', '.join(args)}): i64;",
    ]


TARGETS: dict[str, Callable[[HostImport], list[str]]] = {
    "sdk/rust/cleat/src/sys.rs": rust,
    "sdk/c/cleat.h": c,
    "sdk/zig/cleat.zig": zig,
    "sdk/assemblyscript/assembly/sys.ts": assemblyscript,
}


def render(path: str) -> str:
    """``path`` with its generated block rewritten."""
    generate = TARGETS[path]
    text = (ROOT / path).read_text()
    lines = text.split("\n")
    try:
        start = next(i for i, line in enumerate(lines) if BEGIN in line)
        stop = next(i for i, line in enumerate(lines) if END in line and i > start)
    except StopIteration:
        raise SystemExit(f"{path}: no {BEGIN!r} ... {END!r} block") from None
    body = [line for imp in IMPORTS for line in generate(imp)]
    return "\n".join([*lines[: start + 1], *body, *lines[stop:]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale blocks")
    args = parser.parse_args(argv)
    stale = []
    for path in TARGETS:
        if not (ROOT / path).exists():
            continue
        new = render(path)
        if new != (ROOT / path).read_text():
            stale.append(path)
            if not args.check:
                (ROOT / path).write_text(new)
    if args.check and stale:
        print("out of date (run python sdk/guest_imports.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
