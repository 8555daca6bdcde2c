"""Python workflows benchmark: loading the cached component, the cost of a durable step, and
a 10-step workload in Python against the same workload as a core module (WAT).

Run it from the repository root::

    .venv/bin/python -m bench.python_bench            # about a minute once the build is cached
    .venv/bin/python -m bench.python_bench --rounds 20 --workload-runs 200

The Python workload is the module below; the core module is ``engine_bench.STEPS_WAT``. Both
read N from their input and make N durable calls ``bench.echo("{}")``; storage is
:class:`engine.inmemory.InMemoryStorage` and each run is one segment (claim, run, finalize),
as in ``engine_bench``. The component is built through the build cache (componentize-py runs
only when the module, the SDK, the WIT world or componentize-py changed) and compiled once per
hash: the compiled artifact lives in a disk cache, which the new-process figure reads.
``bench/README.md`` ("Python workflows") explains each figure and lists results.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import wasmtime

from bench.engine_bench import (
    STEPS_WAT,
    Bench,
    StubSession,
    Timing,
    median_timing,
    per_step,
    percentile,
    timed,
)
from engine import component as component_module
from engine.component import ComponentBackend, ComponentInstance, LoadedComponent
from engine.config import EngineConfig
from engine.module_cache import WASMTIME_VERSION
from engine.runtime import WasmRuntime
from engine.session import Reply

ROOT = Path(__file__).resolve().parent.parent
SDK_PYTHON = ROOT / "sdk" / "python"
if str(SDK_PYTHON) not in sys.path:
    sys.path.insert(0, str(SDK_PYTHON))

from cleat_workflow.build import build_component  # noqa: E402
from cleat_workflow.testing import compiled_cache_dir  # noqa: E402

STEPS_PY = '''\
"""N durable calls to bench.echo, N from the input (the Python twin of STEPS_WAT)."""

from cleat_workflow import Context, workflow


@workflow
def steps(ctx: Context, n: int) -> bool:
    for _ in range(n):
        ctx.call("bench", "echo", {})
    return True
'''

GOAL_INSTANTIATE_MS = 10.0
GOAL_NEW_PROCESS_LOAD_MS = 300.0
GOAL_SEGMENT_START_MS = 1.0  # issue 16

# Run in a new process: load the component from the disk cache, then run one segment.
NEW_PROCESS_SCRIPT = """
import json, sys, time
sys.path[:0] = [{root!r}, {sdk!r}]
started = time.perf_counter()
from pathlib import Path
from bench.engine_bench import Bench
from engine.config import EngineConfig
from engine.runtime import WasmRuntime
imported = time.perf_counter()
wasm = Path({wasm!r}).read_bytes()
runtime = WasmRuntime(EngineConfig(module_cache_dir=Path({cache!r})))
t0 = time.perf_counter()
loaded = runtime.load(wasm)
t1 = time.perf_counter()
assert runtime.modules.disk_hits == 1, "not a disk-cache hit"
bench = Bench(runtime, wasm)
t2 = time.perf_counter()
bench.run_fresh(10)
t3 = time.perf_counter()
print(json.dumps({{"import_s": imported - started, "load_s": t1 - t0,
                  "first_segment_s": t3 - t2}}))
