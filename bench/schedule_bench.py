"""Schedule benchmark: firing lateness of an idle worker -- when a run is started (and first
claimed) versus the instant its schedule named.

Run it from the repository root::

    .venv/bin/python -m bench.schedule_bench                      # PostgreSQL, ~3 minutes
    .venv/bin/python -m bench.schedule_bench --db sqlite --seconds 30
    .venv/bin/python -m bench.schedule_bench --scenario clustered --per-instant 25

Method (``bench/README.md``, section "Schedules", has the details and the figures):

1. a fresh database (PostgreSQL: created and migrated as the superuser, then used as the
   application role ``cleat_app`` so row-level security and the ``cleat.due_schedules``
   definer function are on the path; SQLite: a file in a temporary folder), and a workflow
   that completes at once;
2. cron has minute resolution, and waiting for a few hundred real minutes is not a
   benchmark. So, **for the benchmark only**, each schedule's timing (the model's ``timing``
   property, which the scheduler asks for the next and previous instants) is replaced by an
   every-``period``-seconds timing with its own offset: the firings are spread over the
   seconds, as many every-minute schedules with staggered seconds would be. Everything
   else is the production path: the worker loop (``workflows.worker.Worker``, poll interval
   1 s) sleeping until the next schedule instant, the tick, the compare-and-swap, the
   overlap check, ``start_workflow`` with the instant's idempotency key, the claim;
3. the worker runs in this process for ``--seconds``; then, for every run whose instant
   fell inside the window: start lateness = ``created_at - instant``, claim lateness =
   ``started_at - instant``; p50/p90/p99/max.

Scenarios: ``staggered`` (one schedule per instant: the idle case) and ``clustered``
(``--per-instant`` schedules share each instant: a burst the tick works through in turn).
The goal is p99 start lateness <= 1 s.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
GOAL_P99_S = 1.0

QUICK_WAT = r"""
(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (data (i32.const 16) "\00true")
  (func (export "cleat_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (local.get $p) (local.get $n)))
    (local.get $p))
  (func (export "run") (param $ptr i32) (param $len i32) (result i64)
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 5))))
"""


@dataclass(frozen=True)
class EverySeconds:
    """The benchmark's timing: instants ``offset + k * period`` seconds (epoch)."""

    period: float
    offset: float

    def next_after(self, t: datetime) -> datetime:
        k = math.floor((t.timestamp() - self.offset) / self.period) + 1
        return datetime.fromtimestamp(self.offset + k * self.period, UTC)

    def prev_before(self, t: datetime) -> datetime:
        k = math.ceil((t.timestamp() - self.offset) / self.period) - 1
        return datetime.fromtimestamp(self.offset + k * self.period, UTC)


@dataclass(frozen=True)
class Scenario:
    name: str
    schedules: int
    per_instant: int
    period: float


@dataclass
class Result:
    scenario: Scenario
    start_lateness: list[float]
    claim_lateness: list[float]
    seconds: float

    def pct(self, values: list[float], p: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


# --- the database ----------------------------------------------------------------------------


def _pg_url(base: str, db: str, user: str | None = None) -> str:
    parts = urlsplit(base)
    netloc = parts.netloc if user is None else f"{user}@{parts.hostname}:{parts.port or 5432}"
    return urlunsplit(("postgres", netloc, f"/{db}", "", ""))


def _pg_args(base: str) -> list[str]:
    parts = urlsplit(base)
    return [
        "-h",
        parts.hostname or "127.0.0.1",
        "-p",
        str(parts.port or 5432),
        "-U",
        parts.username or "postgres",
    ]


def prepare_database(args: argparse.Namespace, workdir: Path) -> str:
    """Create and migrate the database; return the URL this process uses."""
    env = {**os.environ, "DEBUG": "1", "DJANGO_SETTINGS_MODULE": "cleat_project.settings"}
    if args.db == "sqlite":
        url = f"sqlite:///{workdir / 'bench.sqlite3'}"
        owner_url = url
    else:
        subprocess.run(
            ["dropdb", *_pg_args(args.pg), "--if-exists", "--force", args.pg_db],
            check=True,
            env=env,
        )
        subprocess.run(["createdb", *_pg_args(args.pg), args.pg_db], check=True, env=env)
        owner_url = _pg_url(args.pg, args.pg_db)
        url = _pg_url(args.pg, args.pg_db, user="cleat_app")
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"],
        cwd=ROOT,
        env={**env, "DATABASE_URL": owner_url},
        check=True,
    )
    return url


