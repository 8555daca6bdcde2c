"""The wake sweep's cost on a large table (PostgreSQL): a scratch database with many waiting
runs, ended children and consumed signals from the past days, and a few lost wake-ups just
now; prints the plan of ``cleat.missed_wakes``'s statement (``EXPLAIN (ANALYZE, BUFFERS)``,
as its owner would run it) and the time of a whole pass (candidates, rule, wake).

    .venv/bin/python -m bench.wake_sweep_bench                         # 200,000 of each
    .venv/bin/python -m bench.wake_sweep_bench --rows 1000000 --keep

``CLEAT_BENCH_PG_URL`` names the server, as a superuser (default
``postgres://postgres@127.0.0.1:5432/postgres``); the database ``cleat_wake_bench`` is made
on it (dropped first if it exists) and dropped afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from urllib.parse import urlsplit, urlunsplit

import psycopg

DATABASE = "cleat_wake_bench"
LOST = 50  # lost wake-ups of each kind


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="of each kind of old row")
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()
    admin = os.environ.get("CLEAT_BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    parts = urlsplit(admin)
    os.environ["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{DATABASE}"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleat_project.settings")
    os.environ.setdefault("DEBUG", "1")
    try:
        return run(args)
    finally:
        from django.db import connection

        connection.close()
        if not args.keep:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {DATABASE}")


def run(args: argparse.Namespace) -> int:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from tests.fixtures.wat import Wat
    from workflows import definitions
    from workflows.models import DEFAULT_TENANT_ID, Tenant
    from workflows.store import wake
    from workflows.store.sql.postgresql import MISSED_WAKES_FUNCTION

    call_command("migrate", verbosity=0)
    tenant = Tenant.objects.get(id=DEFAULT_TENANT_ID)
    w = Wat()
    w.run(f"(call $rec (call $durable_await_signals {w.js(['go'])} (i64.const -1))) (call $finish)")
    definition = definitions.deploy_definition(tenant, "bench", w.wasm())
    n = args.rows
    began = time.monotonic()
    insert_runs = """
        INSERT INTO workflows_workflowinstance (
            id, workflow_id, definition_id, definition_name, definition_version, entry_point,
            status, input, generation, priority, task_queue, parent_close_policy, query_state,
            event_count, cancel_requested, attempt, waiting_on, paused_by_deactivation,
            created_at, updated_at, next_wake_at, completed_at, parent_id, tenant_id)
        SELECT gen_random_uuid(), 'wf-' || g, %(definition)s, 'bench', 1, 'run',
               %(status)s, 'null', 1, 0, 'default', 'terminate', '{}',
               1, false, 1, '{"kind": "signals", "signals": ["go"]}', false,
               now() - interval '30 days', now(), %(wake)s, %(ended)s, %(parent)s, %(tenant)s
          FROM generate_series(1, %(n)s) AS g
    """
    base = {"definition": definition.id, "tenant": tenant.id, "parent": None}
    with connection.cursor() as cursor:
        # Waiting runs (a day's timer or a signal), and runs that ended over the past 30 days.
        wait = {"status": "ready", "wake": timezone.now() + timezone.timedelta(days=1)}
        cursor.execute(insert_runs, {**base, **wait, "ended": None, "n": n})
        cursor.execute(
            "SELECT id FROM workflows_workflowinstance ORDER BY random() LIMIT %s", [3 * LOST]
        )
        parents = [row[0] for row in cursor.fetchall()]
        cursor.execute(
            """UPDATE workflows_workflowinstance SET status = 'done', next_wake_at = NULL,
                      completed_at = now() - (random() * interval '30 days')
                WHERE id IN (SELECT id FROM workflows_workflowinstance
                              WHERE NOT (id = ANY(%s)) LIMIT %s)""",
            [parents, n // 2],
        )
        done = {"status": "done", "wake": None}
        old_end = timezone.now() - timezone.timedelta(days=3)
        cursor.execute(
            insert_runs, {**base, **done, "ended": old_end, "parent": parents[0], "n": n}
        )
        # Signals long consumed.
        cursor.execute(
            """INSERT INTO workflows_signal (tenant_id, instance_id, name, payload,
                      correlation_id, sender, created_at, consumed_at)
               SELECT %s, %s, 'go', 'null', '', 'api', now() - interval '2 days',
                      now() - interval '2 days' FROM generate_series(1, %s)""",
            [tenant.id, parents[0], n],
        )
        # Lost wake-ups just now: children ended, signals arrived, nobody woke the runs.
        for parent in parents[:LOST]:
            cursor.execute(
                insert_runs + " RETURNING id",
                {**base, **done, "ended": timezone.now(), "parent": parent, "n": 1},
            )
            child = cursor.fetchone()[0]
            cursor.execute(
                "UPDATE workflows_workflowinstance SET waiting_on = %s WHERE id = %s",
                [json.dumps({"kind": "child", "run_ids": [str(child)]}), parent],
            )
        for target in parents[LOST : 2 * LOST]:
            cursor.execute(
                """INSERT INTO workflows_signal (tenant_id, instance_id, name, payload,
                          correlation_id, sender, created_at)
                   VALUES (%s, %s, 'go', 'null', '', 'api', now())""",
                [tenant.id, target],
            )
        cursor.execute("ANALYZE")
        cursor.execute("SELECT count(*) FROM workflows_workflowinstance")
        total_runs = cursor.fetchone()[0]
    seeded_s = time.monotonic() - began

    body = MISSED_WAKES_FUNCTION.split("$sweep$")[1]
    now = timezone.now()
    since = now - timezone.timedelta(seconds=13)  # a pass every 3 s, 10 s of overlap
    statement = body.replace("$1", "%(since)s").replace("$2", "%(now)s")
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + statement, {"since": since, "now": now}
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
        timings = []
        for _ in range(args.passes):
            start = time.perf_counter()
            cursor.execute("SELECT count(*) FROM cleat.missed_wakes(%s, %s)", [since, now])
            found = cursor.fetchone()[0]
            timings.append((time.perf_counter() - start) * 1000)
    start = time.perf_counter()
    woken = wake.sweep_missed_wakes(since, timezone.now())
    pass_ms = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    again = wake.sweep_missed_wakes(since, timezone.now())
    idle_ms = (time.perf_counter() - start) * 1000

    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"{total_runs} runs ({n} waiting), {n} consumed signals; seeded in {seeded_s:.0f}s")
    print(plan)
    print(
        f"cleat.missed_wakes: {found} candidates, median {statistics.median(timings):.2f} ms "
        f"(max {max(timings):.2f}) over {args.passes} calls"
    )
    print(f"a pass that woke {woken} runs: {pass_ms:.1f} ms")
    print(f"the next pass (woke {again}): {idle_ms:.1f} ms")
    return 0 if woken == 2 * LOST and again == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
