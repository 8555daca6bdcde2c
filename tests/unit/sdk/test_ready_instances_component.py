"""Python workflows on instances made ahead (engine.ready_instances, CLEAT_READY_INSTANCES).

A run must not be able to tell whether its segment took a ready instance or instantiated
its own: the same run gets the same time, random numbers and UUIDs either way, its guest
output is its own, and its segment has its whole deadline however long the instance waited.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from engine.component import LoadedComponent
from engine.config import MIB, EngineConfig
from engine.runtime import WasmRuntime
from engine.testing import WorkflowEnvironment
from tests.fixtures import FakeService


def runtime_with(ready: int, **config: Any) -> WasmRuntime:
    from cleat_workflow.testing import compiled_cache_dir

    # Another engine each: the component comes from the disk cache, not from a compile.
    return WasmRuntime(
        EngineConfig(module_cache_dir=compiled_cache_dir(), ready_instances=ready, **config)
    )


@pytest.fixture(scope="module")
def ready_runtime() -> Iterator[WasmRuntime]:
    runtime = runtime_with(2)
    yield runtime
    runtime.close()


@pytest.fixture(scope="module")
def inline_runtime() -> Iterator[WasmRuntime]:
    runtime = runtime_with(0)
    yield runtime
    runtime.close()


def environment(runtime: WasmRuntime) -> WorkflowEnvironment:
    from cleat_workflow.testing import PythonWorkflowEnvironment

    return PythonWorkflowEnvironment(
        {"shop": FakeService({"price": {"cents": 1200}})}, runtime=runtime
    )


def wait_until_ready(runtime: WasmRuntime, wasm: bytes, count: int = 1) -> LoadedComponent:
    loaded = runtime.load(wasm)
    assert isinstance(loaded, LoadedComponent)
    ready = runtime.components.ready
    assert ready is not None
    deadline = time.monotonic() + 60
    while ready.ready_count(loaded) < count:
        assert time.monotonic() < deadline, "no instance was made ahead within 60 s"
        time.sleep(0.01)
    return loaded


def run_clock(env: WorkflowEnvironment, run_id: str) -> Any:
    """The scenarios' ``clock`` (time, random, uuid4, urandom before a call, after it and
    after a sleep) as run ``run_id`` of workflow ``wf-clock``: two segments."""
    env.storage.create_run("clock", 1, '{"sleep": 30}', workflow_id="wf-clock", run_id=run_id)
    env.run_until_idle()
    env.advance(seconds=30)
    return env.result(run_id)


def test_a_run_on_ready_instances_draws_what_it_draws_inline(
    scenarios_wasm: bytes, ready_runtime: WasmRuntime, inline_runtime: WasmRuntime
) -> None:
    ready_env, inline_env = environment(ready_runtime), environment(inline_runtime)
    for env in (ready_env, inline_env):
        env.deploy("clock", scenarios_wasm)
    ready_env.run("clock", {"sleep": 0})  # the component's first segment: inline
    wait_until_ready(ready_runtime, scenarios_wasm, 2)
    ready = ready_runtime.components.ready
    assert ready is not None
    hits = ready.stats.hits

    on_ready = run_clock(ready_env, "run-1")
    inline = run_clock(inline_env, "run-1")

    assert ready.stats.hits >= hits + 1  # its first segment surely took a ready instance
    assert inline_runtime.components.ready is None
    assert on_ready == inline
    samples = on_ready["samples"]
    assert len({s["random"] for s in samples}) == 3  # seeded from the run, not from zeros
    assert len({s["uuid4"] for s in samples}) == 3
    # Another run draws other numbers on a ready instance too.
    other = run_clock(ready_env, "run-2")
    assert other["samples"][0]["random"] != samples[0]["random"]
    # And the history recorded on ready instances replays inline, quietly.
    inline_env.storage.runs["run-1"] = ready_env.storage.runs["run-1"]
    inline_env.assert_replays("run-1")


def test_guest_output_of_a_ready_instance_is_the_run_that_took_it(
    scenarios_wasm: bytes, ready_runtime: WasmRuntime
) -> None:
    """The SDK announces time.sleep on stderr with the workflow's line; the host reads it
    from the segment's session, which a ready instance is bound to when taken."""
    env = environment(ready_runtime)
    env.deploy("naps", scenarios_wasm)
    env.deploy("clock", scenarios_wasm)
    env.run("clock", {"sleep": 0})  # a segment of the component, if none ran before
    wait_until_ready(ready_runtime, scenarios_wasm)
    ready = ready_runtime.components.ready
    assert ready is not None
    hits = ready.stats.hits
    run = env.run("naps")
    assert ready.stats.hits == hits + 1
    info = env.describe(run)
    assert info["error_code"] == "guest_fault"
    assert "time.sleep at scenarios.py:" in info["error"] and "in naps" in info["error"]


def test_a_ready_instance_that_waited_past_the_deadline_still_gets_the_whole_segment(
    scenarios_wasm: bytes,
) -> None:
    runtime = runtime_with(1, segment_timeout_s=0.5)
    try:
        env = environment(runtime)
        env.deploy("clock", scenarios_wasm)
        env.deploy("spins", scenarios_wasm)
        env.run("clock", {"sleep": 0})
        wait_until_ready(runtime, scenarios_wasm)
        time.sleep(0.8)  # longer than a segment may run
        hits = runtime.components.ready.stats.hits  # type: ignore[union-attr]
        run = env.run("clock", {"sleep": 0})
        assert runtime.components.ready.stats.hits == hits + 1  # type: ignore[union-attr]
        assert env.describe(run)["status"] == "done"
        # ... and the deadline is still enforced on one.
        wait_until_ready(runtime, scenarios_wasm)
        spinning = env.run("spins")
        info = env.describe(spinning)
        assert info["error_code"] == "timeout"
    finally:
        runtime.close()


