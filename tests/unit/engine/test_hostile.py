"""Hostile guests: modules that loop, hog memory, break the ABI or are not modules at all.

Every test ends by running a well-behaved workflow on the same runtime, to show that the
hostile one left the engine healthy; two of them also run in a child process that must exit 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import wasmtime

from engine.backend import detect_kind
from engine.config import MIB, WASM_PAGE, EngineConfig
from engine.errors import InvalidModule, UnsupportedAbiVersion
from engine.runtime import WasmRuntime
from engine.testing import WorkflowEnvironment

REPO = Path(__file__).resolve().parents[3]

# Short budgets keep the suite fast: the infinite loop costs one deadline.
TIMEOUT_S = 0.5
MEMORY_LIMIT = 4 * MIB
HOSTILE_CONFIG = EngineConfig(
    segment_timeout_s=TIMEOUT_S, epoch_tick_s=0.01, memory_limit_bytes=MEMORY_LIMIT
)

BUMP_ALLOC = """
  (global $heap (mut i32) (i32.const 1024))
  (func (export "cleat_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
"""
MEMORY_1 = '(memory (export "memory") 1)'
LOG_IMPORT = '(import "env" "durable_log" (func $log (param i32 i32 i32) (result i64)))'


def packed(ptr: int, length: int) -> int:
    """The packed-buffer i64 of ABI.md section 2, computed here independently of engine.abi."""
    return (ptr << 32) | length


def core_module(
    body: str,
    *,
    imports: str = "",
    memory: str = MEMORY_1,
    alloc: str = BUMP_ALLOC,
    extra: str = "",
) -> bytes:
    """Assemble a core module: imports, memory, allocator, extra items, then ``run``."""
    return wasmtime.wat2wasm(
        f"""(module
  {imports}
  {memory}
  {alloc}
  {extra}
  (func $run (export "run") (param $ptr i32) (param $len i32) (result i64)
    {body}))"""
    )


GOOD_RESULT = '{"ok":true}'
GOOD_RESULT_WAT = GOOD_RESULT.replace('"', '\\"')
GOOD_WAT = f"""(module
  {LOG_IMPORT}
  {MEMORY_1}
  {BUMP_ALLOC}
  (data (i32.const 16) "\\00{GOOD_RESULT_WAT}")
  (data (i32.const 64) "fine")
  (func (export "run") (param $ptr i32) (param $len i32) (result i64)
    (drop (call $log (i32.const 1) (i32.const 64) (i32.const 4)))
    (i64.const {packed(16, 1 + len(GOOD_RESULT))})))"""

INFINITE_LOOP_WAT = f"""(module
  {MEMORY_1}
  {BUMP_ALLOC}
  (func (export "run") (param $ptr i32) (param $len i32) (result i64)
    (loop $forever (br $forever))
    (i64.const 0)))"""

MEMORY_BOMB_WAT = f"""(module
  {MEMORY_1}
  {BUMP_ALLOC}
  (func (export "run") (param $ptr i32) (param $len i32) (result i64)
    (loop $more
      (br_if $more (i32.ne (memory.grow (i32.const 1)) (i32.const -1))))
    unreachable))"""


def good_workflow_runs(runtime: WasmRuntime) -> bool:
    """Run the well-behaved workflow on ``runtime``; True when it completed as expected."""
    env = WorkflowEnvironment(runtime=runtime)
    env.deploy("good", wasmtime.wat2wasm(GOOD_WAT))
    run = env.run("good")
    history = env.history(run)
    return env.result(run) == {"ok": True} and len(history) == 1


def run_hostile(runtime: WasmRuntime, wasm: bytes, input: object = None) -> dict[str, object]:
    """Deploy ``wasm`` on ``runtime``, run it once, and return the run's description."""
    env = WorkflowEnvironment(runtime=runtime)
    env.deploy("hostile", wasm)
    return env.describe(env.run("hostile", input))


@pytest.fixture(scope="module")
def runtime() -> Iterator[WasmRuntime]:
    rt = WasmRuntime(HOSTILE_CONFIG)
    yield rt
    rt.close()


def test_good_workflow_completes(runtime: WasmRuntime) -> None:
    """The control used after every hostile guest really runs and checks its result."""
    env = WorkflowEnvironment(runtime=runtime)
    env.deploy("good", wasmtime.wat2wasm(GOOD_WAT))
    run = env.run("good")
    assert env.describe(run)["status"] == "done"
    assert json.loads(env.describe(run)["result"]) == {"ok": True}
    assert good_workflow_runs(runtime)


# --- time and memory ---------------------------------------------------------------------


def test_infinite_loop_stops_at_the_deadline(runtime: WasmRuntime) -> None:
    """A guest that never calls the host is interrupted within 2x its deadline."""
    env = WorkflowEnvironment(runtime=runtime)
    env.deploy("loop", wasmtime.wat2wasm(INFINITE_LOOP_WAT))
    run = env.start("loop")
    started = time.monotonic()
    env.run_until_idle()
    elapsed = time.monotonic() - started
    described = env.describe(run)
    # A timeout is retryable: the run waits for its retry, as under a worker.
    assert (described["status"], described["error_code"]) == ("ready", "timeout")
    assert described["waiting_on"] == "retry 2 of 3 after timeout"
    assert elapsed < 2 * TIMEOUT_S, f"the loop ran {elapsed:.2f} s for a {TIMEOUT_S} s deadline"
    assert elapsed >= TIMEOUT_S * 0.9, f"interrupted after {elapsed:.2f} s, before the deadline"
    assert good_workflow_runs(runtime)


def test_memory_bomb_fails_with_resource_limit(runtime: WasmRuntime) -> None:
    """Growing memory until the store refuses, then trapping, is a resource_limit failure."""
    described = run_hostile(runtime, wasmtime.wat2wasm(MEMORY_BOMB_WAT))
    assert described["status"] == "failed"
    assert described["error_code"] == "resource_limit"
    assert str(MEMORY_LIMIT) in str(described["error"])
    assert good_workflow_runs(runtime)


def test_declared_minimum_memory_over_the_limit_is_resource_limit(runtime: WasmRuntime) -> None:
    """A module whose initial memory exceeds the limit cannot even be instantiated."""
    pages = MEMORY_LIMIT // WASM_PAGE + 1
    wasm = core_module("(i64.const 0)", memory=f'(memory (export "memory") {pages})')
    described = run_hostile(runtime, wasm)
    assert described["status"] == "failed"
    assert described["error_code"] == "resource_limit"
    assert good_workflow_runs(runtime)


def test_fuel_exhaustion_is_resource_limit() -> None:
    """With fuel metering on, a spinning guest runs out of fuel long before its deadline."""
    rt = WasmRuntime(EngineConfig(fuel=100_000, segment_timeout_s=30, epoch_tick_s=0.01))
    try:
        started = time.monotonic()
        described = run_hostile(rt, wasmtime.wat2wasm(INFINITE_LOOP_WAT))
        assert time.monotonic() - started < 5
        assert described["status"] == "failed"
        assert described["error_code"] == "resource_limit"
        assert "fuel" in str(described["error"])
        assert good_workflow_runs(rt)  # a fresh store gets fresh fuel
    finally:
        rt.close()


# --- ABI contract violations -------------------------------------------------------------


def test_oversized_string_is_a_guest_fault_naming_the_function(runtime: WasmRuntime) -> None:
    """A 2 MiB string is refused before it is copied (the default maximum is 1 MiB)."""
    size = 2 * MIB
    wasm = core_module(
        f"(drop (call $log (i32.const 1) (i32.const 0) (i32.const {size}))) (i64.const 0)",
        imports=LOG_IMPORT,
        memory=f'(memory (export "memory") {size // WASM_PAGE + 2})',
    )
    described = run_hostile(runtime, wasm)
    assert described["error_code"] == "guest_fault"
    assert "durable_log" in str(described["error"])
    assert str(size) in str(described["error"])
    assert good_workflow_runs(runtime)


def test_out_of_bounds_pointer_is_a_guest_fault(runtime: WasmRuntime) -> None:
    """A (ptr, len) pair reaching past linear memory is a guest fault, not a host crash."""
    wasm = core_module(
        f"(drop (call $log (i32.const 1) (i32.const {WASM_PAGE - 10}) (i32.const 100)))"
        "(i64.const 0)",
        imports=LOG_IMPORT,
    )
    described = run_hostile(runtime, wasm)
    assert described["error_code"] == "guest_fault"
    assert "durable_log" in str(described["error"])
    assert "outside linear memory" in str(described["error"])
    assert good_workflow_runs(runtime)


def test_pointer_near_4_gib_does_not_wrap(runtime: WasmRuntime) -> None:
    """A negative i32 pointer (unsigned near 4 GiB) is out of bounds, not an alias of 0."""
    wasm = core_module(
        "(drop (call $log (i32.const 1) (i32.const -1) (i32.const 2))) (i64.const 0)",
        imports=LOG_IMPORT,
    )
    described = run_hostile(runtime, wasm)
    assert described["error_code"] == "guest_fault"
    assert "durable_log" in str(described["error"])
    assert good_workflow_runs(runtime)


def test_invalid_utf8_is_a_guest_fault(runtime: WasmRuntime) -> None:
    """Bytes that are not UTF-8 in a string argument are a guest fault naming the function."""
    wasm = core_module(
        "(drop (call $log (i32.const 1) (i32.const 200) (i32.const 3))) (i64.const 0)",
        imports=LOG_IMPORT,
        extra='(data (i32.const 200) "a\\ff\\fe")',
    )
    described = run_hostile(runtime, wasm)
    assert described["error_code"] == "guest_fault"
    assert "durable_log" in str(described["error"])
    assert "UTF-8" in str(described["error"])
    assert good_workflow_runs(runtime)


def test_allocator_returning_out_of_range_pointer_is_a_guest_fault(runtime: WasmRuntime) -> None:
    """cleat_alloc answers the input allocation honestly, then returns a pointer past memory
    when the host places the reply of ``workflow_id``."""
    lying_alloc = """
  (global $calls (mut i32) (i32.const 0))
  (func (export "cleat_alloc") (param $n i32) (result i32)
    (global.set $calls (i32.add (global.get $calls) (i32.const 1)))
    (if (result i32) (i32.eq (global.get $calls) (i32.const 1))
      (then (i32.const 1024))
      (else (i32.const 0x7fff0000))))"""
    wasm = core_module(
        "(drop (call $wid)) (i64.const 0)",
        imports='(import "env" "workflow_id" (func $wid (result i64)))',
        alloc=lying_alloc,
    )
    described = run_hostile(runtime, wasm)
    assert described["error_code"] == "guest_fault"
    assert str(described["error"]).startswith("workflow_id:")
    assert "cleat_alloc" in str(described["error"])
    assert str(0x7FFF0000) in str(described["error"])
    assert good_workflow_runs(runtime)


def test_entry_point_returning_empty_buffer_is_a_guest_fault(runtime: WasmRuntime) -> None:
    """A packed buffer of length 0 has no status byte: the guest broke the contract."""
    described = run_hostile(runtime, core_module("(i64.const 0)"))
    assert described["error_code"] == "guest_fault"
    assert "empty buffer" in str(described["error"])
    assert good_workflow_runs(runtime)


@pytest.mark.parametrize(
    ("body", "extra", "expected"),
    [
        (f"(i64.const {packed(0xFFFF00, 5)})", "", "outside linear memory"),
        (f"(i64.const {packed(300, 3)})", '(data (i32.const 300) "\\00\\ff\\fe")', "UTF-8"),
    ],
    ids=["out-of-range", "invalid-utf8"],
)
def test_entry_point_returning_a_bad_buffer_is_a_guest_fault(
    runtime: WasmRuntime, body: str, extra: str, expected: str
) -> None:
    """The entry point's own result is checked like any string from guest memory."""
    described = run_hostile(runtime, core_module(body, extra=extra))
    assert described["error_code"] == "guest_fault"
    assert str(described["error"]).startswith("run:")
    assert expected in str(described["error"])
    assert good_workflow_runs(runtime)


def test_allocator_failing_the_input_allocation_is_a_guest_fault(runtime: WasmRuntime) -> None:
    """A bad pointer for the input itself (before the guest runs) is the guest's fault too."""
    wasm = core_module(
        "(i64.const 0)",
        alloc='(func (export "cleat_alloc") (param i32) (result i32) (i32.const -16))',
    )
    described = run_hostile(runtime, wasm, {"some": "input"})
    assert described["error_code"] == "guest_fault"
    assert str(described["error"]).startswith("run:")
    assert "cleat_alloc" in str(described["error"])
    assert good_workflow_runs(runtime)


def test_unreachable_is_a_panic_with_a_wasm_backtrace(runtime: WasmRuntime) -> None:
    """A trap reports the guest's call stack with the function names of the name section."""
    wasm = core_module(
        "(call $middle) (i64.const 0)",
        extra="""
  (func $explode unreachable)
  (func $middle (call $explode))""",
    )
    described = run_hostile(runtime, wasm)
    assert described["error_code"] == "panic"
    message = str(described["error"])
    assert "unreachable" in message
    assert "backtrace" in message
    # innermost frame first: explode, called by middle, called by run
    assert message.index("explode") < message.index("middle") < message.index("run")
    assert good_workflow_runs(runtime)


# --- refused at inspection ---------------------------------------------------------------


def test_invalid_module_is_refused_with_wasmtimes_reason(runtime: WasmRuntime) -> None:
    """Bytes with a valid header and a broken body are refused with wasmtime's explanation."""
    broken = b"\x00asm\x01\x00\x00\x00\x01\xff\xff"
    with pytest.raises(wasmtime.WasmtimeError) as direct:
        wasmtime.Module(runtime.engine, broken)
    with pytest.raises(InvalidModule) as refused:
        runtime.inspect(broken)
    reason = str(direct.value).splitlines()[0]
    assert reason in str(refused.value)
    assert good_workflow_runs(runtime)


@pytest.mark.parametrize(
    "wasm",
    [b"", b"hello world", b"\x00asm\x02\x00\x00\x00"],
    ids=["empty", "not-wasm", "unknown-version"],
)
def test_non_modules_are_refused(runtime: WasmRuntime, wasm: bytes) -> None:
    """Empty bytes, non-wasm and unknown binary versions are refused before compiling."""
    with pytest.raises(InvalidModule):
        runtime.inspect(wasm)
    assert good_workflow_runs(runtime)


@pytest.mark.parametrize(
    ("imports", "expected"),
    [
        (
            '(import "env" "open_socket" (func (param i32) (result i64)))',
            "env.open_socket, which is not part of ABI v1",
        ),
        (
            '(import "wasi_snapshot_preview1" "durable_call"'
            " (func (param i32 i32 i32 i32 i32 i32) (result i64)))",
            "wasi_snapshot_preview1.durable_call, which is not part of ABI v1",
        ),
        (
            '(import "env" "durable_sleep" (func (param i32) (result i64)))',
            "env.durable_sleep with type",
        ),
        (
            '(import "env" "now" (func (result i32)))',
            "env.now with type",
        ),
        (
            '(import "env" "now" (global i64))',
            "env.now as a non-function",
        ),
    ],
    ids=["unknown-name", "wrong-module", "wrong-params", "wrong-result", "not-a-function"],
)
def test_imports_outside_abi_v1_are_refused(
    runtime: WasmRuntime, imports: str, expected: str
) -> None:
    """Only ABI v1 imports, with exactly their signatures, may be imported."""
    with pytest.raises(InvalidModule) as refused:
        runtime.inspect(core_module("(i64.const 0)", imports=imports))
    assert expected in str(refused.value)
    assert good_workflow_runs(runtime)


def test_wrong_signature_message_names_both_signatures(runtime: WasmRuntime) -> None:
    """The refusal says what the module declared and what ABI v1 expects."""
    imports = '(import "env" "durable_sleep" (func (param i32) (result i64)))'
    with pytest.raises(InvalidModule) as refused:
        runtime.inspect(core_module("(i64.const 0)", imports=imports))
    message = str(refused.value)
    assert "(('i32',), ('i64',))" in message
    assert "(('i64',), ('i64',))" in message
    assert good_workflow_runs(runtime)


@pytest.mark.parametrize(
    ("wat", "expected"),
    [
        (
            f'(module {BUMP_ALLOC} (func (export "run") (param i32 i32) (result i64)'
            " (i64.const 0)))",
            "memory",
        ),
        (
            f'(module {MEMORY_1} (func (export "run") (param i32 i32) (result i64) (i64.const 0)))',
            "cleat_alloc",
        ),
        (
            f'(module {MEMORY_1} (func (export "cleat_alloc") (param i64) (result i32)'
            ' (i32.const 0)) (func (export "run") (param i32 i32) (result i64) (i64.const 0)))',
            "cleat_alloc",
        ),
        (
            f'(module {MEMORY_1} {BUMP_ALLOC} (func (export "run") (param i32) (result i64)'
            " (i64.const 0)))",
            "no entry point",
        ),
    ],
    ids=["no-memory", "no-alloc", "alloc-wrong-type", "no-entry-point"],
)
def test_missing_exports_are_refused(runtime: WasmRuntime, wat: str, expected: str) -> None:
    """memory, cleat_alloc (i32) -> i32 and at least one entry point are required."""
    with pytest.raises(InvalidModule) as refused:
        runtime.inspect(wasmtime.wat2wasm(wat))
    assert expected in str(refused.value)
    assert good_workflow_runs(runtime)


def test_abi_version_2_is_refused(runtime: WasmRuntime) -> None:
    """A module declaring cleat_abi_version() == 2 is refused with UnsupportedAbiVersion."""
    wasm = core_module(
        "(i64.const 0)", extra='(func (export "cleat_abi_version") (result i32) (i32.const 2))'
    )
    with pytest.raises(UnsupportedAbiVersion) as refused:
        runtime.inspect(wasm)
    assert "version 2" in str(refused.value)
    assert "1" in str(refused.value).split("serves", 1)[1]
    assert good_workflow_runs(runtime)


def test_abi_version_1_is_accepted_and_recorded(runtime: WasmRuntime) -> None:
    """The control for the test above: version 1 declared explicitly passes inspection."""
    wasm = core_module(
        "(i64.const 0)", extra='(func (export "cleat_abi_version") (result i32) (i32.const 1))'
    )
    assert runtime.inspect(wasm).abi_version == 1


def test_abi_version_export_that_traps_is_refused(runtime: WasmRuntime) -> None:
    """A cleat_abi_version that traps is an invalid module, not a host crash."""
    wasm = core_module(
        "(i64.const 0)", extra='(func (export "cleat_abi_version") (result i32) unreachable)'
    )
    with pytest.raises(InvalidModule) as refused:
        runtime.inspect(wasm)
    assert "cleat_abi_version" in str(refused.value)
    assert good_workflow_runs(runtime)


def test_component_header_is_detected() -> None:
    """The component-model layer header is told apart from a core module."""
    assert detect_kind(b"\x00asm\x0d\x00\x01\x00" + b"\x00" * 8) == "component"
    assert detect_kind(wasmtime.wat2wasm(GOOD_WAT)) == "core"


def test_component_is_refused_by_the_core_runtime(runtime: WasmRuntime) -> None:
    """The core-module runtime says a component needs the component backend."""
    with pytest.raises(InvalidModule) as refused:
        runtime.inspect(b"\x00asm\x0d\x00\x01\x00")
    assert "component" in str(refused.value)
    assert good_workflow_runs(runtime)


# --- the process survives ----------------------------------------------------------------

SUBPROCESS_SCRIPT = """
import json, sys, wasmtime
from engine.testing import WorkflowEnvironment
from engine.runtime import WasmRuntime
from tests.unit.engine import test_hostile as h

rt = WasmRuntime(h.HOSTILE_CONFIG)
codes = []
for wat in (h.INFINITE_LOOP_WAT, h.MEMORY_BOMB_WAT):
    codes.append(h.run_hostile(rt, wasmtime.wat2wasm(wat))["error_code"])
good = h.good_workflow_runs(rt)
rt.close()
print(json.dumps({"codes": codes, "good": good}))
sys.exit(0 if good else 3)
"""


def test_hostile_guests_leave_a_fresh_process_healthy() -> None:
    """In a separate interpreter, the loop and the memory bomb fail cleanly, a good workflow
    still completes afterwards, and the process exits 0."""
    proc = subprocess.run(
        [sys.executable, "-c", SUBPROCESS_SCRIPT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"codes": ["timeout", "resource_limit"], "good": True}


def test_a_start_function_calling_the_host_is_a_guest_fault(runtime: WasmRuntime) -> None:
    """Host imports serve an execution segment, not instantiation: a start function that
    calls one fails the run with guest_fault naming the import, and the process goes on."""
    wasm = core_module(
        "(i64.const 0)",
        imports=LOG_IMPORT,
        extra='(data (i32.const 64) "early") (func $early (drop (call $log (i32.const 1) '
        "(i32.const 64) (i32.const 5)))) (start $early)",
    )
    info = run_hostile(runtime, wasm)
    assert info["status"] == "failed"
    assert info["error_code"] == "guest_fault"
    assert "durable_log" in str(info["error"])
    assert good_workflow_runs(runtime)
