"""Guest-language benchmark: for Rust, C, Zig and AssemblyScript, the size of the order-saga
module, its build time, and the engine benchmark's step cost for the same N-step workload
written in that language (``bench/workloads/steps.*``), beside the hand-written WAT of
``bench/engine_bench.py``.

    .venv/bin/python -m bench.guest_bench                 # every language
    .venv/bin/python -m bench.guest_bench --steps 2000 --rounds 5 --only rust,c

Build times are cold: each build runs its toolchain in a fresh, empty module cache (zig keeps
its own compiler-rt cache, as it does on any machine after the first build). The step cost is
``engine_bench.Bench.step_mean``: (median N-step segment - median 0-step segment) / N, each
run recorded into in-memory storage, on wall time and the thread's CPU time; then the part of
it that is the guest's own work and the wasm/Python boundary, ``Bench.boundary`` (the same
loop against a stub session that answers at once and records nothing).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import wasmtime

from bench.engine_bench import STEPS_WAT, Bench
from engine.config import EngineConfig
from engine.module_cache import WASMTIME_VERSION
from engine.runtime import WasmRuntime
from workflows import guest_build

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {"rust": ".rs", "c": ".c", "zig": ".zig", "assemblyscript": ".ts"}


def cold_build(source: Path, tmp: Path) -> guest_build.BuildResult:
    """Build ``source`` with an empty module cache of its own, into ``tmp``."""
    cache = Path(tempfile.mkdtemp(prefix="cache-", dir=tmp))
    return guest_build.build(source, cache / source.with_suffix(".wasm").name, cache=cache)


def step_cost(runtime: WasmRuntime, wasm: bytes, steps: int, rounds: int) -> str:
    """The step's mean cost recorded into storage, then the guest + boundary part alone
    (against engine_bench's stub session), as "wall / cpu µs"."""
    bench = Bench(runtime, wasm)
    bench.run_fresh(200)  # warm-up
    mean = bench.step_mean(steps, rounds)
    boundary = bench.boundary(steps, rounds)
    return f"{mean.wall:.1f} / {mean.cpu:.1f}  {boundary.wall:.1f} / {boundary.cpu:.1f}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="durable calls per run")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each step workload")
    parser.add_argument("--only", default=",".join(SUFFIXES), help="comma-separated languages")
    args = parser.parse_args(argv)
    languages = [name for name in args.only.split(",") if name]
    for name in languages:
        if name not in SUFFIXES:
            raise SystemExit(f"unknown language {name!r} (choose from {', '.join(SUFFIXES)})")

    print(
        f"cleat guest benchmark: Python {platform.python_version()}, wasmtime {WASMTIME_VERSION}, "
        f"{len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.2f}, "
        f"{args.steps} steps x {args.rounds} rounds\n"
    )
    runtime = WasmRuntime(EngineConfig())
    tmp = Path(tempfile.mkdtemp(prefix="cleat-guest-bench-"))
    rows = [
        (
            "language",
            "toolchain",
            "saga .wasm",
            "saga build",
            "steps .wasm",
            "step µs wall / cpu  of which guest+boundary",
        )
    ]
    try:
        cost = step_cost(runtime, wasmtime.wat2wasm(STEPS_WAT), args.steps, args.rounds)
        rows.append(("WAT (engine_bench)", "-", "-", "-", "-", cost))
        for name in languages:
            saga = cold_build(ROOT / "examples" / name / f"order_saga{SUFFIXES[name]}", tmp)
            steps = cold_build(ROOT / "bench" / "workloads" / f"steps{SUFFIXES[name]}", tmp)
            cost = step_cost(runtime, steps.path.read_bytes(), args.steps, args.rounds)
            rows.append(
                (
                    guest_build.LANGUAGE_NAMES[name],
                    saga.toolchain,
                    f"{saga.path.stat().st_size / 1000:.1f} kB",
                    f"{saga.seconds:.1f} s",
                    f"{steps.path.stat().st_size / 1000:.1f} kB",
                    cost,
                )
            )
    finally:
        runtime.close()
        shutil.rmtree(tmp, ignore_errors=True)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            print("-" * (sum(widths) + 2 * (len(widths) - 1)))


if __name__ == "__main__":
    main()
