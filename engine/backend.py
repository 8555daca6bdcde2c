"""What the runtime needs from a backend, and what the backends share.

A module is run by the backend of its kind: ``engine.core_backend`` for core modules
(guest ABI v1 as ``env`` imports), ``engine.component`` for components (the same operations
through the WIT world). :class:`WasmRuntime` picks the backend from the binary's header
(:func:`detect_kind`) when it loads a module, and from ``ModuleInfo.kind`` when it runs one;
the module cache hands loading to the same backend. Both make their stores with
:func:`new_store` and classify what ended a segment in ``engine.traps``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import wasmtime

from engine.config import EngineConfig
from engine.errors import InvalidModule
from engine.events import EncodedEvent
from engine.ffi import U64, Store, set_epoch_deadline, store_limiter
from engine.outcomes import SegmentResult
from engine.services import Services
from engine.session import RunInfo
from engine.storage import WorkflowStorage

CORE_HEADER = b"\x00asm\x01\x00\x00\x00"
COMPONENT_LAYER = b"\x00asm\x0d\x00\x01\x00"


def detect_kind(wasm: bytes) -> str:
    """``"core"`` or ``"component"`` from the binary header; raises InvalidModule otherwise."""
    if wasm[:8] == CORE_HEADER:
        return "core"
    if wasm[:8] == COMPONENT_LAYER:
        return "component"
    if wasm[:4] == b"\x00asm":
        raise InvalidModule(f"unsupported WebAssembly binary version {wasm[4:8].hex()}")
    raise InvalidModule("not a WebAssembly binary (missing the \\0asm header)")


@dataclass(frozen=True, slots=True)
class ModuleInfo:
    """What deploy records about a module."""

    sha256: str
    kind: str
    abi_version: int
    entry_points: tuple[str, ...]  # exports with the entry signature (i32, i32) -> i64
    imports: tuple[str, ...]
    size: int


def has_start_function(wasm: bytes) -> bool:
    """Whether the core module ``wasm`` (compiled already, so well formed) has a start
    section: a function its instantiation runs. Read off the section headers; True too when
    they cannot be read, the answer that costs nothing but speed."""
    pos = len(CORE_HEADER)
    try:
        while pos < len(wasm):
            section_id = wasm[pos]
            size, shift = 0, 0
            while True:  # the section's size: an unsigned LEB128
                pos += 1
                size |= (wasm[pos] & 0x7F) << shift
                shift += 7
                if not wasm[pos] & 0x80:
                    break
            if section_id == START_SECTION:
                return True
            pos += 1 + size
    except IndexError:
        return True
    return False


START_SECTION = 8


@dataclass(frozen=True, slots=True)
class LoadedModule:
    info: ModuleInfo
    module: wasmtime.Module
    pre: wasmtime.InstancePre
    # The module has no start function: its instantiation runs no guest code, so it may keep
    # the GIL (engine.ffi.instantiate). With one it may not: a start function that runs
    # until its deadline would hold the GIL from the epoch ticker's thread, which ends it.
    no_start: bool = field(default=False, kw_only=True)


class ArtifactCache(Protocol):
    """The disk-cache bookkeeping a backend's ``load`` reports to (``ModuleCache``)."""

    disk_hits: int
    misses: int

    def touch(self, path: Path) -> None: ...

    def prune_disk(self, keep: str = "") -> list[str]: ...

    @staticmethod
    def store_artifact(path: Path, data: bytes) -> None: ...


class ModuleBackend(Protocol):
    """Loads and runs the modules of one kind ("core" or "component")."""

    def load(self, wasm: bytes, sha: str, cache: ArtifactCache, path: Path | None) -> LoadedModule:
        """Compile ``wasm`` (or deserialize it from the disk cache at ``path``), check it
        against ABI v1 and describe it. Raises InvalidModule with the first problem."""
        ...

    def run_segment(
        self,
        module: LoadedModule,
        run: RunInfo,
        history: Sequence[EncodedEvent],
        storage: WorkflowStorage,
        services: Services,
        clock: Callable[[], int] | None = None,
    ) -> SegmentResult:
        """Instantiate ``module`` and run ``run`` from the start against ``history``."""
        ...


def new_store(
    engine: wasmtime.Engine, config: EngineConfig, *, keep_gil_to_delete: bool = True
) -> wasmtime.Store:
    """A store for one segment, of either kind: the configured limits, epoch deadline and
    fuel (``keep_gil_to_delete``: see engine.ffi.Store)."""
    cfg = config
    store = Store(engine, keep_gil_to_delete=keep_gil_to_delete)
    # Store.set_limits and Store.set_epoch_deadline, through the handle that keeps the GIL
    # (engine.ffi): the limits on memory, table elements, instances, tables and memories.
    store_limiter(
        store.ptr(),
        cfg.memory_limit_bytes,
        cfg.max_table_elements,
        cfg.max_instances,
        cfg.max_tables,
        cfg.max_instances,
    )
    set_epoch_deadline(store._context(), U64(cfg.deadline_ticks))
    if cfg.fuel:
        store.set_fuel(cfg.fuel)
    return store
