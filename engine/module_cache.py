"""The module cache: compiled modules in an in-memory LRU, backed by a disk cache of
wasmtime's serialized artifacts. Loading itself (compile or deserialize, check, link) is the
backend's, chosen by the module's kind; the cache keeps the bookkeeping (hits, misses, the
artifacts' names and their pruning)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import logging
import os
import re
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from engine.backend import LoadedModule, ModuleBackend, detect_kind
from engine.config import EngineConfig

log = logging.getLogger("cleat.engine")

WASMTIME_VERSION = importlib.metadata.version("wasmtime")

_ARTIFACT_NAME = re.compile(r"^[0-9a-f]{64}-wasmtime[^/]*\.(cwasm|guest\.json)$")


class SharedArtifacts(Protocol):
    """Serialized artifacts every worker can reach (the database, ``workflows.artifacts``):
    read when a process's own disk cache lacks one, written by the process that compiled it
    (the deploy). Both may fail (the store is down): the cache logs it and compiles instead.
    ``fetch`` must return only bytes this deployment wrote (they are loaded as native code)."""

    def fetch(self, name: str) -> bytes | None: ...

    def publish(self, name: str, data: bytes) -> None: ...


def description_path(artifact: Path) -> Path:
    """Beside a cached artifact: what a component backend's ``describe`` found, so a disk
    hit needs no instance."""
    return artifact.with_suffix(".guest.json")


def _companions(path: Path) -> tuple[Path, ...]:
    """An artifact and what a backend keeps beside it (a component's description)."""
    return (path, description_path(path))


class ModuleCache:
    """LRU of compiled modules, backed by a disk cache of serialized artifacts keyed by
    sha256(wasm) + wasmtime version + engine configuration.

    The cache directory must be trusted: wasmtime deserializes its files as native code.
    """

    def __init__(
        self,
        backend_for: Callable[[str], ModuleBackend],
        config: EngineConfig,
        size: int,
        directory: Path | None,
    ) -> None:
        self._backend_for = backend_for
        self._config = config
        self._size = max(1, size)
        self._dir = directory
        self._entries: OrderedDict[str, LoadedModule] = OrderedDict()
        self._touched: dict[str, float] = {}  # sha -> monotonic time its artifact was touched
        self._lock = threading.Lock()
        # sha -> the lock of the thread loading it (get_or_fetch), while it loads.
        self._loading: dict[str, threading.Lock] = {}
        self.hits = 0
        self.disk_hits = 0
        self.misses = 0
        self.shared: SharedArtifacts | None = None
        self.shared_hits = 0

    def _path(self, sha: str) -> Path | None:
        if self._dir is None:
            return None
        fingerprint = self._config.fingerprint()
        return self._dir / f"{sha}-wasmtime{WASMTIME_VERSION}-{fingerprint}.cwasm"

    @staticmethod
    def touch(path: Path) -> None:
        """Mark a disk-cache artifact as just used (the pruning removes the oldest)."""
        with contextlib.suppress(OSError):
            os.utime(path)

    # Disk-cache bookkeeping: a module used from memory marks its artifact as used at most
    # this often; the pruning spares artifacts used more recently than the grace period (a
    # process may be about to read them).
    TOUCH_EVERY_S = 3600.0
    PRUNE_GRACE_S = 600.0

    def _touch_from_memory(self, sha: str) -> None:
        """Called under the lock on a memory hit: keep its artifact recent on disk, so a
        module every worker holds in memory is not the first another process prunes."""
        if self._dir is None:
            return
        now = time.monotonic()
        if now - self._touched.get(sha, -self.TOUCH_EVERY_S) < self.TOUCH_EVERY_S:
            return
        self._touched[sha] = now
        path = self._path(sha)
        if path is not None:
            self.touch(path)

    def prune_disk(self, keep: str = "") -> list[str]:
        """Remove the least recently used artifacts of the disk cache (each ``.cwasm`` with
        the description beside it) until it holds at most ``module_cache_max_bytes``.
        Only names this cache writes are considered (``<sha256>-wasmtime…`` and its own
        ``tmp….tmp`` files, those older than a day); artifacts used within the grace period
        and those whose name starts with ``keep`` (the one just written) stay. An error
        (a read-only directory) is logged: pruning never fails a load. Returns the artifact
        names removed."""
        try:
            return self._prune_disk(keep)
        except OSError as exc:
            log.warning("module cache: cannot prune %s: %s", self._dir, exc)
            return []

    def _prune_disk(self, keep: str) -> list[str]:
        limit = self._config.module_cache_max_bytes
        if self._dir is None or limit <= 0 or not self._dir.is_dir():
            return []
        groups: dict[str, list[tuple[Path, os.stat_result]]] = {}
        now = time.time()
        for path in self._dir.iterdir():
            name = path.name
            try:
                if name.startswith("tmp") and name.endswith(".tmp"):
                    if now - path.stat().st_mtime > 86400:
                        path.unlink(missing_ok=True)
                    continue
                if not _ARTIFACT_NAME.match(name):
                    continue
                st = path.stat()
            except FileNotFoundError:
                continue
            stem = name[: -len(".guest.json")] if name.endswith(".guest.json") else path.stem
            groups.setdefault(stem, []).append((path, st))
        total = sum(st.st_size for files in groups.values() for _, st in files)
        removed: list[str] = []
        if total <= limit:
            return removed
        by_age = sorted(groups.items(), key=lambda item: max(st.st_mtime for _, st in item[1]))
        for stem, files in by_age:
            if total <= limit:
                break
            used = max(st.st_mtime for _, st in files)
            if (keep and stem.startswith(keep)) or now - used < self.PRUNE_GRACE_S:
                continue
            for path, st in files:
                path.unlink(missing_ok=True)
                total -= st.st_size
            removed.append(stem)
        if removed:
            log.info("module cache: removed %d least recently used artifact(s)", len(removed))
        if total > limit:
            log.info("module cache: %d bytes in use, over the %d-byte budget", total, limit)
        return removed

    def peek(self, sha: str) -> LoadedModule | None:
        """The compiled module for ``sha`` if it is in memory (no bytes needed)."""
        with self._lock:
            found = self._entries.get(sha)
            if found is not None:
                self._entries.move_to_end(sha)
                self.hits += 1
                self._touch_from_memory(sha)
            return found

    def get(self, wasm: bytes, sha: str | None = None) -> LoadedModule:
        sha = sha or hashlib.sha256(wasm).hexdigest()
        found = self.peek(sha)
        if found is not None:
            return found
        loaded = self._load(wasm, sha)
        with self._lock:
            self._entries[sha] = loaded
            self._entries.move_to_end(sha)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return loaded

    def get_or_fetch(self, sha: str, fetch: Callable[[], bytes]) -> LoadedModule:
        """The compiled module for ``sha``: from memory, else loaded by one thread however
        many ask for it at once. Only that thread calls ``fetch`` for the module's bytes (a
        Python workflow's are about 20 MB, read from the database) and reads the artifact or
        compiles it; the others wait for it and then find the module in memory. Without it,
        each of a worker's threads whose first segment ran a version not yet in memory
        fetched the bytes, and where no artifact was cached compiled the same module: eight
        threads, eight compiles of seconds each on the same cores."""
        found = self.peek(sha)
        if found is not None:
            return found
        with self._lock:
            loading = self._loading.setdefault(sha, threading.Lock())
        with loading:
            try:
                found = self.peek(sha)
                if found is not None:
                    return found
                return self.get(fetch(), sha)
            finally:
                with self._lock:
                    if self._loading.get(sha) is loading:
                        del self._loading[sha]

    def _load(self, wasm: bytes, sha: str) -> LoadedModule:
        """Loaded by the backend of the module's kind (core module or component): from the
        disk cache, else from the shared artifacts (copied to the disk cache first), else
        compiled, and then the new artifact is shared."""
        path = self._path(sha)
        shared = self.shared
        if shared is not None and path is not None and not path.exists():
            self._fetch_shared(shared, path)
        misses = self.misses
        loaded = self._backend_for(detect_kind(wasm)).load(wasm, sha, self, path)
        if shared is not None and path is not None and self.misses > misses:
            self._publish_shared(shared, path)
        return loaded

    def share(self, sha: str) -> bool:
        """Publish the disk artifact of ``sha`` (loaded before) to the shared artifacts, if
        there are any: the deploy calls it, so its compile serves every worker even when this
        process had the module cached already. True when there was an artifact to share."""
        path = self._path(sha)
        if self.shared is None or path is None or not path.exists():
            return False
        self._publish_shared(self.shared, path)
        return True

    def _fetch_shared(self, shared: SharedArtifacts, path: Path) -> None:
        try:
            found = {p: shared.fetch(p.name) for p in _companions(path)}
        except Exception as exc:  # the store is down: compile, as without it
            log.warning("module cache: cannot read shared artifact %s: %s", path.name, exc)
            return
        artifact = found[path]
        if artifact is None:
            return
        # The description first: a reader that sees the artifact then finds it beside it.
        for companion, data in found.items():
            if companion != path and data is not None:
                self.store_artifact(companion, data)
        self.store_artifact(path, artifact)
        self.shared_hits += 1
        log.info(
            "module cache: %s (%d bytes) read from the shared artifacts", path.name, len(artifact)
        )

    def _publish_shared(self, shared: SharedArtifacts, path: Path) -> None:
        for companion in _companions(path):
            try:
                data = companion.read_bytes()
            except OSError:
                continue  # not written (a read-only disk cache) or none of its kind
            try:
                shared.publish(companion.name, data)
            except Exception as exc:  # sharing is an optimisation: never fail a load
                log.warning("module cache: cannot share artifact %s: %s", companion.name, exc)

    @staticmethod
    def store_artifact(path: Path, data: bytes) -> None:
        """Write a serialized artifact atomically (temporary file, then rename)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except OSError as exc:  # a read-only cache is a slower cache, not an error
            log.warning("cannot write module cache %s: %s", path, exc)

    def clear_memory(self) -> None:
        with self._lock:
            self._entries.clear()
