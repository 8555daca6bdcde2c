"""Engine benchmark: host-call overhead, replay speed, module instantiation and loading.

Run it from the repository root::

    .venv/bin/python -m bench.engine_bench                  # defaults, about a minute
    .venv/bin/python -m bench.engine_bench --steps 5000 --rounds 10
    .venv/bin/python -m bench.engine_bench --profile        # cProfile of the step workload

Every workload is deterministic and defined here (the WAT below); nothing touches a database
(storage is :class:`engine.inmemory.InMemoryStorage`). Each figure is taken on two clocks:
wall time, and the CPU time of the benchmark's thread, which other processes on a busy
machine do not inflate. ``bench/README.md`` explains what each figure measures and how.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import itertools
import os
import platform
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import wasmtime

from engine import core_backend
from engine.backend import LoadedModule
from engine.config import EngineConfig
from engine.core_backend import CoreInstance
from engine.events import EncodedEvent
from engine.inmemory import InMemoryStorage
from engine.module_cache import WASMTIME_VERSION, ModuleCache
from engine.outcomes import Completed
from engine.runtime import WasmRuntime
from engine.services import CallContext, CallResult, Services
from engine.session import Reply, RunInfo

T = TypeVar("T")

# A workflow that makes N durable calls in a loop: the input is N as a JSON number, each
# iteration calls bench.echo with "{}", and the result is `true`. The bump allocator grows
# memory on demand, so any N fits.
STEPS_WAT = r"""
(module
  (import "env" "durable_call" (func $call (param i32 i32 i32 i32 i32 i32) (result i64)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (data (i32.const 16) "bench")
  (data (i32.const 32) "echo")
  (data (i32.const 48) "{}")
  (data (i32.const 64) "\00true")
  (func (export "cleat_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local $end i32)
    (local $have i32)
    (local.set $p (global.get $heap))
    (local.set $end (i32.add (local.get $p) (local.get $n)))
    (local.set $have (i32.mul (memory.size) (i32.const 65536)))
    (if (i32.gt_u (local.get $end) (local.get $have))
      (then
        (if (i32.eq
              (memory.grow
                (i32.shr_u (i32.add (i32.sub (local.get $end) (local.get $have))
                                    (i32.const 65535))
                           (i32.const 16)))
              (i32.const -1))
          (then unreachable))))
    (global.set $heap (local.get $end))
    (local.get $p))
  (func (export "run") (param $ptr i32) (param $len i32) (result i64)
    (local $n i32)
    (local $i i32)
    (local $b i32)
    ;; N = the decimal digits of the input, in order
    (block $parsed
      (loop $digits
        (br_if $parsed (i32.eqz (local.get $len)))
        (local.set $b (i32.load8_u (local.get $ptr)))
        (if (i32.and (i32.ge_u (local.get $b) (i32.const 48))
                     (i32.le_u (local.get $b) (i32.const 57)))
          (then
            (local.set $n (i32.add (i32.mul (local.get $n) (i32.const 10))
                                   (i32.sub (local.get $b) (i32.const 48))))))
        (local.set $ptr (i32.add (local.get $ptr) (i32.const 1)))
        (local.set $len (i32.sub (local.get $len) (i32.const 1)))
        (br $digits)))
    (block $done
      (loop $steps
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (drop (call $call (i32.const 16) (i32.const 5)     ;; "bench"
                          (i32.const 32) (i32.const 4)     ;; "echo"
                          (i32.const 48) (i32.const 2)))   ;; "{}"
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $steps)))
    ;; packed buffer (64 << 32) | 5: status 0, payload "true"
    (i64.or (i64.shl (i64.const 64) (i64.const 32)) (i64.const 5)))
)
"""

GOAL_STEP_P50_US = 30.0
GOAL_REPLAY_EVENTS_PER_S = 20_000.0
GOAL_INSTANTIATE_MS = 1.0


@dataclass(frozen=True)
class Timing:
    """One measurement on both clocks, in seconds."""

    wall: float
    cpu: float  # CPU time of this thread


def timed(fn: Callable[[], T]) -> tuple[Timing, T]:
    wall, cpu = time.perf_counter(), time.thread_time()
    result = fn()
    return Timing(time.perf_counter() - wall, time.thread_time() - cpu), result


class EchoService:
    """bench.echo: answers at once and notes when each call arrives. Wall clock only: reading
    the thread's CPU clock is a system call, several times dearer than perf_counter_ns."""

    def __init__(self) -> None:
        self.stamps: list[int] = []

    def echo(self, request: Any, *, idempotency_key: str, context: CallContext) -> Any:
        self.stamps.append(time.perf_counter_ns())
        return {}


class RefusingCaller:
    """A replay must not call a service: any call is a bug in the benchmark or the engine."""

    def call(self, service: str, operation: str, request: str, context: CallContext) -> CallResult:
        raise AssertionError(f"replay called {service}.{operation} at step {context.step}")


class StubSession:
    """Stands in for the execution session: answers durable_call at once and records nothing,
    so a step costs only the wasm/Python boundary (arguments, memory checks, the reply)."""

    exit: BaseException | None = None

    def durable_call(self, service: str, operation: str, request: str) -> Reply:
        return Reply(0, "{}")


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of ``samples`` (q in 0..100)."""
    ordered = sorted(samples)
    rank = max(1, round(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median_timing(timings: Sequence[Timing]) -> Timing:
    return Timing(
        statistics.median(t.wall for t in timings), statistics.median(t.cpu for t in timings)
    )


def per_step(segment: Callable[[int], Timing], steps: int, rounds: int) -> Timing:
    """Mean µs per step on both clocks: (median of N-step segments - median of 0-step
    segments) / N, each segment after a full garbage collection (outside the timing)."""
    empty: list[Timing] = []
    full: list[Timing] = []
    for _ in range(rounds):
        gc.collect()
        empty.append(segment(0))
        gc.collect()
        full.append(segment(steps))
    e, f = median_timing(empty), median_timing(full)
    return Timing((f.wall - e.wall) / steps * 1e6, (f.cpu - e.cpu) / steps * 1e6)


class Bench:
    def __init__(self, runtime: WasmRuntime, wasm: bytes) -> None:
        self.runtime = runtime
        self.wasm = wasm
        self.module: LoadedModule = runtime.load(wasm)
        self.clock_ms = 1_767_225_600_000
        self.storage = InMemoryStorage(lambda: self.clock_ms)
        self.storage.definitions["bench"] = {1: False}
        self.echo = EchoService()
        self.services = Services.from_settings({"bench": self.echo})

    def run_fresh(self, steps: int) -> tuple[list[EncodedEvent], RunInfo]:
        """One segment of a new run making ``steps`` calls, recorded into storage."""
        record = self.storage.create_run("bench", 1, str(steps))
        claimed = self.storage.claim("bench-worker", self.clock_ms)
        assert claimed is record, "the benchmark's storage holds one due run at a time"
        ref = self.storage.ref(record)
        info = RunInfo(ref, "bench", 1, record.input, record.created_ms)
        result = self.runtime.run_segment(
            self.module, info, [], self.storage, self.services, lambda: self.clock_ms
        )
        if not isinstance(result.outcome, Completed):
            raise SystemExit(f"the step workload did not complete: {result.outcome}")
        self.storage.finalize(ref, result)
        # A worker keeps no finished runs in memory; neither does the benchmark (a growing
        # heap would slow every garbage collection and the steps with it).
        del self.storage.runs[record.run_id]
        return list(record.history), info

    # --- host-call overhead -------------------------------------------------------------

    def steps(self, steps: int, rounds: int) -> list[float]:
        """Per-step wall times in µs: from one service call to the next."""
        self.run_fresh(200)  # warm-up: caches, allocator, code paths
        samples: list[float] = []
        for _ in range(rounds):
            self.echo.stamps.clear()
            gc.collect()
            self.run_fresh(steps)
            samples += [(b - a) / 1000 for a, b in itertools.pairwise(self.echo.stamps)]
        return samples

    def step_mean(self, steps: int, rounds: int) -> Timing:
        """Mean µs per step from whole segments: (median of N-step runs - median of 0-step
        runs) / N. Covers everything a step costs, including what happens outside the
        service-to-service window (none, if the two methods agree)."""
        return per_step(lambda n: timed(lambda: self.run_fresh(n))[0], steps, rounds)

    def boundary(self, steps: int, rounds: int) -> Timing:
        """Mean µs per durable_call against :class:`StubSession` (N calls minus 0 calls)."""

        def segment(n: int) -> Timing:
            store = self.runtime.new_store()
            raw = self.module.pre.instantiate(store)
            instance = CoreInstance(store, raw, self.runtime.config, time.monotonic(), lambda: 0.0)
            previous = getattr(core_backend._current, "frame", None)
            core_backend._current.frame = (StubSession(), instance)
            try:
                timing, reply = timed(lambda: instance.call_export("run", str(n)))
            finally:
                core_backend._current.frame = previous
            assert reply == Reply(0, "true"), reply
            return timing

        segment(200)
        return per_step(segment, steps, rounds)

    # --- replay -------------------------------------------------------------------------

    def replay(self, events: int, rounds: int) -> list[Timing]:
        """Time to replay a recorded history of ``events`` events in one segment: the whole
        of run_segment, including decoding and checksumming the history."""
        history, info = self.run_fresh(events)
        assert len(history) == events, f"expected {events} events, recorded {len(history)}"
        services = Services(
            caller=RefusingCaller(),
            fetcher=self.services.fetcher,
            plugins=self.services.plugins,
            resolvers={},
        )
        timings: list[Timing] = []
        for _ in range(rounds + 1):
            gc.collect()
            timing, result = timed(
                lambda: self.runtime.run_segment(
                    self.module, info, history, self.storage, services, lambda: self.clock_ms
                )
            )
            if result.recorded or not isinstance(result.outcome, Completed):
                raise SystemExit(f"the replay was not a pure replay: {result.outcome}")
            if result.replayed_steps != events:
                raise SystemExit(f"replayed {result.replayed_steps} of {events} events")
            timings.append(timing)
        return timings[1:]  # the first round warms up

    # --- instantiation and loading ------------------------------------------------------

    def instantiate(self, iterations: int) -> list[Timing]:
        """A module-cache hit + a new store with its limits + instantiation + the export
        lookups of CoreInstance: what a segment pays before the guest runs."""
        runtime = self.runtime
        sha = self.module.info.sha256

        def once() -> CoreInstance:
            loaded = runtime.load(self.wasm, sha)
            store = runtime.new_store()
            raw = loaded.pre.instantiate(store)
            return CoreInstance(store, raw, runtime.config, 0.0, lambda: 0.0)

        for _ in range(100):
            once()
        return [timed(once)[0] for _ in range(iterations)]

    def cold_compile(self, iterations: int) -> tuple[list[float], list[float]]:
        """Wall ms for wasmtime alone to compile the module, and for a full cache miss
        (compile, serialize to disk, check against the ABI, link). Compilation may use
        several threads, so only wall time means anything here."""
        raw: list[float] = []
        full: list[float] = []
        for _ in range(iterations):
            raw.append(timed(lambda: wasmtime.Module(self.runtime.engine, self.wasm))[0].wall)
            with tempfile.TemporaryDirectory() as tmp:
                fresh = ModuleCache(self.runtime.backend, self.runtime.config, 4, Path(tmp))
                full.append(timed(lambda: fresh.get(self.wasm))[0].wall)  # noqa: B023
                assert fresh.misses == 1
        return [x * 1000 for x in raw], [x * 1000 for x in full]

    def disk_load(self, iterations: int) -> tuple[list[float], list[float]]:
        """Wall ms for wasmtime alone to deserialize the cached artifact, and for a full
        disk-cache hit (deserialize, check against the ABI, link)."""
        raw: list[float] = []
        full: list[float] = []
        engine = self.runtime.engine
        with tempfile.TemporaryDirectory() as tmp:
            cache = ModuleCache(self.runtime.backend, self.runtime.config, 4, Path(tmp))
            cache.get(self.wasm)
            (artifact,) = Path(tmp).glob("*.cwasm")
            for _ in range(iterations):
                raw.append(
                    timed(lambda: wasmtime.Module.deserialize_file(engine, str(artifact)))[0].wall
                )
                cache.clear_memory()
                full.append(timed(lambda: cache.get(self.wasm))[0].wall)
            assert cache.disk_hits == iterations
        return [x * 1000 for x in raw], [x * 1000 for x in full]


# --- report ------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    wall: str
    cpu: str = "-"
    goal: str = ""
    met: str = ""


def verdict(wall_ok: bool, cpu_ok: bool) -> str:
    if wall_ok:
        return "yes"
    # Thread CPU time meeting the goal while wall time does not means the machine was busy.
    return "cpu only" if cpu_ok else "NO"


def pcts(samples: Sequence[float], digits: int) -> str:
    return " / ".join(f"{percentile(samples, q):.{digits}f}" for q in (50, 90, 99))


def print_table(rows: list[Row]) -> None:
    head = Row("measurement", "wall", "thread cpu", "goal", "met")
    table = [head, *rows]
    widths = [max(len(getattr(r, f)) for r in table) for f in ("name", "wall", "cpu", "goal")]
    for i, r in enumerate(table):
        print(
            f"{r.name:<{widths[0]}}  {r.wall:>{widths[1]}}  {r.cpu:>{widths[2]}}  "
            f"{r.goal:<{widths[3]}}  {r.met}".rstrip()
        )
        if i == 0:
            print("-" * (sum(widths) + 12))


def profile_steps(bench: Bench, steps: int, top: int) -> None:
    bench.run_fresh(200)
    profiler = cProfile.Profile()
    profiler.enable()
    bench.run_fresh(steps)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    print(out.getvalue())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="durable calls per run")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each step workload")
    parser.add_argument("--replay-events", type=int, default=10_000, help="history length")
    parser.add_argument("--replay-rounds", type=int, default=5, help="timed replays")
    parser.add_argument("--instantiations", type=int, default=2000, help="timed instantiations")
    parser.add_argument("--compiles", type=int, default=20, help="timed cold compiles and loads")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the steps")
    parser.add_argument("--profile-top", type=int, default=30, help="rows of the profile")
    args = parser.parse_args(argv)

    runtime = WasmRuntime(EngineConfig())
    try:
        bench = Bench(runtime, wasmtime.wat2wasm(STEPS_WAT))
        if args.profile:
            profile_steps(bench, args.steps, args.profile_top)
            return
        print(
            f"cleat engine benchmark: Python {platform.python_version()}, wasmtime "
            f"{WASMTIME_VERSION}, {platform.machine()}, {len(os.sched_getaffinity(0))} CPUs, "
            f"load average {os.getloadavg()[0]:.2f}\n"
        )
        rows: list[Row] = []

        per_step = bench.steps(args.steps, args.rounds)
        mean = bench.step_mean(args.steps, args.rounds)
        rows.append(
            Row(
                f"durable_call step p50/p90/p99, µs ({len(per_step)} steps)",
                pcts(per_step, 1),
                "-",
                f"p50 <= {GOAL_STEP_P50_US:g} µs",
                verdict(percentile(per_step, 50) <= GOAL_STEP_P50_US, mean.cpu <= GOAL_STEP_P50_US),
            )
        )
        rows.append(
            Row("durable_call step mean from segments, µs", f"{mean.wall:.1f}", f"{mean.cpu:.1f}")
        )
        boundary = bench.boundary(args.steps, args.rounds)
        rows.append(
            Row(
                "  of which wasm/Python boundary (stub session)",
                f"{boundary.wall:.1f}",
                f"{boundary.cpu:.1f}",
            )
        )

        replays = bench.replay(args.replay_events, args.replay_rounds)
        rate = median_timing(
            [Timing(args.replay_events / t.wall, args.replay_events / t.cpu) for t in replays]
        )
        rows.append(
            Row(
                f"replay of {args.replay_events:,} events, events/s (median of {len(replays)})",
                f"{rate.wall:,.0f}",
                f"{rate.cpu:,.0f}",
                f">= {GOAL_REPLAY_EVENTS_PER_S:,.0f} events/s",
                verdict(
                    rate.wall >= GOAL_REPLAY_EVENTS_PER_S, rate.cpu >= GOAL_REPLAY_EVENTS_PER_S
                ),
            )
        )

        inst = bench.instantiate(args.instantiations)
        inst_wall = [t.wall * 1000 for t in inst]
        inst_cpu = [t.cpu * 1000 for t in inst]
        rows.append(
            Row(
                f"instantiate from cache p50/p90/p99, ms ({len(inst)})",
                pcts(inst_wall, 3),
                pcts(inst_cpu, 3),
                f"p50, p99 <= {GOAL_INSTANTIATE_MS:g} ms",
                verdict(
                    percentile(inst_wall, 99) <= GOAL_INSTANTIATE_MS,
                    percentile(inst_cpu, 99) <= GOAL_INSTANTIATE_MS,
                ),
            )
        )

        compile_raw, compile_full = bench.cold_compile(args.compiles)
        rows.append(
            Row("cold compile, wasmtime only, p50 ms", f"{percentile(compile_raw, 50):.2f}")
        )
        rows.append(
            Row(
                "cache miss: compile + serialize + check + link, p50 ms",
                f"{percentile(compile_full, 50):.2f}",
            )
        )
        disk_raw, disk_full = bench.disk_load(args.compiles)
        rows.append(
            Row("disk-cache deserialize, wasmtime only, p50 ms", f"{percentile(disk_raw, 50):.2f}")
        )
        rows.append(
            Row(
                "disk-cache hit: deserialize + check + link, p50 ms",
                f"{percentile(disk_full, 50):.2f}",
            )
        )
        print_table(rows)
    finally:
        runtime.close()


if __name__ == "__main__":
    main()
