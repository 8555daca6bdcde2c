"""Unit-test Python workflows fast: in-memory storage, virtual time, cached builds.

::

    from cleat_workflow.testing import PythonWorkflowEnvironment

    def test_order_waits_for_shipping():
        env = PythonWorkflowEnvironment(services={"payments": fake_payments})
        env.deploy_python("order", "examples/order_saga.py")
        run = env.run("order", {"sku": "book", "amount": 12})
        env.signal(run, "shipped", {"carrier": "ups"})
        env.run_until_idle()
        assert env.result(run)["status"] == "shipped"
        env.assert_replays(run)

    def test_the_new_build_replays_production_runs():
        # exported with ``manage.py export_history RUN_ID -o tests/histories/order-1.json``
        replay("tests/histories/order-1.json", "examples/order_saga.py")

The module is built through the build cache (``cleat_workflow.build``): the first test on
a machine pays for componentize-py, later ones reuse the component. The compiled component is
cached on disk as well (``$CLEAT_MODULE_CACHE_DIR``, default ``~/.cache/cleat/modules``, as
for the worker), so a new test process deserializes it instead of compiling it again. Host
side only: this module imports the engine and is never part of a component.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cleat_workflow.build import build_component
from engine.config import EngineConfig
from engine.outcomes import SegmentResult
from engine.recorded import RecordedRun
from engine.runtime import WasmRuntime
from engine.testing import WorkflowEnvironment
from engine.testing import replay as replay_module

_runtime: WasmRuntime | None = None
_lock = threading.Lock()


def compiled_cache_dir() -> Path:
    """The disk cache of compiled modules: ``$CLEAT_MODULE_CACHE_DIR``, else the default of
    the Django setting of that name (``~/.cache/cleat/modules``), so tests and workers on
    one machine share compiled components."""
    explicit = os.environ.get("CLEAT_MODULE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path.home() / ".cache" / "cleat" / "modules"


def component_runtime() -> WasmRuntime:
    """One runtime per process, with the disk cache of compiled modules and components."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = WasmRuntime(EngineConfig(module_cache_dir=compiled_cache_dir()))
        return _runtime


def build(app: str | Path) -> bytes:
    """The component built from ``app`` (through the build cache)."""
    return build_component(app).path.read_bytes()


class PythonWorkflowEnvironment(WorkflowEnvironment):
    """:class:`engine.testing.WorkflowEnvironment` that deploys Python workflow modules."""

    def __init__(self, services: Any = None, **kwargs: Any) -> None:
        if "runtime" not in kwargs and "config" not in kwargs:
            kwargs["runtime"] = component_runtime()
        super().__init__(services, **kwargs)

    def deploy_python(self, name: str, app: str | Path, version: int | None = None) -> int:
        """Build (or reuse) ``app`` and deploy it as ``name``; returns the version."""
        return self.deploy(name, build(app), version)


def replay(
    history: RecordedRun | Mapping[str, Any] | str | Path,
    app: str | Path | bytes,
    *,
    min_version: int | None = None,
) -> SegmentResult:
    """Replay an exported history (``manage.py export_history``) against the current code of
    a Python workflow module (``app``: its ``.py`` path, built through the build cache, or
    the bytes of a built component): :func:`engine.testing.replay`, which raises
    ``NondeterminismError`` naming the step where the code no longer does what the
    recorded run did."""
    wasm = app if isinstance(app, bytes) else build(app)
    return replay_module(history, wasm, runtime=component_runtime(), min_version=min_version)
