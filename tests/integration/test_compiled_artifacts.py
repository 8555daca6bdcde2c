"""Compiled modules shared through the database (workflows/artifacts.py): the deploy's compile
serves a worker whose own disk cache is empty; an artifact that fails its HMAC is refused
(wasmtime would load it as native code) and the module is compiled instead. Runs on SQLite,
PostgreSQL (as the application role) and MariaDB."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.runtime import WasmRuntime
from tests.fixtures.wat import Wat
from workflows import artifacts, definitions
from workflows.executor import get_runtime
from workflows.models import CompiledArtifact

pytestmark = pytest.mark.django_db(transaction=True)


def module(n: int) -> bytes:
    w = Wat()
    w.run(f"(call $recn (i64.const {n})) (call $finish)")
    return w.wasm()


def fresh_runtime(directory: Path) -> WasmRuntime:
    """A worker on another machine: its own (empty) disk cache, the shared artifacts."""
    runtime = WasmRuntime(EngineConfig(module_cache_dir=directory))
    runtime.modules.shared = artifacts.DatabaseArtifacts()
    return runtime


def test_a_deploy_shares_its_compile_with_a_worker_on_another_disk(
    tenant: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(artifacts, "CHUNK_BYTES", 4096)  # several chunks, as a component has
    wasm = module(4242)
    deployed = definitions.deploy_definition(tenant, "shared", wasm)
    rows = list(CompiledArtifact.objects.filter(name__startswith=deployed.sha256))
    assert rows and {r.chunks for r in rows} == {len(rows)} and len(rows) > 1
    assert sum(len(bytes(r.data)) for r in rows) == rows[0].size

    worker = fresh_runtime(tmp_path / "other-machine")
    worker.load(wasm)
    assert (worker.modules.shared_hits, worker.modules.misses) == (1, 0)
    assert get_runtime().modules.shared is not None  # the project's runtime shares too


def test_an_artifact_that_fails_its_check_is_compiled_instead(tenant: Any, tmp_path: Path) -> None:
    wasm = module(4343)
    deployed = definitions.deploy_definition(tenant, "tampered", wasm)
    first = CompiledArtifact.objects.filter(name__startswith=deployed.sha256, seq=0)
    data = bytearray(bytes(first.get().data))
    data[len(data) // 2] ^= 0xFF
    first.update(data=bytes(data))

    worker = fresh_runtime(tmp_path / "other-machine")
    worker.load(wasm)
    assert (worker.modules.shared_hits, worker.modules.misses) == (0, 1)


def test_sharing_can_be_turned_off(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from workflows import executor

    monkeypatch.setattr(executor, "_runtime", None)  # the next get_runtime() makes a new one
    settings.CLEAT_SHARE_COMPILED = False
    assert get_runtime().modules.shared is None
    monkeypatch.setattr(executor, "_runtime", None)
    settings.CLEAT_SHARE_COMPILED = True
    assert isinstance(get_runtime().modules.shared, artifacts.DatabaseArtifacts)
