"""Tracing benchmark: what a durable call costs with tracing off (the default: no tracer,
no span objects) and on (an SDK tracer whose spans go to an exporter that drops them).

Run it from the repository root::

    .venv/bin/python -m bench.tracing_bench                 # defaults, a few seconds
    .venv/bin/python -m bench.tracing_bench --steps 5000 --rounds 15

The workload is engine_bench's: one segment of N durable calls to an in-process echo
service, in-memory storage, no database. Figures are the mean µs per step (median of N-step
segments minus median of 0-step segments, over N), on wall and thread-CPU clocks.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from bench.engine_bench import STEPS_WAT, Bench
from engine.runtime import WasmRuntime


class DroppingExporter(SpanExporter):
    """Counts the spans and keeps none (the cost of making them, not of shipping them)."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    import wasmtime

    runtime = WasmRuntime()
    try:
        bench = Bench(runtime, wasmtime.wat2wasm(STEPS_WAT))
        bench.run_fresh(200)  # warm-up
        off = bench.step_mean(args.steps, args.rounds)
        exporter = DroppingExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        bench.services.tracer = provider.get_tracer("cleat")
        bench.run_fresh(200)
        on = bench.step_mean(args.steps, args.rounds)
        provider.shutdown()
    finally:
        runtime.close()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'durable_call step, µs':<34}{'wall':>8}{'cpu':>8}")
    print(f"{'tracing off (tracer None)':<34}{off.wall:>8.1f}{off.cpu:>8.1f}")
    print(f"{'tracing on (SDK, spans dropped)':<34}{on.wall:>8.1f}{on.cpu:>8.1f}")
    print(f"spans made with tracing on: {exporter.spans}")


if __name__ == "__main__":
    main()
