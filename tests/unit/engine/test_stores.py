"""A segment's store and instance made with the GIL kept: the store (engine.backend.new_store)
made and deleted through the libwasmtime handle that keeps it (engine.ffi.Store), otherwise
wasmtime-py's own store; a module instantiated through that handle only when it has no start
function (engine.ffi.instantiate, LoadedModule.no_start)."""

from __future__ import annotations

import ctypes
import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import wasmtime

from engine import core_backend, ffi
from engine.backend import has_start_function, new_store
from engine.config import EngineConfig
from engine.runtime import WasmRuntime
from engine.testing import WorkflowEnvironment
from tests.unit.engine.test_hostile import (
    GOOD_WAT,
    HOSTILE_CONFIG,
    TIMEOUT_S,
    core_module,
)

ADD_WAT = """
(module
  (memory (export "memory") 1)
  (func (export "add") (param i32 i32) (result i32)
    local.get 0 local.get 1 i32.add))
"""


@pytest.fixture
def engine() -> wasmtime.Engine:
    config = wasmtime.Config()
    config.epoch_interruption = True
    return wasmtime.Engine(config)


def test_the_store_is_made_and_deleted_without_letting_the_gil_go() -> None:
    # A CDLL function releases the GIL for its call; a PyDLL one (FUNCFLAG_PYTHONAPI) keeps it.
    for function in (ffi._store_new, ffi._store_context, ffi._store_delete):
        assert function._flags_ & ctypes._FUNCFLAG_PYTHONAPI, function  # type: ignore[attr-defined]
    # wasmtime-py's own declaration of the same call lets it go: the check above can fail.
    own = wasmtime._bindings._wasmtime_store_new  # type: ignore[attr-defined]
    assert not own._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]


def test_a_segment_store_runs_a_module_with_its_limits(engine: wasmtime.Engine) -> None:
    store = new_store(engine, EngineConfig(memory_limit_bytes=2 * 65536))
    assert isinstance(store, ffi.Store) and isinstance(store, wasmtime.Store)
    instance = wasmtime.Instance(store, wasmtime.Module(engine, ADD_WAT), [])
    add = instance.exports(store)["add"]
    assert add(store, 40, 2) == 42
    memory = instance.exports(store)["memory"]
    assert memory.grow(store, 1) == 1  # to 2 pages: within the limit
    with pytest.raises(wasmtime.WasmtimeError):
        memory.grow(store, 1)  # a third page is past memory_limit_bytes
    store.close()


