"""How the host calls a Python workflow's exports (engine.component._call_export): by the
world's signature, checked when the component is loaded, without asking wasmtime for the
function's type at every call, and with its values made and freed through the handle that
keeps the GIL."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import pytest
from wasmtime import _ffi as wasmtime_ffi

from engine import component
from engine.component import LoadedComponent, check_export_signatures
from engine.errors import InvalidModule
from engine.runtime import WasmRuntime
from engine.testing import WorkflowEnvironment
from tests.fixtures import FakeService
from tests.unit.sdk.test_ready_instances_component import runtime_with


@pytest.fixture(scope="module")
def runtime() -> Iterator[WasmRuntime]:
    rt = runtime_with(0)
    yield rt
    rt.close()


def environment(runtime: WasmRuntime, wasm: bytes) -> WorkflowEnvironment:
    from cleat_workflow.testing import PythonWorkflowEnvironment

    env = PythonWorkflowEnvironment({"audit": FakeService({"record": {}})}, runtime=runtime)
    env.deploy("with_defer", wasm)
    return env


def test_a_segment_calls_its_exports_without_asking_for_their_types(
    scenarios_wasm: bytes, runtime: WasmRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = environment(runtime, scenarios_wasm)
    env.run("with_defer", "x")  # loaded, and its exports' signatures checked
    asked: list[Any] = []
    real = wasmtime_ffi.wasmtime_component_func_type
    monkeypatch.setattr(
        wasmtime_ffi, "wasmtime_component_func_type", lambda *a: (asked.append(a), real(*a))[1]
    )
    done = env.run("with_defer", "x")  # run's ok, then dispatch (the defer) after a timer
    failed = env.run("with_defer", "fail")  # run's err: its status and message
    env.advance(seconds=1)
    assert (env.status(done), env.result(done)) == ("done", {"done": "x"})
    assert env.status(failed) == "failed"
    assert "asked to fail" in str(env.describe(failed)["error"])
    assert asked == []


def test_exports_without_the_worlds_signature_are_refused(
    scenarios_wasm: bytes, runtime: WasmRuntime
) -> None:
    loaded = runtime.load(scenarios_wasm)
    assert isinstance(loaded, LoadedComponent)
    exported = loaded.component.type.exports(runtime.engine)
    check_export_signatures(exported)  # the SDK's own: accepted
    with pytest.raises(InvalidModule, match="exports run with type"):
        check_export_signatures({**exported, "run": exported["describe"]})
    with pytest.raises(InvalidModule, match="exports dispatch with type"):
        check_export_signatures({**exported, "dispatch": exported["describe"]})


def test_the_values_of_a_call_are_made_and_freed_without_letting_the_gil_go() -> None:
    for function in (component._val_delete, component._vallist_new_uninit, component._byte_vec_new):
        assert function._flags_ & ctypes._FUNCFLAG_PYTHONAPI, function  # type: ignore[attr-defined]


def test_a_python_workflows_store_is_deleted_letting_the_gil_go(runtime: WasmRuntime) -> None:
    """Unmapping an instance's CPython heap takes about 170 µs: not with the GIL kept."""
    store = runtime.components._new_store()
    try:
        assert store._delete_store is wasmtime_ffi.wasmtime_store_delete  # type: ignore[attr-defined]
    finally:
        store.close()
