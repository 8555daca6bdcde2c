"""Waiting is free: runs that wait cost rows, not worker memory or segments; timers that fall
due at one instant drain quickly. PostgreSQL, the worker as the application role.

    .venv/bin/python -m bench.waiting_bench                   # 10,000 timers, 100,000 waiting
    .venv/bin/python -m bench.waiting_bench --timers 2000 --waiting 20000 --watch 30

1. **Timers due at once.** ``--timers`` runs each sleep ``--sleep`` seconds (started and run
   through their first segment by a worker, as in production: the bench prints that
   segment's rate, the CPU per run of the worker and of the server, and the WAL per run --
   a segment that suspends takes the general finalize, the path of every wait; each run's
   input is ``--input-kb`` KB of incompressible text, none by default, which a wait does not
   write again); once every timer is due, one
   ``runworker --burst`` (``--processes``, default 1, each of ``--threads``, default 16)
   drains them: runs/s from its spawn to the last run done, and from its first worker loop's
   start (a worker already running when timers fall due has paid its start: Django, the
   checks, the connection), each process's group-commit totals, and the CPU per run of its
   processes (their start included) and of the local PostgreSQL server. Goal (issue 16):
   2,000 runs/s. ``--drain running`` (or ``both``, the default) measures the production case
   as well: ``--timers`` more runs, started while the first ones sleep, are all made due at
   one instant T (their wake-ups moved to the latest of them, which no sleep's recorded end
   passes), and a ``runworker`` (not ``--burst``) is started before T, idle until T; the
   bench prints runs/s from T to the last run done and the CPU per run of the worker's
   processes and of the server from T on. Then ``--signal-waits`` runs (default 2,000; 0:
   none) each wait for a signal that does not come: the rate, CPU and WAL of their first
   segments, which look for the signal and suspend. Before the timers start the bench
   prints pgbench's single-client one-row INSERT rate on the same server
   (``--pgbench-seconds``, default 10; 0: none), the machine's speed in this run.
2. **Many waiting runs.** The database then holds ``--waiting`` runs that wait (copies of
   the sleeping runs' rows with their histories, each due when the lifecycle set it). A
   worker polls beside them for ``--watch`` seconds; the bench prints its resident memory
   at the start and the end, against a worker beside an empty table, and how many segments
   it ran meanwhile. A waiting run is due again at its re-check
   (``CLEAT_WAIT_RECHECK_SECONDS``, when set): the bench prints the re-check segments per
   second that many waiting runs imply. Goal: worker memory growth within 50 MB.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import tempfile
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench.store_bench import (
    Cleat,
    Server,
    ServerCounters,
    children_cpu_seconds,
    cpu_reference_line,
    database_cpu_seconds,
    pgbench_inserts,
    process_cpu_seconds,
)

# Sleeps SLEEP_MS, then completes with `true`.
SLEEPER_WAT = r"""
(module
  (import "env" "durable_sleep" (func $sleep (param i64) (result i64)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (data (i32.const 64) "\00true")
  (func (export "cleat_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (local.get $p) (local.get $n)))
    (local.get $p))
  (func (export "run") (param $ptr i32) (param $len i32) (result i64)
    (drop (call $sleep (i64.const SLEEP_MS)))
    (i64.or (i64.shl (i64.const 64) (i64.const 32)) (i64.const 5))))
"""

# Waits up to a day for the signal "go", then completes with `true`.
SIGNAL_WAITER_WAT = r"""
(module
  (import "env" "durable_await_signals" (func $await (param i32 i32 i64) (result i64)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (data (i32.const 64) "\00true")
  (data (i32.const 128) "[\"go\"]")
  (func (export "cleat_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (local.get $p) (local.get $n)))
    (local.get $p))
  (func (export "run") (param $ptr i32) (param $len i32) (result i64)
    (drop (call $await (i32.const 128) (i32.const 6) (i64.const 86400000)))
    (i64.or (i64.shl (i64.const 64) (i64.const 32)) (i64.const 5))))
"""

GOAL_DRAIN_RUNS_S = 2000.0
GOAL_RSS_GROWTH_MB = 50.0


def runworker_pids(pid: int) -> list[int]:
    """``pid`` and its children: a runworker's processes (its workers, when it forked them)."""
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return pids


def rss_mb(pid: int) -> float:
    """Resident memory of a runworker's processes (``runworker_pids``)."""
    total = 0
    for p in runworker_pids(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def copy_rows(cleat: Cleat, copies: int, batch: int = 5000) -> None:
    """``copies`` more waiting runs: copies of the waiting rows there are, histories included
    (each as the lifecycle left it: ready, due at its wake-up)."""
    from django.db import transaction

    from workflows.models import WorkflowEvent, WorkflowInstance
    from workflows.tenancy import tenant_context

    with tenant_context(cleat.tenant.id):
        templates = list(WorkflowInstance.objects.all())
        events: dict[Any, list[WorkflowEvent]] = {}
        for event in WorkflowEvent.objects.all():
            events.setdefault(event.instance_id, []).append(event)
    made = 0
    while made < copies:
        runs, rows = [], []
        for k in range(made, min(copies, made + batch)):
            template = templates[k % len(templates)]
            run = WorkflowInstance(
                **{
                    f.attname: getattr(template, f.attname)
                    for f in WorkflowInstance._meta.concrete_fields
                }
            )
            run.id = uuid.uuid4()
            run.workflow_id = str(run.id)
            runs.append(run)
            for event in events.get(template.id, []):
                row = WorkflowEvent(
                    **{
                        f.attname: getattr(event, f.attname)
                        for f in WorkflowEvent._meta.concrete_fields
                    }
                )
                row.id = None
                row.instance_id = run.id
                rows.append(row)
        with tenant_context(cleat.tenant.id), transaction.atomic():
            WorkflowInstance.objects.bulk_create(runs)
            WorkflowEvent.objects.bulk_create(rows)
        made += len(runs)
        print(f"  {made:,}/{copies:,} waiting runs copied", flush=True)


def first_segments(
    cleat: Cleat, server: Server, args: argparse.Namespace, runs: int, log: str
) -> tuple[float, float, float, ServerCounters]:
    """One ``runworker --burst`` over the ``runs`` runs just started (each suspends in its
    first segment): its seconds from the spawn, the worker's and the server's CPU seconds
    and the server's WAL counters meanwhile. Exits with the log's tail when not every run
    ended up waiting."""
    started = time.monotonic()
    cpu, server_cpu, counters = (
        children_cpu_seconds(),
        database_cpu_seconds(),
        ServerCounters.read(server),
    )
    first = cleat.runworker(
        "--concurrency",
        str(args.threads),
        "--processes",
        str(args.processes),
        "--burst",
        log=log,
    )
    first.wait(timeout=3600)
    seconds = time.monotonic() - started
    cpu, server_cpu = children_cpu_seconds() - cpu, database_cpu_seconds() - server_cpu
    counters = ServerCounters.read(server) - counters
    got = counts(cleat)
    if got["waiting"] != runs:
        tail = (cleat.logdir / log).read_text()[-3000:]
        raise SystemExit(f"the first segments did not all run: {got}\n{tail}")
    return seconds, cpu, server_cpu, counters


def print_first_segments(
    what: str,
    args: argparse.Namespace,
    runs: int,
    measured: tuple[float, float, float, ServerCounters],
    extra: str = "",
) -> None:
    seconds, cpu, server_cpu, counters = measured
    per = max(1, runs)
    print(
        f"first segments ({what}): {runs / seconds:,.0f} runs/s from the spawn, "
        f"{args.processes} process(es) x {args.threads} threads; CPU per run: worker "
        f"{cpu / per * 1000:.2f} ms (its start included), PostgreSQL server "
        f"{server_cpu / per * 1000:.2f} ms; WAL per run {counters.wal_records / per:.1f} "
        f"records, {counters.wal_bytes / per / 1024:,.1f} KB{extra}"
    )


def start_timers(cleat: Cleat, server: Server, args: argparse.Namespace, expect: int) -> None:
    """``--timers`` runs started and run through their first segments (each suspends on its
    timer), which are measured; ``expect`` runs are waiting afterwards."""
    from django.db import connections

    from workflows.services import start_workflow

    began = time.monotonic()
    # A run's input, --input-kb of hex digits (incompressible), or none.
    payload = {"blob": os.urandom(args.input_kb * 512).hex()} if args.input_kb else None
    for _ in range(args.timers):
        start_workflow(cleat.tenant, "sleeper", payload)
    connections.close_all()
    started = time.monotonic()
    # The statistics a database in use has (autovacuum's): without them the first set's
    # segments cost the server three to four times the CPU of the second set's.
    cleat.analyze()
    measured = first_segments(cleat, server, args, expect, "first-segments.log")
    print(f"{args.timers} runs started in {started - began:.0f} s")
    # Each first segment suspends on its timer: the finalize of a wait (on PostgreSQL one
    # call of cleat.finalize_wait), the path of every segment that waits.
    print_first_segments(
        "each suspends on its timer", args, args.timers, measured, f" (input {args.input_kb} KB)"
    )


def group_commit_lines(log: Path) -> None:
    """Each process's writes (its ``worker_stopped`` line): direct, or in shared
    transactions."""
    for line in log.read_text().splitlines():
        if "event=worker_stopped" in line:
            fields = line.split()
            print(
                "  "
                + " ".join(
                    f
                    for f in fields
                    if f.startswith(("group_commit", "group_finalize", "group_suspend"))
                )
            )


def drained(
    cleat: Cleat, args: argparse.Namespace, before: int, since: datetime
) -> tuple[int, datetime | None, float, float, str]:
    """A drain's figures: the runs it completed (those done beyond ``before``), when the last
    of them completed, its seconds from ``since`` to then, its rate and the goal's verdict."""
    from django.db.models import Max

    from workflows.models import WorkflowInstance
    from workflows.tenancy import tenant_context

    with tenant_context(cleat.tenant.id):
        last = WorkflowInstance.objects.aggregate(m=Max("completed_at"))["m"]
    done = counts(cleat)["done"] - before
    seconds = (last - since).total_seconds() if last else float("nan")
    rate = done / seconds if seconds else 0.0
    verdict = "met" if rate >= GOAL_DRAIN_RUNS_S and done == args.timers else "MISSED"
    return done, last, seconds, rate, verdict


def drain_worker(
    cleat: Cleat, args: argparse.Namespace, log: str, *extra: str
) -> subprocess.Popen[bytes]:
    """A drain's ``runworker``: ``--processes`` of ``--threads`` each, ``--claim-ahead``."""
    return cleat.runworker(
        "--concurrency",
        str(args.threads),
        "--claim-ahead",
        args.claim_ahead,
        "--processes",
        str(args.processes),
        *extra,
        log=log,
    )


def drain_spawned(cleat: Cleat, server: Server, args: argparse.Namespace) -> int:
    """The first set's timers, once every one is due, drained by a ``runworker --burst``
    spawned then: its exit code."""
    from django.utils import timezone

    from workflows.models import RunStatus, WorkflowInstance
    from workflows.tenancy import tenant_context

    with tenant_context(cleat.tenant.id):
        # The first set: every run a worker has not drained is due by the last of its
        # timers, which the second set's (started later) all pass.
        due = (
            WorkflowInstance.objects.filter(status=RunStatus.READY)
            .order_by("next_wake_at")
            .values_list("next_wake_at", flat=True)[args.timers - 1]
        )
    pause = max(0.0, (due - timezone.now()).total_seconds() + 1)
    print(f"waiting {pause:.0f} s until every timer is due", flush=True)
    time.sleep(pause)
    server.psql(cleat.db, "VACUUM ANALYZE workflows_workflowinstance")
    cleat.analyze()
    before = counts(cleat)["done"]
    worker_cpu, server_cpu = children_cpu_seconds(), database_cpu_seconds()
    spawn = timezone.now()
    drain = drain_worker(cleat, args, "drain.log", "--burst")
    code = drain.wait(timeout=3600)
    worker_cpu = children_cpu_seconds() - worker_cpu
    server_cpu = database_cpu_seconds() - server_cpu

    done, last, seconds, rate, verdict = drained(cleat, args, before, spawn)
    print(
        f"drain by a worker spawned once they are due: {done}/{args.timers} done in "
        f"{seconds:.1f} s (exit {code}): {rate:,.0f} runs/s, {args.processes} process(es) x "
        f"{args.threads} threads (goal {GOAL_DRAIN_RUNS_S:,.0f}: {verdict})"
    )
    started = loops_started(cleat.logdir / "drain.log")
    if started is not None and last:
        warm = (last - started).total_seconds()
        print(
            f"  from the first worker loop's start ({(started - spawn).total_seconds():.2f} s "
            f"after the spawn; a running worker has started already): "
            f"{done / warm:,.0f} runs/s in {warm:.1f} s"
        )
    group_commit_lines(cleat.logdir / "drain.log")
    per = max(1, done)
    print(
        f"  CPU per run: worker {worker_cpu / per * 1000:.2f} ms (its start included: "
        f"{worker_cpu:.2f} s in all), PostgreSQL server {server_cpu / per * 1000:.2f} ms"
    )
    return code


def latest_wake(cleat: Cleat, since: datetime) -> datetime:
    """The latest due time of the waiting timers of the runs started since ``since``."""
    from django.db.models import Max

    from workflows.models import RunStatus, WorkflowInstance
    from workflows.tenancy import tenant_context

    with tenant_context(cleat.tenant.id):
        return WorkflowInstance.objects.filter(
            status=RunStatus.READY, next_wake_at__isnull=False, created_at__gte=since
        ).aggregate(m=Max("next_wake_at"))["m"]


def move_timers(server: Server, cleat: Cleat, since: datetime, to: datetime) -> int:
    """Every waiting timer of the runs started since ``since`` made due at ``to``: how many
    moved."""
    moved = server.psql(
        cleat.db,
        f"UPDATE workflows_workflowinstance SET next_wake_at = '{to.isoformat()}' "
        f"WHERE status = 'ready' AND next_wake_at IS NOT NULL "
        f"AND created_at >= '{since.isoformat()}'",
    )
    return int(moved.split()[-1])


def drain_running(
    cleat: Cleat,
    server: Server,
    args: argparse.Namespace,
    since: datetime,
    latest: datetime | None,
) -> int:
    """The set started at ``since``, all due at one instant T, drained by a ``runworker``
    already running (idle) at T, as in production: runs/s from T to the last run done, the
    CPU per run of its processes and of the server from T on. ``latest``: the latest wake-up
    the set's sleeps recorded, when they were moved since (None: their due times now). Its
    exit code."""
    from django.utils import timezone

    if latest is None:
        latest = latest_wake(cleat, since)
    # T: no earlier than the latest wake-up of the set (no sleep's recorded end is later),
    # and late enough for the worker to start and go idle before it.
    instant = max(latest, timezone.now() + timedelta(seconds=15))
    moved = move_timers(server, cleat, since, instant)
    server.psql(cleat.db, "VACUUM ANALYZE workflows_workflowinstance")
    cleat.analyze()
    before = counts(cleat)["done"]
    log = cleat.logdir / "drain-running.log"
    worker = drain_worker(cleat, args, log.name)
    try:
        wait_until(
            lambda: (
                log.exists() and log.read_text().count("event=worker_started") >= args.processes
            ),
            60,
            "the running worker's start",
        )
        if timezone.now() >= instant:
            raise SystemExit(f"the worker started after T ({instant})")
        print(
            f"{moved} timers moved to one instant T; the worker is idle "
            f"{(instant - timezone.now()).total_seconds():.1f} s before it",
            flush=True,
        )
        time.sleep(max(0.0, (instant - timezone.now()).total_seconds()))
        pids = runworker_pids(worker.pid)  # its processes, all started by now
        worker_cpu, server_cpu = process_cpu_seconds(pids), database_cpu_seconds()
        deadline = time.monotonic() + 3600
        while counts(cleat)["done"] - before < moved and time.monotonic() < deadline:
            if worker.poll() is not None:
                break
            time.sleep(0.1)
        worker_cpu = process_cpu_seconds(pids) - worker_cpu
        server_cpu = database_cpu_seconds() - server_cpu
    finally:
        worker.terminate()
        code = worker.wait(timeout=120)
    done, _, seconds, rate, verdict = drained(cleat, args, before, instant)
    print(
        f"drain by a worker running when they fall due at one instant: {done}/{args.timers} "
        f"done in {seconds:.1f} s from T (exit {code}): {rate:,.0f} runs/s, "
        f"{args.processes} process(es) x {args.threads} threads "
        f"(goal {GOAL_DRAIN_RUNS_S:,.0f}: {verdict})"
    )
    group_commit_lines(log)
    per = max(1, done)
    print(
        f"  CPU per run from T: worker {worker_cpu / per * 1000:.2f} ms, PostgreSQL server "
        f"{server_cpu / per * 1000:.2f} ms"
    )
    return code


def counts(cleat: Cleat) -> dict[str, Any]:
    from django.db.models import Count, Q, Sum

    from workflows.models import RunStatus, WorkflowInstance
    from workflows.tenancy import tenant_context

    with tenant_context(cleat.tenant.id):
        return WorkflowInstance.objects.aggregate(
            runs=Count("id"),
            done=Count("id", filter=Q(status=RunStatus.DONE)),
            events=Sum("event_count"),
            waiting=Count("id", filter=Q(status=RunStatus.READY, waiting_on__isnull=False)),
        )


def loops_started(log: Path) -> datetime | None:
    """When the first worker loop of a runworker began (its ``event=worker_started`` line,
    logged once Django, the checks and the worker are set up): the instant a worker that was
    already running would have claimed from."""
    stamps = [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").astimezone()
        for line in log.read_text().splitlines()
        if "event=worker_started" in line
    ]
    return min(stamps) if stamps else None


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.5)


def watch_worker(cleat: Cleat, seconds: int, log: str) -> tuple[float, float, int]:
    """A polling worker for ``seconds``: (RSS after warm-up, RSS at the end, segments run)."""
    from django.db import connections

    connections.close_all()
    proc = cleat.runworker("--concurrency", "4", log=log)
    try:
        time.sleep(5)
        start = rss_mb(proc.pid)
        time.sleep(max(0, seconds - 5))
        end = rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    segments = (cleat.logdir / log).read_text().count(" ms=")  # a line per segment
    return start, end, segments


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--timers", type=int, default=10_000)
    parser.add_argument("--waiting", type=int, default=100_000)
    parser.add_argument(
        "--sleep", type=int, default=300, help="seconds each run sleeps (longer than the starts)"
    )
    parser.add_argument("--watch", type=int, default=60, help="seconds each worker is watched")
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="worker processes of the drain (runworker --processes)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=16,
        help="segment threads of each drain process (default 16: runworker's default on 2 CPUs)",
    )
    parser.add_argument(
        "--input-kb",
        type=int,
        default=0,
        help="each run's input, in KB of incompressible text (default none): a large input is"
        " stored once, not written again at each of its waits",
    )
    parser.add_argument(
        "--signal-waits",
        type=int,
        default=2000,
        help="runs that wait for a signal, whose first segments are measured after the drain"
        " (0: none)",
    )
    parser.add_argument(
        "--drain",
        choices=("spawn", "running", "both"),
        default="both",
        help="how the timers are drained: by a runworker spawned once they are due, by one"
        " already running when they fall due at one instant, or both (default; twice the"
        " timers)",
    )
    parser.add_argument(
        "--pgbench-seconds",
        type=int,
        default=10,
        help="pgbench's single-client one-row INSERT rate on the same server, measured for"
        " that long before the timers start (0: not measured): the machine's speed in this"
        " run, to set the drains beside",
    )
    parser.add_argument(
        "--claim-ahead",
        default="auto",
        help="the drain's runworker --claim-ahead (default auto, runworker's default)",
    )
    args = parser.parse_args()
    if args.input_kb < 0:
        parser.error(f"--input-kb must be 0 or more, not {args.input_kb}")
    if args.signal_waits < 0:
        parser.error(f"--signal-waits must be 0 or more, not {args.signal_waits}")
    if args.timers < 1:
        parser.error(f"--timers must be 1 or more, not {args.timers}")
    if args.pgbench_seconds < 0:
        parser.error(f"--pgbench-seconds must be 0 or more, not {args.pgbench_seconds}")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    server = Server(args.pg)
    if args.pgbench_seconds > 0:
        with tempfile.TemporaryDirectory(prefix="cleat-waiting-pgbench-") as workdir:
            try:
                tps = pgbench_inserts(
                    server, "cleat_bench_waiting_pgbench", args.pgbench_seconds, Path(workdir)
                )
            finally:
                server.drop("cleat_bench_waiting_pgbench")
        print(f"pgbench, one client, one-row INSERTs: {tps:,.0f} tps (this run's machine)")
    print(cpu_reference_line())
    with tempfile.TemporaryDirectory(prefix="cleat-waiting-bench-") as logdir:
        cleat = Cleat(server, "cleat_bench_waiting", 60, Path(logdir))
        cleat.prepare()
        try:
            return run(cleat, server, args)
        finally:
            from django.db import connections

            connections.close_all()
            server.drop(cleat.db)


def run(cleat: Cleat, server: Server, args: argparse.Namespace) -> int:
    import wasmtime
    from django.db import connections
    from django.utils import timezone

    from workflows.definitions import deploy_definition
    from workflows.services import start_workflow

    sleeper = SLEEPER_WAT.replace("SLEEP_MS", str(args.sleep * 1000))
    deploy_definition(cleat.tenant, "sleeper", wasmtime.wat2wasm(sleeper))
    recheck = os.environ.get("CLEAT_WAIT_RECHECK_SECONDS", "the default")
    print(f"CLEAT_WAIT_RECHECK_SECONDS: {recheck}")

    # 1. Timers due at once: a set of --timers runs for each way of draining them; the
    # second set is started and run through its first segments while the first one sleeps.
    ways = ["spawn", "running"] if args.drain == "both" else [args.drain]
    since = timezone.now()
    start_timers(cleat, server, args, expect=args.timers)
    latest: datetime | None = None  # the running drain's set's, when it was parked
    if len(ways) == 2:  # the second set, parked a day ahead until the first is drained
        since = timezone.now()
        start_timers(cleat, server, args, expect=2 * args.timers)
        latest = latest_wake(cleat, since)
        move_timers(server, cleat, since, latest + timedelta(days=1))
    code = 0
    if "spawn" in ways:
        code = drain_spawned(cleat, server, args)
    if "running" in ways:
        code = drain_running(cleat, server, args, since, latest) or code

    # 1b. Runs that wait for a signal: each first segment looks for one (none has come) and
    # suspends on the wait.
    if args.signal_waits:
        deploy_definition(cleat.tenant, "signal_waiter", wasmtime.wat2wasm(SIGNAL_WAITER_WAT))
        for _ in range(args.signal_waits):
            start_workflow(cleat.tenant, "signal_waiter", None)
        connections.close_all()
        cleat.analyze()  # as for the timers' first segments
        measured = first_segments(cleat, server, args, args.signal_waits, "signal-waits.log")
        print_first_segments("each waits for a signal", args, args.signal_waits, measured)

    # 2. Many waiting runs: an idle worker's memory beside an empty table, then beside them.
    server.psql(
        cleat.db,
        "TRUNCATE workflows_workflowevent, workflows_workflowinstance CASCADE",
    )
    base_start, base_end, _ = watch_worker(cleat, args.watch, "idle-empty.log")
    template_runs = min(args.timers, 1000)
    for _ in range(template_runs):
        start_workflow(cleat.tenant, "sleeper", None)
    connections.close_all()
    cleat.runworker("--concurrency", "4", "--burst", log="templates.log").wait(timeout=3600)
    copy_rows(cleat, max(0, args.waiting - template_runs))
    server.psql(cleat.db, "VACUUM ANALYZE workflows_workflowinstance")
    waiting = counts(cleat)["runs"]
    start, end, segments = watch_worker(cleat, args.watch, "idle-waiting.log")
    growth = end - base_end
    verdict = "met" if growth <= GOAL_RSS_GROWTH_MB else "MISSED"
    print(
        f"idle worker beside an empty table: RSS {base_start:.0f} -> {base_end:.0f} MB over "
        f"{args.watch} s"
    )
    print(
        f"beside {waiting:,} waiting runs: RSS {start:.0f} -> {end:.0f} MB, "
        f"{segments} segments run in {args.watch} s; growth against the empty table "
        f"{growth:+.0f} MB (goal <= {GOAL_RSS_GROWTH_MB:.0f}: {verdict})"
    )
    if recheck not in ("", "0", "off", "the default"):
        print(f"implied re-check load: {waiting / float(recheck):,.0f} segments/s")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