@pytest.fixture
def deleted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The stores deleted through engine.ffi (each one's address), while the test runs."""
    seen: list[int] = []
    real = ffi._store_delete
    monkeypatch.setattr(ffi, "_store_delete", lambda ptr: (seen.append(_address(ptr)), real(ptr)))
    return seen


def _address(pointer: Any) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


def test_a_closed_store_says_so_and_closes_once(
    engine: wasmtime.Engine, deleted: list[int]
) -> None:
    store = new_store(engine, EngineConfig())
    address = _address(store.ptr())
    store.close()
    store.close()
    assert deleted.count(address) == 1
    with pytest.raises(ValueError, match="already closed"):
        store._context()
    with pytest.raises(ValueError, match="already closed"):
        store.ptr()


def test_a_store_nobody_closed_is_deleted_when_collected(
    engine: wasmtime.Engine, deleted: list[int]
) -> None:
    store = new_store(engine, EngineConfig())
    address = _address(store.ptr())
    del store
    gc.collect()
    assert deleted.count(address) == 1  # (other tests' stores may be collected here too)


# --- the start section -------------------------------------------------------------------


def test_the_start_section_is_found_wherever_it_is() -> None:
    assert not has_start_function(wasmtime.wat2wasm(GOOD_WAT))
    assert has_start_function(wasmtime.wat2wasm("(module (func $s) (start $s))"))
    # After sections whose sizes take several LEB128 bytes (a 300-byte data segment), and
    # before the code and data sections that follow it.
    big = "x" * 300
    wasm = wasmtime.wat2wasm(
        f'(module (memory 1) (func $s) (start $s) (data (i32.const 0) "{big}"))'
    )
    assert has_start_function(wasm)
    assert not has_start_function(
        wasmtime.wat2wasm(f'(module (memory 1) (data (i32.const 0) "{big}"))')
    )


def test_unreadable_section_headers_count_as_a_start_function() -> None:
    whole = wasmtime.wat2wasm(GOOD_WAT)
    assert has_start_function(whole[:9])  # a section id without its size
    assert has_start_function(whole[:8] + b"\x01\x80")  # a size cut short


@pytest.fixture(scope="module")
def runtime() -> Any:
    rt = WasmRuntime(HOSTILE_CONFIG)
    yield rt
    rt.close()


def _instantiations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    held: list[str] = []
    real = core_backend.instantiate
    monkeypatch.setattr(
        core_backend, "instantiate", lambda pre, store: (held.append("held"), real(pre, store))[1]
    )
    return held


def test_a_module_without_a_start_function_is_instantiated_with_the_gil_kept(
    runtime: WasmRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = _instantiations(monkeypatch)
    env = WorkflowEnvironment(runtime=runtime)
    env.deploy("good", wasmtime.wat2wasm(GOOD_WAT))
    run = env.run("good")
    assert env.result(run) == {"ok": True}
    assert held == ["held"]


def test_a_module_with_a_start_function_lets_the_gil_go_while_it_runs(
    runtime: WasmRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = _instantiations(monkeypatch)
    # The start function sets a global the run returns: it ran, through wasmtime-py's call.
    wasm = core_module(
        "(i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.extend_i32_u (global.get $n)))",
        extra='(global $n (mut i32) (i32.const 0)) (data (i32.const 16) "\\00{}")'
        " (func $init (global.set $n (i32.const 3))) (start $init)",
    )
    env = WorkflowEnvironment(runtime=runtime)
    env.deploy("starts", wasm)
    run = env.run("starts")
    assert env.describe(run)["status"] == "done", env.describe(run)
    assert env.result(run) == {}
    assert held == []


SPIN_SCRIPT = """
import json, time
from engine.runtime import WasmRuntime
from engine.testing import WorkflowEnvironment
from tests.unit.engine import test_hostile as h

rt = WasmRuntime(h.HOSTILE_CONFIG)
env = WorkflowEnvironment(runtime=rt)
env.deploy("spins", h.core_module(
    "(i64.const 0)", extra="(func $spin (loop $l (br $l))) (start $spin)"))
run = env.start("spins")
started = time.monotonic()
env.run_until_idle()
described = env.describe(run)
print(json.dumps({
    "status": described["status"], "error_code": described["error_code"],
    "seconds": time.monotonic() - started, "good": h.good_workflow_runs(rt),
}))
rt.close()
"""


def test_a_start_function_that_never_returns_stops_at_the_deadline() -> None:
    """Its instantiation lets the GIL go, so the epoch ticker's thread runs and ends it; with
    the GIL kept through it nothing would, and the whole process would hang (hence a process
    of its own, with a timeout)."""
    proc = subprocess.run(
        [sys.executable, "-c", SPIN_SCRIPT],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (report["status"], report["error_code"]) == ("ready", "timeout"), report
    assert report["seconds"] < 2 * TIMEOUT_S
    assert report["good"] is True


def test_a_store_slow_to_unmap_is_deleted_letting_the_gil_go(
    engine: wasmtime.Engine, deleted: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    released: list[int] = []
    real = wasmtime._ffi.wasmtime_store_delete
    monkeypatch.setattr(
        wasmtime._ffi,
        "wasmtime_store_delete",
        lambda ptr: (released.append(_address(ptr)), real(ptr)),
    )
    store = new_store(engine, EngineConfig(), keep_gil_to_delete=False)
    address = _address(store.ptr())
    store.close()
    assert released == [address]
    assert address not in deleted