"""


def build_steps_component() -> tuple[bytes, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="cleat-bench-") as tmp:
        app = Path(tmp) / "steps_bench.py"
        app.write_text(STEPS_PY)
        result = build_component(app)
        return result.path.read_bytes(), {
            "cached": result.cached,
            "seconds": result.seconds,
            "key": result.key[:12],
        }


def new_process_loads(wasm: bytes, cache: Path, count: int) -> list[dict[str, float]]:
    """Load the component from the disk cache in ``count`` fresh interpreters."""
    with tempfile.NamedTemporaryFile(suffix=".wasm", delete=False) as fh:
        fh.write(wasm)
        path = fh.name
    try:
        script = NEW_PROCESS_SCRIPT.format(
            root=str(ROOT), sdk=str(SDK_PYTHON), wasm=path, cache=str(cache)
        )
        out = []
        for _ in range(count):
            proc = subprocess.run(
                [sys.executable, "-c", script], capture_output=True, text=True, check=False
            )
            if proc.returncode != 0:
                raise SystemExit(f"the new-process load failed:\n{proc.stderr[-2000:]}")
            out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        return out
    finally:
        os.unlink(path)


def instantiations(runtime: WasmRuntime, loaded: LoadedComponent, count: int) -> list[Timing]:
    """What a segment pays before the guest runs: a module-cache hit, a new store with its
    limits, deadline and WASI context, linking and instantiating the component, and the
    export lookups of ComponentInstance."""
    backend: ComponentBackend = runtime.components
    sha = loaded.info.sha256

    def once() -> ComponentInstance:
        found = runtime.modules.peek(sha)
        assert isinstance(found, LoadedComponent)
        store = backend._new_store()
        raw = backend.instantiate(found, store)
        return ComponentInstance(store, raw, found.guest, runtime.config, 0.0, lambda: 0.0)

    for _ in range(10):
        once()
    timings = []
    for _ in range(count):
        gc.collect()
        timings.append(timed(once)[0])
    return timings


class StubComponentSession(StubSession):
    """:class:`StubSession` plus what the deterministic WASI asks the session for."""

    replaying = False

    def now(self) -> int:
        return 0

    def random_bytes(self, length: int) -> bytes:
        return bytes(length)


def component_boundary(
    runtime: WasmRuntime, loaded: LoadedComponent, steps: int, rounds: int
) -> Timing:
    """Mean µs per ``ctx.call`` against a stub session that answers ``OK "{}"`` at once:
    the guest's own work (the SDK, CPython, componentize-py's bindings) plus the host
    callback, without the session's recording (N calls minus 0 calls, like engine_bench)."""
    backend = runtime.components

    def segment(n: int) -> Timing:
        store = backend._new_store()
        raw = backend.instantiate(loaded, store)
        instance = ComponentInstance(
            store, raw, loaded.guest, runtime.config, time.monotonic(), lambda: 0.0
        )
        previous = getattr(component_module._current, "frame", None)
        component_module._current.frame = (StubComponentSession(), instance)
        try:
            timing, reply = timed(lambda: instance.run("steps", str(n)))
        finally:
            component_module._current.frame = previous
        assert reply == Reply(0, "true"), reply
        return timing

    segment(50)
    return per_step(segment, steps, rounds)


def workload(bench: Bench, runs: int, steps: int = 10) -> tuple[Timing, list[float]]:
    """``runs`` runs of ``steps`` durable calls, each a fresh run in one segment; returns the
    total and each run's wall ms."""
    bench.run_fresh(steps)
    per_run: list[float] = []
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(runs):
        started = time.perf_counter()
        bench.run_fresh(steps)
        per_run.append((time.perf_counter() - started) * 1000)
    return Timing(time.perf_counter() - wall, time.thread_time() - cpu), per_run


def segment_starts(bench: Bench, runs: int, gap_s: float) -> list[float]:
    """ms from the start of a 1-step run's segment to its call reaching the service: what
    a segment pays before its first step (instantiate or take a ready instance, the first
    call into the guest, the SDK's call down to the host). ``gap_s`` between runs stands for
    the worker's database round trips, during which a ready instance is made."""
    bench.run_fresh(1)
    starts: list[float] = []
    for _ in range(runs):
        time.sleep(gap_s)
        bench.echo.stamps.clear()
        started = time.perf_counter_ns()
        bench.run_fresh(1)
        starts.append((bench.echo.stamps[0] - started) / 1e6)
    return starts


