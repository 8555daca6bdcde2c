"""Long operations say what they are doing (issue 18, point 8): a Python workflow's build
that is not in the build cache (componentize-py, tens of seconds) and the first compile of
a component (seconds) each announce themselves before they start."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import wasmtime
from cleat_workflow import build

from engine.config import EngineConfig
from engine.errors import InvalidModule
from engine.runtime import WasmRuntime


def fake_componentize(
    app: Path, module: str, extra: Any, directory: Path, cached: Path, progress: Any = None
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(b"\0asm component of " + app.name.encode())


def test_a_build_not_in_the_cache_says_it_starts_and_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(build, "_componentize", fake_componentize)
    app = tmp_path / "orders.py"
    app.write_text("from cleat_workflow import workflow\n")
    said: list[str] = []
    first = build.build_component(app, cache=tmp_path / "cache", progress=said.append)
    assert not first.cached
    assert len(said) == 2
    assert said[0].startswith("building orders.py") and "componentize-py" in said[0]
    assert said[1].startswith("built orders.py in ")

    said.clear()
    again = build.build_component(app, cache=tmp_path / "cache", progress=said.append)
    assert again.cached and said == []  # from the cache: nothing to wait for

    build.build_component(app, cache=tmp_path / "cache", force=True)  # default: stderr
    err = capsys.readouterr().err
    assert "cleat: building orders.py" in err and "cleat: built orders.py" in err


def test_compiling_a_component_is_announced_before_it_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = WasmRuntime(EngineConfig(module_cache_dir=tmp_path))
    component = wasmtime.wat2wasm("(component)")
    with caplog.at_level(logging.INFO, logger="cleat.engine"), pytest.raises(InvalidModule):
        runtime.load(bytes(component))  # compiles, then is refused: not the cleat world
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("compiling component") and "cached" in m for m in messages), messages