def drop_database(args: argparse.Namespace) -> None:
    if args.db == "postgres" and not args.keep:
        from django.db import connections

        connections.close_all()
        subprocess.run(
            ["dropdb", *_pg_args(args.pg), "--if-exists", "--force", args.pg_db], check=False
        )


# --- one scenario -----------------------------------------------------------------------------


def run_scenario(scenario: Scenario, seconds: float, concurrency: int) -> Result:
    import wasmtime
    from django.utils import timezone

    from schedules.models import Schedule
    from workflows.definitions import deploy_definition
    from workflows.models import DEFAULT_TENANT_ID, WorkflowInstance
    from workflows.services import get_tenant
    from workflows.tenancy import tenant_context
    from workflows.worker import Worker, WorkerOptions

    tenant = get_tenant(str(DEFAULT_TENANT_ID))
    with tenant_context(tenant.id):
        if not Schedule.objects.exists() and not WorkflowInstance.objects.exists():
            deploy_definition(tenant, "bench_quick", wasmtime.wat2wasm(QUICK_WAT))
        Schedule.objects.all().delete()

    groups = max(1, scenario.schedules // scenario.per_instant)
    start = timezone.now() + timedelta(seconds=3)  # the worker starts meanwhile
    end = start + timedelta(seconds=seconds)
    timings: dict[str, EverySeconds] = {}
    prefix = f"bench-{scenario.name}-{uuid.uuid4().hex[:6]}"
    with tenant_context(tenant.id):
        for i in range(scenario.schedules):
            group = i % groups
            timing = EverySeconds(scenario.period, group * scenario.period / groups)
            name = f"{prefix}-{i:03d}"
            timings[name] = timing
            Schedule.objects.create(
                tenant=tenant,
                name=name,
                workflow_name="bench_quick",
                cron="* * * * *",  # stands for the timing below (see the module docstring)
                next_run_at=timing.next_after(start),
            )
    original = Schedule.timing
    Schedule.timing = property(lambda self: timings[self.name])  # type: ignore[assignment,method-assign]
    worker = Worker(WorkerOptions(worker_id=prefix, concurrency=concurrency, poll_interval_s=1.0))
    thread = threading.Thread(target=worker.run, name="bench-worker", daemon=True)
    try:
        thread.start()
        time.sleep(max(0.0, (end - timezone.now()).total_seconds()) + 2.0)
    finally:
        worker.stop()
        thread.join(timeout=60)
        Schedule.timing = original  # type: ignore[method-assign]
    with tenant_context(tenant.id):
        ids = {str(s.id): s.name for s in Schedule.objects.filter(name__startswith=prefix)}
        rows = list(
            WorkflowInstance.objects.filter(
                start_idempotency_key__startswith="schedule:"
            ).values_list("start_idempotency_key", "created_at", "started_at")
        )
        Schedule.objects.filter(name__startswith=prefix).update(enabled=False)
    starts: list[float] = []
    claims: list[float] = []
    for key, created_at, started_at in rows:
        _, schedule_id, stamp = key.split(":", 2)
        if schedule_id not in ids:
            continue
        instant = datetime.fromisoformat(stamp)
        if not start <= instant <= end:
            continue
        starts.append((created_at - instant).total_seconds())
        if started_at is not None:
            claims.append((started_at - instant).total_seconds())
    expected = sum(sum(1 for _ in _instants(t, start, end)) for t in timings.values())
    if len(starts) != expected:
        print(f"  warning: {len(starts)} firings recorded, {expected} instants in the window")
    return Result(scenario, starts, claims, seconds)


def _instants(timing: EverySeconds, start: datetime, end: datetime) -> Any:
    cursor = timing.next_after(start - timedelta(microseconds=1))
    while cursor <= end:
        yield cursor
        cursor = timing.next_after(cursor)


# --- output ----------------------------------------------------------------------------------


def print_results(results: Sequence[Result], args: argparse.Namespace) -> None:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    print()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load {load[0]:.1f}; Python {platform.python_version()}; database: {args.db}"
    )
    header = f"{'scenario':<34} {'firings':>7} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}"
    for label, pick in (
        ("start lateness (created_at - instant)", "start"),
        ("claim lateness (started_at - instant)", "claim"),
    ):
        print(f"\n{label}, seconds")
        print(header)
        for result in results:
            values = result.start_lateness if pick == "start" else result.claim_lateness
            if not values:
                print(f"{result.scenario.name:<34} {0:>7}")
                continue
            s = result.scenario
            title = f"{s.name} ({s.schedules} sched, {s.per_instant}/instant, {s.period:g}s)"
            print(
                f"{title:<34} {len(values):>7} {result.pct(values, 50):>8.3f} "
                f"{result.pct(values, 90):>8.3f} {result.pct(values, 99):>8.3f} {max(values):>8.3f}"
            )
    print()
    for result in results:
        if not result.start_lateness:
            continue
        p99 = result.pct(result.start_lateness, 99)
        verdict = "meets" if p99 <= GOAL_P99_S else "MISSES"
        print(
            f"goal p99 start lateness <= {GOAL_P99_S:g} s: {result.scenario.name} {verdict} "
            f"it ({p99:.3f} s; mean {statistics.fmean(result.start_lateness):.3f} s)"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument(
        "--pg", default="postgres://postgres@127.0.0.1:5432/postgres", help="superuser URL"
    )
    parser.add_argument("--pg-db", default="cleat_schedule_bench")
    parser.add_argument("--seconds", type=float, default=150.0, help="window per scenario")
    parser.add_argument("--scenario", choices=("staggered", "clustered", "both"), default="both")
    parser.add_argument("--schedules", type=int, default=30, help="staggered: schedules")
    parser.add_argument(
        "--period",
        type=float,
        default=15.0,
        help="staggered: seconds between a schedule's instants",
    )
    parser.add_argument(
        "--per-instant", type=int, default=10, help="clustered: schedules per instant"
    )
    parser.add_argument("--keep", action="store_true", help="keep the PostgreSQL database")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="cleat-schedule-bench-"))
    url = prepare_database(args, workdir)
    os.environ.update(
        {
            "DATABASE_URL": url,
            "DEBUG": "1",
            "DJANGO_SETTINGS_MODULE": "cleat_project.settings",
            "CLEAT_LOG_LEVEL": os.environ.get("CLEAT_LOG_LEVEL", "WARNING"),
        }
    )
    import django

    django.setup()
    concurrency = 1 if args.db == "sqlite" else 4
    scenarios = []
    if args.scenario in ("staggered", "both"):
        scenarios.append(Scenario("staggered", args.schedules, 1, args.period))
    if args.scenario in ("clustered", "both"):
        # The staggered case's firings per second (schedules / period), in bursts of
        # --per-instant: per/2 times the schedules, each per/2 times less often.
        per = args.per_instant
        scenarios.append(
            Scenario("clustered", args.schedules * per // 2, per, args.period * per / 2)
        )
    results = []
    try:
        for scenario in scenarios:
            print(
                f"running {scenario.name}: {scenario.schedules} schedules, "
                f"{scenario.per_instant} per instant, each every {scenario.period:g} s, "
                f"for {args.seconds:g} s ...",
                flush=True,
            )
            results.append(run_scenario(scenario, args.seconds, concurrency))
    finally:
        drop_database(args)
        shutil.rmtree(workdir, ignore_errors=True)
    print_results(results, args)


if __name__ == "__main__":
    main()