def goal(value: float, limit: float) -> str:
    return f"goal ≤ {limit:.0f}: {'met' if value <= limit else 'MISSED'}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="calls per overhead run")
    parser.add_argument("--rounds", type=int, default=7, help="runs of each overhead workload")
    parser.add_argument("--workload-runs", type=int, default=100, help="10-step runs timed")
    parser.add_argument("--instantiations", type=int, default=200)
    parser.add_argument("--processes", type=int, default=3, help="new-process loads")
    parser.add_argument("--starts", type=int, default=200, help="segment starts timed")
    parser.add_argument(
        "--gap-ms", type=float, default=5.0, help="pause between the timed segment starts"
    )
    parser.add_argument(
        "--warm-pages",
        action=argparse.BooleanOptionalAction,
        default=EngineConfig().warm_pages,
        help="the ready instances get their first call's pages made private ahead "
        "(CLEAT_WARM_PAGES, on by default; compare two runs: in one process it warms every "
        "runtime's)",
    )
    args = parser.parse_args(argv)

    print(
        f"python {platform.python_version()}, wasmtime {WASMTIME_VERSION}, "
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    from bench.store_bench import cpu_reference_line

    print(cpu_reference_line())
    wasm, built = build_steps_component()
    how = "from the build cache" if built["cached"] else f"built in {built['seconds']:.0f} s"
    print(f"component: {len(wasm) / 1e6:.1f} MB, {how} (key {built['key']})")

    cache = compiled_cache_dir()
    # Every segment instantiates its own component here, as before ready instances; the
    # ready-instance figures use a runtime of their own (CLEAT_READY_INSTANCES' default).
    runtime = WasmRuntime(EngineConfig(module_cache_dir=cache, ready_instances=0))
    ready_runtime = WasmRuntime(EngineConfig(module_cache_dir=cache, warm_pages=args.warm_pages))
    timing, loaded = timed(lambda: runtime.load(wasm))
    assert isinstance(loaded, LoadedComponent)
    source = "disk cache" if runtime.modules.disk_hits else "compiled (cache miss)"
    print(f"first load in this process: {timing.wall * 1000:.0f} ms ({source})")

    rows: list[tuple[str, str, str]] = []
    loads = new_process_loads(wasm, cache, args.processes)
    load_ms = statistics.median(x["load_s"] for x in loads) * 1000
    first_ms = statistics.median(x["first_segment_s"] for x in loads) * 1000
    rows.append(
        (
            "new process: load from the disk cache, median ms",
            f"{load_ms:.0f}",
            goal(load_ms, GOAL_NEW_PROCESS_LOAD_MS),
        )
    )
    rows.append(("new process: then the first 10-step segment, ms", f"{first_ms:.0f}", ""))

    inst = instantiations(runtime, loaded, args.instantiations)
    walls = [t.wall * 1000 for t in inst]
    cpus = [t.cpu * 1000 for t in inst]
    p50, p99 = percentile(walls, 50), percentile(walls, 99)
    rows.append(
        (
            "instantiate after the first load, p50 / p90 / p99 ms",
            f"{p50:.2f} / {percentile(walls, 90):.2f} / {p99:.2f}"
            f" (cpu p50 {percentile(cpus, 50):.2f})",
            goal(p50, GOAL_INSTANTIATE_MS),
        )
    )

    core = Bench(runtime, wasmtime.wat2wasm(STEPS_WAT))
    python = Bench(runtime, wasm)
    for label, bench in (("core module (WAT)", core), ("Python component", python)):
        mean = bench.step_mean(args.steps, args.rounds)
        stamps = bench.steps(min(args.steps, 500), 3)
        rows.append(
            (
                f"{label}: durable step, mean µs (wall / cpu)",
                f"{mean.wall:.1f} / {mean.cpu:.1f}"
                f" (p50 between calls {percentile(stamps, 50):.1f})",
                "",
            )
        )
    boundary = component_boundary(runtime, loaded, args.steps, args.rounds)
    core_boundary = core.boundary(args.steps, args.rounds)
    rows.append(
        (
            "of which guest + boundary (stub session), µs: core / Python (cpu)",
            f"{core_boundary.cpu:.1f} / {boundary.cpu:.1f}",
            "",
        )
    )
    ready = Bench(ready_runtime, wasm)
    for label, bench in (
        ("core module (WAT)", core),
        ("Python component", python),
        ("Python component, ready instances", ready),
    ):
        total, per_run = workload(bench, args.workload_runs)
        rows.append(
            (
                f"{label}: 10-step runs, steps/s (wall / cpu)",
                f"{10 * args.workload_runs / total.wall:,.0f} / "
                f"{10 * args.workload_runs / total.cpu:,.0f} "
                f"(run p50 {percentile(per_run, 50):.1f} ms)",
                "",
            )
        )
    for label, bench in (
        ("Python component: a 0-step segment (instantiate, run, finalize)", python),
        ("Python component, ready instances: a 0-step segment", ready),
    ):
        empty = median_timing([timed(lambda b=bench: b.run_fresh(0))[0] for _ in range(20)])
        rows.append((f"{label}, ms", f"{empty.wall * 1000:.2f} / {empty.cpu * 1000:.2f}", ""))
    ahead = "ready instance, warm pages" if args.warm_pages else "ready instance"
    for label, bench in (("inline", python), (ahead, ready)):
        starts = segment_starts(bench, args.starts, args.gap_ms / 1000)
        p50 = percentile(starts, 50)
        rows.append(
            (
                f"Python component: a segment's start to its first call ({label}), "
                f"p50 / p90 ms, {args.gap_ms:g} ms apart",
                f"{p50:.2f} / {percentile(starts, 90):.2f}",
                goal(p50, GOAL_SEGMENT_START_MS),
            )
        )
    stats = ready_runtime.components.ready
    if stats is not None:
        rows.append(
            (
                "ready instances: taken / made inline / made ahead",
                f"{stats.stats.hits} / {stats.stats.misses} / {stats.stats.made}",
                "",
            )
        )
    width = max(len(r[0]) for r in rows)
    for name, value, target in rows:
        print(f"{name:<{width}}  {value}  {target}")
    runtime.close()
    ready_runtime.close()


if __name__ == "__main__":
    main()
