"""The wasmtime runtime: the compiled-module cache (memory LRU and disk artifacts), entry
points, and the segment deadline's treatment of time spent in services."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wasmtime

from engine.config import EngineConfig
from engine.errors import InvalidModule
from engine.inmemory import InMemoryStorage
from engine.module_cache import WASMTIME_VERSION
from engine.outcomes import Completed, Failed
from engine.runtime import WasmRuntime
from engine.services import Services
from engine.session import RunInfo
from engine.storage import RunRef
from engine.testing import VirtualClock, WorkflowEnvironment
from tests.fixtures.wat import Wat

RESULT = '{"n":NUM}'


def numbered_module(n: int) -> bytes:
    """A valid workflow returning ``{"n": n}``; distinct ``n`` give distinct modules."""
    result = RESULT.replace("NUM", str(n))
    escaped = result.replace('"', '\\"')
    return wasmtime.wat2wasm(f"""(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (data (i32.const 16) "\\00{escaped}")
  (func (export "cleat_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "run") (param i32 i32) (result i64)
    (i64.const {(16 << 32) | (1 + len(result))})))""")


def completes_with(runtime: WasmRuntime, wasm: bytes, n: int) -> bool:
    """Run ``wasm`` on ``runtime``; True when it returned ``{"n": n}``."""
    env = WorkflowEnvironment(runtime=runtime)
    env.deploy("numbered", wasm)
    return bool(env.result(env.run("numbered")) == {"n": n})


@pytest.fixture
def make_runtime() -> Iterator[Any]:
    """Factory of runtimes that are all closed after the test."""
    made: list[WasmRuntime] = []

    def make(**config: Any) -> WasmRuntime:
        rt = WasmRuntime(EngineConfig(**config))
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.close()


# --- memory LRU ----------------------------------------------------------------------------


def test_second_load_is_a_memory_hit(make_runtime: Any) -> None:
    """Loading the same bytes again returns the cached module without compiling."""
    rt = make_runtime()
    wasm = numbered_module(1)
    first = rt.load(wasm)
    assert (rt.modules.hits, rt.modules.misses) == (0, 1)
    second = rt.load(wasm)
    assert second is first
    assert (rt.modules.hits, rt.modules.misses) == (1, 1)
    assert first.info.sha256 == hashlib.sha256(wasm).hexdigest()


def test_least_recently_used_module_is_evicted_at_size(make_runtime: Any) -> None:
    """With room for two modules, loading a third evicts the one used least recently."""
    rt = make_runtime(module_cache_size=2)
    a, b, c = numbered_module(1), numbered_module(2), numbered_module(3)
    rt.load(a)
    rt.load(b)
    rt.load(a)  # a is now the most recently used; b the least
    rt.load(c)  # evicts b
    assert (rt.modules.hits, rt.modules.misses) == (1, 3)
    rt.load(a)
    assert (rt.modules.hits, rt.modules.misses) == (2, 3), "a should have stayed cached"
    rt.load(b)
    assert (rt.modules.hits, rt.modules.misses) == (2, 4), "b should have been evicted"
    assert completes_with(rt, b, 2)


def test_threads_asking_for_a_new_module_at_once_fetch_and_compile_it_once(
    make_runtime: Any, tmp_path: Path
) -> None:
    """A version's first segments on a worker's eight threads: one thread fetches the bytes
    and compiles them; the others wait for it and get the same module from memory."""
    rt = make_runtime(module_cache_dir=tmp_path)
    wasm = numbered_module(7)
    sha = hashlib.sha256(wasm).hexdigest()
    fetches: list[int] = []
    start = threading.Barrier(8)
    got: list[Any] = []

    def fetch() -> bytes:
        fetches.append(1)
        time.sleep(0.05)  # the database read: the other threads ask meanwhile
        return wasm

    def segment() -> None:
        start.wait()
        got.append(rt.load_once(sha, fetch))

    threads = [threading.Thread(target=segment) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fetches) == 1
    assert (rt.modules.misses, rt.modules.disk_hits) == (1, 0)
    assert len(got) == 8 and all(module is got[0] for module in got)
    assert completes_with(rt, wasm, 7)


def test_a_module_in_memory_is_not_fetched_and_a_failed_load_is_tried_again(
    make_runtime: Any,
) -> None:
    """No read of the bytes for a module in memory; a load that failed (bytes that are not a
    module) leaves the next segment to try again, and then to succeed."""
    rt = make_runtime()
    wasm = numbered_module(8)
    sha = hashlib.sha256(wasm).hexdigest()
    with pytest.raises(InvalidModule):
        rt.load_once(sha, lambda: b"not wasm")
    assert rt.load_once(sha, lambda: wasm) is rt.load_once(sha, lambda: pytest.fail("fetched"))
    assert rt.modules.misses == 1


# --- backends by module kind ---------------------------------------------------------------


def test_each_module_kind_has_its_backend_and_an_unknown_kind_is_refused(
    make_runtime: Any,
) -> None:
    """Core modules run on the core backend, components on the component backend (made once,
    on first use); a kind no backend serves is an InvalidModule naming it."""
    rt = make_runtime()
    assert rt.backend("core") is rt.core
    assert rt.backend("component") is rt.backend("component") is rt.components
    with pytest.raises(InvalidModule, match="'wasm3'"):
        rt.backend("wasm3")


def test_a_loaded_module_whose_kind_no_backend_serves_fails_to_run(make_runtime: Any) -> None:
    """The runtime runs a module on the backend its recorded kind names, not on a default."""
    rt = make_runtime()
    loaded = rt.load(numbered_module(7))
    stray = dataclasses.replace(loaded, info=dataclasses.replace(loaded.info, kind="wasm3"))
    run = RunInfo(RunRef("t", "wf", "run", "worker", 1), "numbered", 1, "{}", 0)
    with pytest.raises(InvalidModule, match="'wasm3'"):
        rt.run_segment(stray, run, (), InMemoryStorage(lambda: 0), Services.from_settings())


# --- disk cache ----------------------------------------------------------------------------


def artifacts(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.cwasm"))


def test_disk_cache_is_shared_between_runtimes(make_runtime: Any, tmp_path: Path) -> None:
    """A second runtime with the same cache directory deserializes instead of compiling."""
    wasm = numbered_module(7)
    first = make_runtime(module_cache_dir=tmp_path)
    first.load(wasm)
    assert (first.modules.disk_hits, first.modules.misses) == (0, 1)
    [artifact] = artifacts(tmp_path)
    assert artifact.name.startswith(hashlib.sha256(wasm).hexdigest())
    assert WASMTIME_VERSION in artifact.name

    second = make_runtime(module_cache_dir=tmp_path)
    second.load(wasm)
    assert (second.modules.disk_hits, second.modules.misses) == (1, 0)
    assert completes_with(second, wasm, 7)


class MemoryArtifacts:
    """A shared artifact store in a dict (the database's is workflows.artifacts)."""

    def __init__(self, failing: bool = False) -> None:
        self.items: dict[str, bytes] = {}
        self.failing = failing

    def fetch(self, name: str) -> bytes | None:
        if self.failing:
            raise OSError("the store is down")
        return self.items.get(name)

    def publish(self, name: str, data: bytes) -> None:
        if self.failing:
            raise OSError("the store is down")
        self.items[name] = data


def test_a_compiled_artifact_is_shared_with_runtimes_on_other_disks(
    make_runtime: Any, tmp_path: Path
) -> None:
    """The runtime that compiles a module publishes its artifact; a runtime whose own disk
    cache lacks it copies it from there instead of compiling."""
    wasm = numbered_module(17)
    shared = MemoryArtifacts()
    first = make_runtime(module_cache_dir=tmp_path / "a")
    first.modules.shared = shared
    first.load(wasm)
    [artifact] = artifacts(tmp_path / "a")
    assert shared.items == {artifact.name: artifact.read_bytes()}

    second = make_runtime(module_cache_dir=tmp_path / "b")
    second.modules.shared = shared
    second.load(wasm)
    assert (second.modules.shared_hits, second.modules.disk_hits, second.modules.misses) == (
        1,
        1,
        0,
    )
    assert [p.name for p in artifacts(tmp_path / "b")] == [artifact.name]
    assert completes_with(second, wasm, 17)


def test_a_shared_store_that_fails_costs_a_compile_not_a_load(
    make_runtime: Any, tmp_path: Path
) -> None:
    wasm = numbered_module(18)
    down = make_runtime(module_cache_dir=tmp_path)
    down.modules.shared = MemoryArtifacts(failing=True)
    down.load(wasm)
    assert (down.modules.shared_hits, down.modules.misses) == (0, 1)
    assert completes_with(down, wasm, 18)


def test_disk_cache_key_includes_the_engine_configuration(
    make_runtime: Any, tmp_path: Path
) -> None:
    """Code compiled without fuel metering is not reused by a runtime that meters fuel."""
    wasm = numbered_module(8)
    make_runtime(module_cache_dir=tmp_path).load(wasm)
    fueled = make_runtime(module_cache_dir=tmp_path, fuel=1_000_000)
    fueled.load(wasm)
    assert (fueled.modules.disk_hits, fueled.modules.misses) == (0, 1)
    assert len(artifacts(tmp_path)) == 2
    assert completes_with(fueled, wasm, 8)


def test_corrupted_artifact_is_discarded_and_recompiled(make_runtime: Any, tmp_path: Path) -> None:
    """An unreadable cache file costs a compile, not a failure, and is replaced."""
    wasm = numbered_module(9)
    make_runtime(module_cache_dir=tmp_path).load(wasm)
    [artifact] = artifacts(tmp_path)
    artifact.write_bytes(b"this is not a serialized module")

    recovering = make_runtime(module_cache_dir=tmp_path)
    recovering.load(wasm)
    assert (recovering.modules.disk_hits, recovering.modules.misses) == (0, 1)
    assert completes_with(recovering, wasm, 9)
    assert artifact.read_bytes() != b"this is not a serialized module"

    # the rewritten artifact is good again
    third = make_runtime(module_cache_dir=tmp_path)
    third.load(wasm)
    assert (third.modules.disk_hits, third.modules.misses) == (1, 0)


def test_unwritable_cache_directory_is_not_an_error(make_runtime: Any, tmp_path: Path) -> None:
    """A cache directory that cannot be created only costs the disk cache."""
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    rt = make_runtime(module_cache_dir=blocker / "cache")
    wasm = numbered_module(10)
    rt.load(wasm)
    assert rt.modules.misses == 1
    assert completes_with(rt, wasm, 10)


# --- entry points --------------------------------------------------------------------------


def test_unknown_entry_point_fails_with_invalid_module(make_runtime: Any) -> None:
    """run_segment with an entry point the module does not export fails the run cleanly."""
    rt = make_runtime()
    module = rt.load(numbered_module(11))
    clock = VirtualClock()
    storage = InMemoryStorage(clock.now)
    record = storage.create_run("numbered", 1, "null")
    claimed = storage.claim("w", clock.now())
    assert claimed is not None and claimed.run_id == record.run_id
    info = RunInfo(
        ref=storage.ref(claimed),
        definition="numbered",
        version=1,
        input="null",
        start_ms=clock.now(),
        entry_point="no_such_export",
    )
    result = rt.run_segment(module, info, [], storage, Services.from_settings(), clock.now)
    assert isinstance(result.outcome, Failed)
    assert result.outcome.code == "invalid_module"
    assert "no_such_export" in result.outcome.message
    assert "run" in result.outcome.message  # the entry points it does offer

    # the same segment with the default entry point completes
    ok = rt.run_segment(
        module,
        RunInfo(info.ref, "numbered", 1, "null", clock.now()),
        [],
        storage,
        Services.from_settings(),
        clock.now,
    )
    assert ok.outcome == Completed('{"n":11}')


# --- deadlines and I/O ---------------------------------------------------------------------

SLOW_CALLS_WAT = """(module
  (import "env" "durable_call" (func $call (param i32 i32 i32 i32 i32 i32) (result i64)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (data (i32.const 100) "slow")
  (data (i32.const 110) "wait")
  (data (i32.const 120) "{}")
  (func (export "cleat_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "run") (param i32 i32) (result i64)
    (local $r i64)
    (local $i i32)
    (drop (call $call (i32.const 100) (i32.const 4) (i32.const 110) (i32.const 4)
                      (i32.const 120) (i32.const 2)))
    (local.set $r (call $call (i32.const 100) (i32.const 4) (i32.const 110) (i32.const 4)
                              (i32.const 120) (i32.const 2)))
    ;; some guest work after the calls: loop headers are where the epoch is checked
    (loop $spin
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $spin (i32.lt_u (local.get $i) (i32.const 10000))))
    (local.get $r)))"""


class SlowService:
    """A Python service whose ``wait`` operation sleeps longer than a segment deadline."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0

    def wait(self, request: Any, *, idempotency_key: str, context: Any) -> dict[str, int]:
        self.calls += 1
        time.sleep(self.seconds)
        return {"slept": self.calls}


def test_deadline_does_not_count_time_spent_in_services(make_runtime: Any) -> None:
    """Two 0.4 s service calls under a 0.3 s deadline: the guest itself is quick, so the run
    completes although the segment took far longer than the deadline."""
    rt = make_runtime(segment_timeout_s=0.3, epoch_tick_s=0.01)
    service = SlowService(0.4)
    env = WorkflowEnvironment(services={"slow": service}, runtime=rt)
    env.deploy("slow", wasmtime.wat2wasm(SLOW_CALLS_WAT))
    started = time.monotonic()
    run = env.run("slow")
    elapsed = time.monotonic() - started
    described = env.describe(run)
    assert described["status"] == "done", described["error"]
    assert elapsed > 2 * 0.3, "the service calls should outlast the deadline"
    assert env.result(run) == {"slept": 2}
    assert service.calls == 2


def slow_state_module() -> bytes:
    """Two state changes, then tens of milliseconds of guest work (as the spinning calls')."""
    w = Wat()
    change = f"(drop (call $set_state {w.s('k')} {w.js('v')}))"
    spin = """(loop $spin
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $spin (i32.lt_u (local.get $i) (i32.const 30000000))))"""
    w.run(f"{change}\n{change}\n{spin}\n(call $finish)", locals="$i i32")
    return w.wasm()


def slowed(env: WorkflowEnvironment, name: str, seconds: float) -> list[float]:
    """Make ``env``'s storage method ``name`` sleep ``seconds`` at each call; the list
    collects one entry per call."""
    real = getattr(env.storage, name)
    calls: list[float] = []

    def slow(*args: Any, **kwargs: Any) -> Any:
        calls.append(seconds)
        time.sleep(seconds)
        return real(*args, **kwargs)

    setattr(env.storage, name, slow)
    return calls


def test_deadline_does_not_count_time_spent_waiting_on_storage(make_runtime: Any) -> None:
    """A slow database is not the guest's work either: the commit a call waits for before
    it goes out, and a state change's transaction, each 0.4 s under a 0.3 s deadline, are
    given back as a service's time is, and the runs complete."""
    rt = make_runtime(segment_timeout_s=0.3, epoch_tick_s=0.01)
    env = WorkflowEnvironment(services={"slow": SlowService(0.0)}, runtime=rt)
    # tens of milliseconds of guest work after the calls: enough to meet a deadline that
    # counted the waits, well within one that does not
    spinning = SLOW_CALLS_WAT.replace("(i32.const 10000)", "(i32.const 30000000)")
    env.deploy("calls", wasmtime.wat2wasm(spinning))
    env.deploy("state", slow_state_module())
    appends = slowed(env, "append_events", 0.4)
    changes = slowed(env, "apply", 0.4)
    calls = env.run("calls")
    assert env.describe(calls)["status"] == "done", env.describe(calls)["error"]
    assert env.result(calls) == {"slept": 2}
    assert appends, "the first call's event should be written before the second goes out"
    state = env.run("state")
    assert env.describe(state)["status"] == "done", env.describe(state)["error"]
    assert len(changes) == 2


def test_disk_cache_keeps_the_most_recently_used_within_its_budget(
    make_runtime: Any, tmp_path: Path
) -> None:
    """Past the budget, writing a new artifact removes the least recently used ones (a disk
    hit counts as a use); the one just written and any used within the grace period stay;
    files the cache did not write are never touched."""
    wasms = [numbered_module(n) for n in (21, 22, 23)]
    shas = [hashlib.sha256(w).hexdigest() for w in wasms]
    unlimited = make_runtime(module_cache_dir=tmp_path, module_cache_max_bytes=0)
    for wasm in wasms[:2]:
        unlimited.load(wasm)
    first, second = (next(tmp_path.glob(sha + "*")) for sha in shas[:2])
    stranger = tmp_path / "notes.cwasm"  # not a name the cache writes
    stranger.write_bytes(b"x" * 10)

    def age(path: Path, seconds: float) -> None:
        then = time.time() - seconds
        os.utime(path, (then, then))

    age(first, 3000)
    age(second, 2000)
    # A disk hit on the older one makes it the newer.
    make_runtime(module_cache_dir=tmp_path).load(wasms[0])
    assert first.stat().st_mtime > second.stat().st_mtime
    age(first, 1000)  # still the newer, and out of the grace period
    budget = int(first.stat().st_size * 2.5)  # room for two artifacts, not three
    tight = make_runtime(module_cache_dir=tmp_path, module_cache_max_bytes=budget)
    tight.load(wasms[2])
    assert {p.name[:64] for p in artifacts(tmp_path) if p != stranger} == {shas[0], shas[2]}
    assert stranger.exists()
    # Smaller than one artifact: the one just written stays, and so does one used within
    # the grace period (another process may be about to read it).
    age(first, 1000)
    for path in tmp_path.glob(shas[2] + "*"):
        age(path, 60)
    tiny = make_runtime(module_cache_dir=tmp_path, module_cache_max_bytes=1)
    tiny.load(wasms[1])
    assert {p.name[:64] for p in artifacts(tmp_path) if p != stranger} == {shas[1], shas[2]}
    assert stranger.exists()
    assert completes_with(tiny, wasms[1], 22)


def test_a_module_used_from_memory_stays_recent_on_disk(make_runtime: Any, tmp_path: Path) -> None:
    wasm = numbered_module(24)
    runtime = make_runtime(module_cache_dir=tmp_path)
    runtime.load(wasm)
    [artifact] = artifacts(tmp_path)
    then = time.time() - 5000
    os.utime(artifact, (then, then))
    runtime.modules._touched.clear()  # as if the last touch was over an hour ago
    runtime.load(wasm)  # a memory hit
    assert runtime.modules.hits >= 1
    assert artifact.stat().st_mtime > then + 4000


def test_a_read_only_cache_over_its_budget_still_loads(
    make_runtime: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wasm = numbered_module(25)
    runtime = make_runtime(module_cache_dir=tmp_path, module_cache_max_bytes=1)

    def refuse(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(13, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "unlink", refuse)
    make_runtime(module_cache_dir=tmp_path, module_cache_max_bytes=0).load(numbered_module(26))
    for path in tmp_path.iterdir():
        os.utime(path, (time.time() - 5000,) * 2)
    runtime.load(wasm)  # writes its artifact, then cannot prune the other: logged, not raised
    assert completes_with(runtime, wasm, 25)


def test_a_negative_disk_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="module_cache_max_bytes"):
        EngineConfig(module_cache_max_bytes=-1)


def test_a_components_s64_answer_wraps_to_64_bits_as_a_core_modules_does() -> None:
    """``incr_state`` counts in unbounded integers; both backends hand the guest the value
    wrapped to 64 bits (the core one through its ``c_int64`` result slot)."""
    import ctypes

    from wasmtime import _ffi as wasmtime_ffi

    from engine.component import _write_s64

    for value in (5, -7, 2**63 - 1, 2**63 + 2, -(2**63) - 1, 2**64 + 9):
        slot = wasmtime_ffi.wasmtime_component_val_t()
        _write_s64(ctypes.addressof(slot), value)
        assert slot.kind == wasmtime_ffi.WASMTIME_COMPONENT_S64.value
        assert slot.of.s64 == ctypes.c_int64(value).value
    assert ctypes.c_int64(2**63 + 2).value == -(2**63) + 2


# --- calling an export -----------------------------------------------------------------------

EXPORTS_OF_EVERY_SHAPE = """(module (memory (export "memory") 1)
  (func (export "cleat_alloc") (param i32) (result i32) (i32.const 64))
  (func (export "packed") (param i32 i32) (result i64)
    (i64.add (i64.shl (i64.extend_i32_u (local.get 0)) (i64.const 32))
             (i64.extend_i32_u (local.get 1))))
  (func (export "narrow") (param i32 i32) (result i32) (i32.const -7))
  (func (export "float") (param i32 i32) (result f64) (f64.const 1.5))
  (func (export "no_params") (result i64) (i64.const 5))
  (func (export "wide_param") (param i64 i32) (result i64) (i64.const 5))
  (func (export "traps") (param i32 i32) (result i64) unreachable))"""


def test_an_export_is_called_with_its_arguments_and_a_wrong_shape_is_an_error_not_a_crash() -> None:
    """Handlers and defers are exports the guest names at run time, so their types are not
    checked at load: the call (through the C API) passes (ptr, len), reads an i64 (or an i32,
    as wasmtime-py read it) and refuses anything else with an error the segment reports."""
    from engine.core_backend import CoreInstance
    from engine.errors import GuestFault

    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    instance = wasmtime.Instance(store, wasmtime.Module(engine, EXPORTS_OF_EVERY_SHAPE), [])
    core = CoreInstance(store, instance, EngineConfig(), time.monotonic(), lambda: 0.0)

    def call(name: str) -> int:
        fn = core._func(name)
        assert fn is not None
        return core._call_entry(name, fn, 3, 4)

    assert call("packed") == (3 << 32) | 4
    assert call("narrow") == -7
    with pytest.raises(GuestFault, match="float: returned a value that is not an integer"):
        call("float")
    with pytest.raises(wasmtime.WasmtimeError, match="expected 0 arguments, got 2"):
        call("no_params")
    with pytest.raises(wasmtime.WasmtimeError, match="type mismatch"):
        call("wide_param")
    with pytest.raises(wasmtime.Trap, match="unreachable"):
        call("traps")