def test_a_component_that_cannot_be_instantiated_fails_its_runs_as_inline_and_is_not_made_ahead(
    scenarios_wasm: bytes,
) -> None:
    """CPython's initial memory does not fit in 2 MiB: each run fails with the resource
    limit, as without ready instances, and nothing is made ahead for it."""
    runtime = runtime_with(2, memory_limit_bytes=2 * MIB)
    inline = runtime_with(0, memory_limit_bytes=2 * MIB)
    ready = runtime.components.ready
    assert ready is not None
    try:
        loaded = runtime.load(scenarios_wasm)
        errors = []
        for each in (runtime, inline, runtime, runtime):
            env = environment(each)
            env.deploy("clock", scenarios_wasm)
            info = env.describe(env.run("clock", {"sleep": 0}))
            errors.append((info["status"], info["error_code"], info["error"]))
        assert errors[0][1] == "resource_limit", errors
        assert len(set(errors)) == 1  # the same failure, with or without ready instances
        time.sleep(0.1)
        assert (ready.stats.made, ready.stats.failed, ready.ready_count(loaded)) == (0, 0, 0)
    finally:
        runtime.close()
        inline.close()


def test_closing_the_runtime_stops_making_instances(scenarios_wasm: bytes) -> None:
    runtime = runtime_with(2)
    env = environment(runtime)
    env.deploy("clock", scenarios_wasm)
    env.run("clock", {"sleep": 0})
    loaded = wait_until_ready(runtime, scenarios_wasm)
    ready = runtime.components.ready
    assert ready is not None
    runtime.close()
    assert ready.ready_count(loaded) == 0
    assert ready.take(loaded) is None


@pytest.mark.parametrize("ready", [0, 2])
def test_a_segment_frees_its_store_when_it_ends(
    scenarios_wasm: bytes, ready: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every store a segment used is freed once the segment is over, with or without ready
    instances: the guest output's callbacks, which wasmtime-py keeps until the store is
    freed, no longer hold the session and through it the store (each kept a Python
    segment's memory, about 7 MB, for the life of the process). Its native store (the
    instance's memory) is closed when the segment ends, before any collection: by the
    segment itself, or handed to the thread that makes instances ahead."""
    import gc
    import weakref

    from engine.component import ComponentBackend

    runtime = runtime_with(ready)
    made: list[weakref.ref[Any]] = []
    new_store = ComponentBackend._new_store

    def tracked(self: ComponentBackend, output: Any = None) -> Any:
        store = new_store(self, output)
        made.append(weakref.ref(store))
        return store

    def closed(ref: weakref.ref[Any]) -> bool:
        store = ref()
        if store is None:
            return True
        try:
            store.ptr()
        except ValueError:  # wasmtime-py: "already closed"
            return True
        return False

    monkeypatch.setattr(ComponentBackend, "_new_store", tracked)
    gc.disable()  # the native store is closed at the segment's end, not by a collection
    try:
        env = environment(runtime)
        env.deploy("clock", scenarios_wasm)
        for _ in range(6):
            run = env.run("clock", {"sleep": 0})
            assert env.status(run) == "done", env.describe(run)
        # Closed by the segment, or (with ready instances) by the thread that makes them.
        deadline = time.monotonic() + 10
        while True:
            open_stores = [ref for ref in made if not closed(ref)]
            if len(open_stores) <= ready or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert len(open_stores) <= ready, (len(made), len(open_stores))
        gc.enable()
        gc.collect()
        alive = [ref for ref in made if ref() is not None]
        # At most the instances made ahead and not taken yet are left.
        assert len(made) >= 6 and len(alive) <= ready, (len(made), len(alive))
    finally:
        gc.enable()
        runtime.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page maps are Linux's")
def test_warm_pages_make_the_first_calls_pages_private_before_the_segment(
    scenarios_wasm: bytes,
) -> None:
    """With warm pages on, the pages the first segments wrote and read are learned, instances
    made ahead have them private or mapped already, and a segment on such an instance takes
    far fewer page faults on its own thread than one on an instance made ahead without them."""
    import resource

    def faults_per_segment(warm: bool) -> tuple[float, WasmRuntime]:
        runtime = runtime_with(2, warm_pages=warm)
        env = environment(runtime)
        env.deploy("clock", scenarios_wasm)
        for _ in range(4):  # the first segments: the pages are learned (when on)
            env.run("clock", {"sleep": 0})
        counts = []
        for _ in range(6):
            wait_until_ready(runtime, scenarios_wasm, 2)
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            run = env.run("clock", {"sleep": 0})
            counts.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
            assert env.status(run) == "done"
        return sorted(counts)[len(counts) // 2], runtime

    cold, cold_runtime = faults_per_segment(False)
    warm, warm_runtime = faults_per_segment(True)
    try:
        assert cold_runtime.components.warm is None
        pages = warm_runtime.components.warm
        assert pages is not None and pages.enabled
        # The component's image (other components of the process may be mapped too).
        learned = pages.learned().values()
        assert max(written for written, _ in learned) > 10, learned
        assert max(read for _, read in learned) > 10, learned
        assert pages.warmed >= 6
        # The pages read are mapped ahead too: hardly a fault is left to the segment.
        assert warm < cold * 0.25, (warm, cold)
    finally:
        cold_runtime.close()
        warm_runtime.close()
