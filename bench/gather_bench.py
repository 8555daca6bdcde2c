"""Parallel durable calls: the wall time of one run that makes N slow calls, one after another
(N ``durable_call``s) and as one batch (``durable_call_many``, the host's optional extension
that ``ctx.gather`` uses), on the in-memory engine (``engine.testing.WorkflowEnvironment``).

    .venv/bin/python -m bench.gather_bench                       # 8 calls of 200 ms
    .venv/bin/python -m bench.gather_bench --calls 16 --delay-ms 100 --rounds 5

Each call sleeps ``--delay-ms`` in the service, so the sequential run takes about
N * delay and the batch about ceil(N / CLEAT_MAX_PARALLEL_CALLS) * delay plus the engine's
own time; the figures are the median of ``--rounds`` runs, with the load average printed
beside them (the service's sleeps do not need a CPU, so load matters little here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import wasmtime

from engine.config import EngineConfig
from engine.testing import WorkflowEnvironment

# A module whose entry makes the calls given by its generator and answers null. The host
# places the input at an address from cleat_alloc; the calls' strings are data segments.
PRELUDE = """
  (memory (export "memory") 4)
  (global $heap (mut i32) (i32.const 65536))
  (func (export "cleat_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (data (i32.const 16) "\\00null")
"""


def _string(data: dict[bytes, int], text: str) -> str:
    raw = text.encode()
    if raw not in data:
        data[raw] = 64 + sum(len(b) + 8 for b in data)
    return f"(i32.const {data[raw]}) (i32.const {len(raw)})"


def _escaped(raw: bytes) -> str:
    return "".join(
        chr(b) if 0x20 <= b < 0x7F and b not in (0x22, 0x5C) else f"\\{b:02x}" for b in raw
    )


def _module(body: list[str], data: dict[bytes, int], imports: str) -> bytes:
    segments = "".join(f'  (data (i32.const {at}) "{_escaped(raw)}")\n' for raw, at in data.items())
    calls = "\n".join(f"    (drop {call})" for call in body)
    source = (
        f"(module\n{imports}{PRELUDE}{segments}"
        '  (func (export "run") (param i32 i32) (result i64)\n'
        f"{calls}\n"
        "    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 5))))"
    )
    return bytes(wasmtime.wat2wasm(source))


def sequential_module(calls: int) -> bytes:
    data: dict[bytes, int] = {}
    body = [
        f"(call $durable_call {_string(data, 'slow')} {_string(data, 'wait')} "
        f"{_string(data, json.dumps({'n': n}))})"
        for n in range(calls)
    ]
    imports = (
        '  (import "env" "durable_call" (func $durable_call '
        "(param i32 i32 i32 i32 i32 i32) (result i64)))\n"
    )
    return _module(body, data, imports)


def batch_module(calls: int) -> bytes:
    data: dict[bytes, int] = {}
    requests = [
        {"service": "slow", "operation": "wait", "request": json.dumps({"n": n})}
        for n in range(calls)
    ]
    body = [f"(call $durable_call_many {_string(data, json.dumps(requests))})"]
    imports = (
        '  (import "env" "durable_call_many" (func $durable_call_many '
        "(param i32 i32) (result i64)))\n"
    )
    return _module(body, data, imports)


def measure(wasm: bytes, expected: int, delay_s: float, rounds: int, parallel: int) -> float:
    def wait(request: Any, *, idempotency_key: str, context: Any) -> Any:
        time.sleep(delay_s)
        return request

    env = WorkflowEnvironment({"slow": wait}, config=EngineConfig(max_parallel_calls=parallel))
    try:
        env.deploy("bench", wasm)
        times = []
        for _ in range(rounds):
            began = time.perf_counter()
            run = env.run("bench")
            times.append(time.perf_counter() - began)
            assert env.status(run) == "done", env.describe(run)
            calls = [e for e in env.history(run) if e.TYPE.value == "call"]
            assert len(calls) == expected and all(e.status == 0 for e in calls), calls[:1]
        return statistics.median(times)
    finally:
        env.runtime.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--delay-ms", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=EngineConfig().max_parallel_calls)
    args = parser.parse_args()
    delay = args.delay_ms / 1000
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"load average {load}; {args.calls} calls of {args.delay_ms} ms, "
        f"max_parallel_calls {args.parallel}, median of {args.rounds} runs"
    )
    sequential = measure(
        sequential_module(args.calls), args.calls, delay, args.rounds, args.parallel
    )
    batched = measure(batch_module(args.calls), args.calls, delay, args.rounds, args.parallel)
    print(f"sequential durable_call x{args.calls}: {sequential * 1000:8.1f} ms wall")
    print(f"durable_call_many of {args.calls}:     {batched * 1000:8.1f} ms wall")
    print(f"speed-up: {sequential / batched:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
