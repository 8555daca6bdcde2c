"""The wasmtime runtime: one engine with epoch interruption, its ticker thread, the module
cache, and a backend per module kind (``engine.core_backend`` for core modules,
``engine.component`` for components, made on first use), picked by the module's kind when
it is loaded and when it runs.

Budgets: epoch interruption is always on (the ticker advances the epoch every
``epoch_tick_s``), so a guest that never calls the host still stops at its deadline; fuel is
optional (see ``engine.core_backend``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import wasmtime

from engine.backend import LoadedModule, ModuleBackend, ModuleInfo, detect_kind, new_store
from engine.config import EngineConfig
from engine.core_backend import CoreBackend
from engine.errors import InvalidModule
from engine.events import EncodedEvent
from engine.module_cache import WASMTIME_VERSION, ModuleCache
from engine.outcomes import SegmentResult
from engine.ready_instances import ReadyStats
from engine.services import Services
from engine.session import RunInfo
from engine.storage import WorkflowStorage

if TYPE_CHECKING:
    # For the annotation only: the component backend is imported when first used (it
    # costs a WASI linker), see ``components``.
    from engine.component import ComponentBackend


class EpochTicker:
    """Advances the engine's epoch every ``tick_s`` so deadlines fire without guest help."""

    def __init__(self, engine: wasmtime.Engine, tick_s: float) -> None:
        self._engine = engine
        self._tick_s = tick_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cleat-epoch-ticker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._tick_s):
            self._engine.increment_epoch()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)


class WasmRuntime:
    """Owns the wasmtime engine, the epoch ticker, the module cache and the backends (the
    core one with its linker of every ABI v1 import). Thread-safe: segments may run on
    several threads at once."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        wasm_config = wasmtime.Config()
        wasm_config.epoch_interruption = True
        if self.config.fuel:
            wasm_config.consume_fuel = True
        self.engine = wasmtime.Engine(wasm_config)
        self.core = CoreBackend(self.engine, self.config)
        self._ticker = EpochTicker(self.engine, self.config.epoch_tick_s)
        self.modules = ModuleCache(
            self.backend, self.config, self.config.module_cache_size, self.config.module_cache_dir
        )

    def close(self) -> None:
        self._ticker.stop()
        if "components" in self.__dict__:  # made on first use (cached_property)
            self.components.close()

    @functools.cached_property
    def components(self) -> ComponentBackend:
        """The backend of kind "component" (Python workflows), made on first use."""
        from engine.component import ComponentBackend

        return ComponentBackend(self.engine, self.config)

    def ready_stats(self) -> ReadyStats | None:
        """The counts of the component instances made ahead (``engine.ready_instances``);
        None before the first component ran, or with ``ready_instances`` 0."""
        if "components" not in self.__dict__:
            return None
        ready = self.components.ready
        return ready.stats if ready is not None else None

    def warmed_instances(self) -> int | None:
        """Instances whose first call's pages were put in place ahead (``engine.warm_pages``);
        None before the first component ran, or with warm pages off."""
        if "components" not in self.__dict__:
            return None
        warm = self.components.warm
        return warm.warmed if warm is not None else None

    def backend(self, kind: str) -> ModuleBackend:
        """The backend that loads and runs modules of ``kind`` ("core" or "component")."""
        if kind == "core":
            return self.core
        if kind == "component":
            return self.components
        raise InvalidModule(f"no backend runs modules of kind {kind!r}")

    # --- loading ---

    def new_store(self) -> wasmtime.Store:
        """A store for one segment, with the configured limits, deadline and fuel."""
        return new_store(self.engine, self.config)

    def inspect(self, wasm: bytes) -> ModuleInfo:
        """Validate ``wasm`` for deployment (compiling and caching it) and describe it."""
        if not wasm:
            raise InvalidModule("the module is empty")
        return self.load(wasm).info

    def load(self, wasm: bytes, sha: str | None = None) -> LoadedModule:
        return self.modules.get(wasm, sha)

    def load_once(self, sha: str, fetch: Callable[[], bytes]) -> LoadedModule:
        """The module of ``sha``, its bytes fetched (``fetch``) only when it is not in
        memory, and loaded by one thread when several ask at once
        (:meth:`ModuleCache.get_or_fetch`)."""
        return self.modules.get_or_fetch(sha, fetch)

    # --- running ---

    def run_segment(
        self,
        module: LoadedModule,
        run: RunInfo,
        history: Sequence[EncodedEvent],
        storage: WorkflowStorage,
        services: Services,
        clock: Callable[[], int] | None = None,
    ) -> SegmentResult:
        """Instantiate ``module`` and run ``run`` from the start against ``history``, on the
        backend of the module's kind.

        Returns the segment's result; raises :class:`FenceLost` when another worker owns the
        run now (nothing of this segment may be written then).
        """
        backend = self.backend(module.info.kind)
        return backend.run_segment(module, run, history, storage, services, clock)


# LoadedModule, ModuleInfo, detect_kind and WASMTIME_VERSION are re-exported for the callers
# that import them from here (the testing environment).
__all__ = [
    "WASMTIME_VERSION",
    "EpochTicker",
    "LoadedModule",
    "ModuleInfo",
    "WasmRuntime",
    "detect_kind",
]
