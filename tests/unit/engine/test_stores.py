"""A segment's store (engine.backend.new_store): made and deleted through the libwasmtime
handle that keeps the GIL (engine.ffi.Store), and otherwise wasmtime-py's own store."""

from __future__ import annotations

import ctypes
import gc
from typing import Any

import pytest
import wasmtime

from engine import ffi
from engine.backend import new_store
from engine.config import EngineConfig

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


def test_a_closed_store_says_so_and_closes_once(
    engine: wasmtime.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    deleted: list[Any] = []
    real = ffi._store_delete
    monkeypatch.setattr(ffi, "_store_delete", lambda ptr: (deleted.append(ptr), real(ptr)))
    store = new_store(engine, EngineConfig())
    store.close()
    store.close()
    assert len(deleted) == 1
    with pytest.raises(ValueError, match="already closed"):
        store._context()
    with pytest.raises(ValueError, match="already closed"):
        store.ptr()


def test_a_store_nobody_closed_is_deleted_when_collected(
    engine: wasmtime.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    deleted: list[Any] = []
    real = ffi._store_delete
    monkeypatch.setattr(ffi, "_store_delete", lambda ptr: (deleted.append(ptr), real(ptr)))
    store = new_store(engine, EngineConfig())
    del store
    gc.collect()
    assert len(deleted) == 1
