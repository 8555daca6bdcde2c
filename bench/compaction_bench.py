"""History compaction: the load and the replay of a long run's history with and without
compaction (``CLEAT_COMPACT_AFTER_EVENTS``), on the Django store.

The workflow writes N durable log lines (one recorded event each), then sleeps twice. The
N events are seeded straight into the store (recording them through the worker, 5,000 per
segment, takes minutes at 100,000): as rows for the plain run, and for the compacted run as
the store's fold leaves them (``engine.compaction.fold``, one chunk per ``--every`` events,
all but the last 100 in the checkpoint). Then:

* **load**: reading the whole history as a segment does (``WorkflowEvent.history``: the
  checkpoint expanded and the rows), best of 3;
* **segment**: one segment through the worker's path (claim, load, replay of the N events,
  the wait on the first sleep, the fenced finalize).

    DEBUG=1 .venv/bin/python -m bench.compaction_bench                 # 100,000 events, SQLite
    DEBUG=1 DATABASE_URL=postgres://postgres@127.0.0.1/cleat_bench \\
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


def logger(steps: int) -> bytes:
    from tests.fixtures.wat import Wat

    w = Wat()
    w.run(
        f"""
    (block $done (loop $again
      (br_if $done (i64.ge_s (local.get $i) (i64.const {steps})))
      (drop (call $durable_log (i32.const 1) {w.s("tick")}))
      (local.set $i (i64.add (local.get $i) (i64.const 1)))
      (br $again)))
    (drop (call $durable_sleep (i64.const 1000)))
    (drop (call $durable_sleep (i64.const 1000)))
    (call $recn (local.get $i))
    (call $finish)""",
        locals="$i i64",
    )
    return w.wasm()


def seed(env: Any, run: str, steps: int, threshold: int, sample: Any) -> None:
    """The run's first ``steps`` events: ``sample`` (a recorded log event) at each step."""
    from engine import compaction
    from engine.events import EncodedEvent, checksum
    from workflows.crypto import seal_json_column
    from workflows.models import WorkflowEvent, WorkflowInstance
    from workflows.tenancy import tenant_context

    tenant = env.tenant.id
    events = [
        EncodedEvent(
            s,
            sample.type_code,
            sample.ts,
            sample.payload,
            checksum(s, sample.type_code, sample.ts, sample.payload),
        )
        for s in range(steps)
    ]
    folded = steps - compaction.kept_tail(threshold) if threshold else 0
    state = None
    for first in range(0, folded, threshold or 1):
        state = compaction.fold(state, events[first : min(first + threshold, folded)])
    with tenant_context(tenant):
        WorkflowEvent.objects.bulk_create(
            (
                WorkflowEvent(
                    tenant_id=tenant,
                    instance_id=run,
                    step=e.step,
                    type_code=e.type_code,
                    payload=e.payload,
                    timestamp_ms=e.ts,
                    checksum=e.checksum,
                )
                for e in events[folded:]
            ),
            batch_size=2000,
        )
        WorkflowInstance.objects.filter(id=run).update(
            event_count=steps,
            compacted_events=folded,
            compaction_state=seal_json_column(
                WorkflowInstance, "compaction_state", tenant, (run,), state.as_json()
            )
            if state
            else None,
        )


def measure(env: Any, name: str, steps: int, threshold: int, sample: Any) -> dict[str, Any]:
    from django.test import override_settings

    from workflows.models import WorkflowEvent
    from workflows.tenancy import tenant_context

    env.deploy(name, logger(steps))
    run = env.start(name)
    seed(env, run, steps, threshold, sample)
    tenant = env.tenant.id
    with tenant_context(tenant):
        rows = WorkflowEvent.objects.filter(instance_id=run).count()
    loads = []
    for _ in range(3):
        began = time.perf_counter()
        with tenant_context(tenant):
            events = len(WorkflowEvent.history(tenant, run))
        loads.append(time.perf_counter() - began)
    with override_settings(CLEAT_COMPACT_AFTER_EVENTS=threshold):
        began = time.perf_counter()
        env.run_until_idle()
        segment = time.perf_counter() - began
    info = env.describe(run)
    # Replayed to its end and waiting on the first sleep (recorded when it fires).
    assert (info["status"], info["events"], info["generation"]) == ("ready", steps, 1), info
    assert info["waiting_on"].startswith("timer until"), info
    return {"events": events, "rows": rows, "load": min(loads), "segment": segment}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000, help="events of the history")
    parser.add_argument("--every", type=int, default=1000, help="CLEAT_COMPACT_AFTER_EVENTS")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL"):
        scratch = tempfile.mkdtemp(prefix="cleat-compaction-bench-")
        os.environ["DATABASE_URL"] = f"sqlite:///{scratch}/bench.sqlite3"
    os.environ.setdefault("DEBUG", "1")
    # A run of CLEAT_MAX_HISTORY_EVENTS (100,000) events continues as new: the bench's run
    # must not reach it.
    os.environ["CLEAT_MAX_HISTORY_EVENTS"] = str(args.steps * 2)
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
    env.deploy("sample", logger(1))
    sample_run = env.start("sample")
    env.run_until_idle()
    sample = env.stored_history(sample_run)[0]
    print(
        f"{connection.vendor}; a history of {args.steps} events; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"{'variant':28} {'rows':>7} {'load s':>8} {'segment s':>9}")
    for label, name, threshold in (
        ("without compaction", "plain", 0),
        (f"compacted every {args.every}", "compacted", args.every),
    ):
        figures = measure(env, name, args.steps, threshold, sample)
        assert figures["events"] == args.steps, figures
        print(f"{label:28} {figures['rows']:>7} {figures['load']:>8.3f} {figures['segment']:>9.2f}")
    env.close()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
