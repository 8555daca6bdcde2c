"""History compaction: the load and the replay of a long run's history with and without
compaction (``CLEAT_COMPACT_AFTER_EVENTS``), on the Django store.

A WAT workflow writes durable log lines (recorded events), sleeping after every 5,000,
then sleeps twice. Each variant runs it in a scratch database: the first segments record the N events
(with compaction on, their finalizes fold all but the last 100 into the checkpoint); then the
figures are taken:

* **load**: reading the whole history as a segment does (``WorkflowEvent.history``: the
  checkpoint expanded and the rows), best of 3;
* **segment**: the second segment through the worker's path (claim, load, replay of the N
  events, the new sleep recorded, the fenced finalize).

    DEBUG=1 .venv/bin/python -m bench.compaction_bench                 # 100,000 events, SQLite
    DEBUG=1 DATABASE_URL=postgres://postgres@127.0.0.1/cleat_bench \
        .venv/bin/python -m bench.compaction_bench

With ``DATABASE_URL`` unset it uses a temporary SQLite file. The database named must be a
scratch one: the script migrates it and adds a tenant, definitions and runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any


# The history is recorded over several segments of this many steps (a sleep ends each), as a
# long run's is: one segment that records 100,000 events at once is not what is measured.
SEGMENT_STEPS = 5000


def counter(steps: int) -> bytes:
    from tests.fixtures.wat import Wat

    w = Wat()
    w.run(
        f"""
    (block $done (loop $again
      (br_if $done (i64.ge_s (local.get $i) (i64.const {steps})))
      (local.set $n (call $durable_log (i32.const 1) {w.s("tick")}))
      (local.set $i (i64.add (local.get $i) (i64.const 1)))
      (if (i64.eqz (i64.rem_s (local.get $i) (i64.const {SEGMENT_STEPS})))
        (then (drop (call $durable_sleep (i64.const 1000)))))
      (br $again)))
    (drop (call $durable_sleep (i64.const 1000)))
    (drop (call $durable_sleep (i64.const 1000)))
    (call $recn (local.get $n))
    (call $finish)""",
        locals="$i i64 $n i64",
    )
    return w.wasm()


def measure(env: Any, name: str, wasm: bytes, threshold: int, steps: int) -> dict[str, Any]:
    from django.test import override_settings

    from workflows.models import WorkflowEvent, WorkflowInstance
    from workflows.tenancy import tenant_context

    env.deploy(name, wasm)
    with override_settings(CLEAT_COMPACT_AFTER_EVENTS=threshold):
        run = env.start(name)
        began = time.perf_counter()
        env.run_until_idle()
        while env.describe(run)["events"] < steps + steps // SEGMENT_STEPS:
            env.advance(seconds=1)
        first = time.perf_counter() - began
        tenant = env.tenant.id
        with tenant_context(tenant):
            row = WorkflowInstance.objects.get(id=run)
            rows = WorkflowEvent.objects.filter(instance_id=run).count()
        loads = []
        for _ in range(3):
            began = time.perf_counter()
            with tenant_context(tenant):
                events = len(WorkflowEvent.history(tenant, run))
            loads.append(time.perf_counter() - began)
        began = time.perf_counter()
        env.advance(seconds=1)
        segment = time.perf_counter() - began
    assert env.status(run) == "ready", (env.describe(run)["error"], env.describe(run)["status"])
    return {
        "events": events,
        "rows": rows,
        "compacted": row.compacted_events,
        "first": first,
        "load": min(loads),
        "segment": segment,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=100_000, help="log events of the history (a multiple of 5000)"
    )
    parser.add_argument("--every", type=int, default=1000, help="CLEAT_COMPACT_AFTER_EVENTS")
    args = parser.parse_args()
    scratch = None
    if not os.environ.get("DATABASE_URL"):
        scratch = tempfile.mkdtemp(prefix="cleat-compaction-bench-")
        os.environ["DATABASE_URL"] = f"sqlite:///{scratch}/bench.sqlite3"
    os.environ.setdefault("DEBUG", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleat_project.settings")
    import logging

    import django

    django.setup()
    logging.getLogger("cleat.engine").setLevel(logging.WARNING)  # not a line per log event
    from django.core.management import call_command
    from django.db import connection

    from workflows.models import DEFAULT_TENANT_ID, Tenant
    from workflows.testing import DatabaseWorkflowEnvironment

    call_command("migrate", verbosity=0)
    tenant, _ = Tenant.objects.get_or_create(id=DEFAULT_TENANT_ID, defaults={"name": "default"})
    env = DatabaseWorkflowEnvironment(tenant, controlled_clock=True)
    wasm = counter(args.steps)
    print(
        f"{connection.vendor}; a history of {args.steps + args.steps // SEGMENT_STEPS} events; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"{'variant':28} {'rows':>7} {'compacted':>9} {'load s':>8} {'segment s':>9} "
        f"{'recording s':>11}"
    )
    for label, name, threshold in (
        ("without compaction", "plain", 0),
        (f"compacted every {args.every}", "compacted", args.every),
    ):
        figures = measure(env, name, wasm, threshold, args.steps)
        assert figures["events"] == args.steps + args.steps // SEGMENT_STEPS, figures
        print(
            f"{label:28} {figures['rows']:>7} {figures['compacted']:>9} "
            f"{figures['load']:>8.3f} {figures['segment']:>9.2f} {figures['first']:>11.1f}"
        )
    env.close()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
