"""Celery benchmark: durable calls to Celery tasks against calls to in-process Python
services, on PostgreSQL, with ``runworker`` processes running the segments.

Run it from the repository root (PostgreSQL reachable as a superuser, a broker)::

    .venv/bin/python -m bench.celery_bench                        # about 5 minutes
    .venv/bin/python -m bench.celery_bench --workflows 50 --processes 1,2 --broker redis://...
    .venv/bin/python -m bench.celery_bench --only-dispatch --workflows 400   # part 3 only

What it measures (one run each):

1. **steps/s**: ``--workflows`` runs of ``--steps`` durable calls each (the store benchmark's
   workload, ``bench.echo``), first with ``bench`` an in-process Python service answering at
   once, then with ``bench`` bound to the Celery task ``bench.celery_bench.echo`` (answering
   at once, run by one Celery worker with ``--celery-concurrency`` threads); with 1, 2 and 4
   ``runworker`` processes (``--processes``) of ``--concurrency`` threads. Time from the
   workers' spawn to the last run's ``completed_at``.
2. **worker threads held while a 1 s call runs**: ``--slow-runs`` runs each make one call
   that takes one second (a Python service sleeping; a Celery task sleeping), against one
   ``runworker``; every 20 ms the benchmark counts the runs whose status is ``running``
   (a running run is a segment on a worker thread) and integrates: thread-seconds held per
   call. A blocking call holds its thread the whole second; the goal for a Celery call is
   0 beyond its segments' own time (the run suspends while the task runs).

3. **dispatch** (``--dispatch``, or ``--only-dispatch``): the same steps workload with the
   in-process service, run by the database-polling worker (``runworker --processes N``)
   and by dispatch on the broker (``CLEAT_DISPATCH=celery``: N Celery worker processes of
   ``--concurrency`` threads each on ``cleat.<task queue>``, Celery beat sending the
   maintenance task, whose sweep publishes the runs started before the workers), with 1, 2
   and 4 processes. Time from the spawn to the last ``completed_at``, and from the first
   claim.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import shared_task

from bench.store_bench import ROOT, SERVICE_TARGET, Cleat, Server, _databases, _ints, _load

SLOW_SECONDS = 1.0


@shared_task(name="bench.celery_bench.echo")
def echo(request: Any, idempotency_key: str = "") -> dict[str, Any]:
    """The Celery twin of ``bench.store_bench.echo``: answers at once."""
    return {}


@shared_task(name="bench.celery_bench.slow.echo")
def slow_echo(request: Any, idempotency_key: str = "") -> dict[str, Any]:
    time.sleep(SLOW_SECONDS)
    return {}


def _sleeping_echo(request: Any, *, idempotency_key: str, context: Any) -> dict[str, Any]:
    time.sleep(SLOW_SECONDS)
    return {}


class Slow:
    """In-process service ``bench.celery_bench.Slow``: ``echo`` takes a second."""

    echo = staticmethod(_sleeping_echo)


@dataclass
class Figure:
    kind: str  # "in-process" or "celery"
    processes: int
    steps_per_s: float  # from the runworker spawn (its start-up included)
    busy_steps_per_s: float  # from the first claim
    ok: bool


def celery_worker(
    cleat: Cleat, queue: str, concurrency: int, log: Path, name: str = "bench"
) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 -- closed with the process
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "cleat_project",
            "worker",
            "-Q",
            queue,
            "-n",  # one node name each: a shared one collides on the remote-control queue
            f"{name}-{uuid.uuid4().hex[:6]}@%h",
            "-P",
            "threads",
            "-c",
            str(concurrency),
            "-I",
            "bench.celery_bench",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "WARNING",
        ],
        cwd=ROOT,
        env=cleat.env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=10)


def wait_done(cleat: Cleat, count: int, timeout_s: float) -> bool:
    from django.db import connections

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cleat.summary()["done"] == count:
            connections.close_all()
            return True
        time.sleep(0.5)
    return False


def throughput(
    cleat: Cleat, kind: str, workflows: int, steps: int, processes: int, concurrency: int
) -> Figure:
    from django.db import connections
    from django.utils import timezone

    cleat.reset()
    cleat.start_many(workflows, steps)
    connections.close_all()
    spawn = timezone.now()
    worker = cleat.runworker(
        "--processes",
        str(processes),
        "--concurrency",
        str(concurrency),
        "--poll-interval",
        "0.2",
        log=f"{kind}-p{processes}.log",
    )
    try:
        ok = wait_done(cleat, workflows, 1800)
    finally:
        stop(worker)
    info = cleat.summary()
    last = info["last_done"] or timezone.now()
    busy = (last - info["first_claim"]).total_seconds() if info["first_claim"] else 0.0
    total = workflows * steps
    return Figure(
        kind, processes, total / (last - spawn).total_seconds(), total / busy if busy else 0, ok
    )


def celery_beat(cleat: Cleat, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 -- closed with the process
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "cleat_project",
            "beat",
            "-s",
            str(log.with_suffix(".schedule")),
            "--pidfile=",
            "-l",
            "WARNING",
        ],
        cwd=ROOT,
        env=cleat.env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def dispatched(
    cleat: Cleat, workflows: int, steps: int, processes: int, concurrency: int, logdir: Path
) -> Figure:
    """The steps workload run by ``processes`` Celery workers in broker dispatch (the runs
    are published by beat's sweep: they were started before the workers)."""
    from django.db import connections
    from django.utils import timezone

    from workflows.services import start_workflow

    cleat.reset()
    task_queue = f"bench{uuid.uuid4().hex[:8]}"
    for _ in range(workflows):
        start_workflow(cleat.tenant, "bench_steps", steps, task_queue=task_queue)
    connections.close_all()
    maintenance = f"cleat.{task_queue}.maintenance"
    env = cleat.env
    cleat.env = {
        **env,
        "CLEAT_DISPATCH": "celery",
        "CLEAT_MAINTENANCE_ON_BEAT": "1",
        "CLEAT_MAINTENANCE_QUEUE": maintenance,
        "CLEAT_BEAT_INTERVAL_SECONDS": "0.2",
        "CLEAT_DISPATCH_SWEEP_SECONDS": "0.2",
    }
    spawn = timezone.now()
    procs = [
        celery_worker(
            cleat,
            f"cleat.{task_queue},{maintenance}",
            concurrency,
            logdir / f"dispatch-p{processes}-{i}.log",
            name=f"dispatch{i}",
        )
        for i in range(processes)
    ]
    procs.append(celery_beat(cleat, logdir / f"dispatch-p{processes}-beat.log"))
    cleat.env = env
    try:
        ok = wait_done(cleat, workflows, 1800)
    finally:
        for proc in procs:
            stop(proc)
    info = cleat.summary()
    last = info["last_done"] or timezone.now()
    busy = (last - info["first_claim"]).total_seconds() if info["first_claim"] else 0.0
    total = workflows * steps
    return Figure(
        "dispatch",
        processes,
        total / (last - spawn).total_seconds(),
        total / busy if busy else 0,
        ok,
    )


def threads_held(cleat: Cleat, runs: int, concurrency: int, label: str) -> tuple[int, float]:
    """Thread-seconds held per call (the time-weighted count of runs ``running``, a segment
    on a worker thread, divided by the number of calls), and the most held at once. A call
    that suspends costs only its segments' time; one that blocks, its whole second."""
    from django.db import connections

    from workflows.models import RunStatus
    from workflows.tenancy import tenant_context

    cleat.reset()
    cleat.start_many(runs, 1)
    connections.close_all()
    worker = cleat.runworker(
        "--concurrency", str(concurrency), "--poll-interval", "0.2", log=f"held-{label}.log"
    )
    most = 0
    held_s = 0.0
    started = last = time.monotonic()
    try:
        while True:
            with tenant_context(cleat.tenant.id):
                counts = _status_counts()
            now = time.monotonic()
            running = counts.get(RunStatus.RUNNING, 0)
            held_s += running * (now - last)
            last = now
            most = max(most, running)
            if counts.get(RunStatus.DONE, 0) == runs or now - started > 300:
                break
            time.sleep(0.02)
    finally:
        stop(worker)
    return most, held_s / runs


def _status_counts() -> dict[str, int]:
    from django.db.models import Count

    from workflows.models import WorkflowInstance

    return {
        row["status"]: row["n"]
        for row in WorkflowInstance.objects.values("status").annotate(n=Count("id"))
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--pg",
        default=os.environ.get("CLEAT_BENCH_PG", "postgres://postgres@127.0.0.1:5432"),
        help="superuser URL of the PostgreSQL server (env CLEAT_BENCH_PG)",
    )
    parser.add_argument(
        "--broker",
        default=os.environ.get("CLEAT_BENCH_BROKER", "amqp://guest:guest@127.0.0.1:5672//"),
    )
    parser.add_argument("--workflows", type=int, default=100)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--processes", default="1,2,4", help="runworker process counts")
    parser.add_argument("--concurrency", type=int, default=4, help="segments per process")
    parser.add_argument("--celery-concurrency", type=int, default=16)
    parser.add_argument("--slow-runs", type=int, default=8)
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument(
        "--only-held", action="store_true", help="only the threads-held measure (part 2)"
    )
    parser.add_argument(
        "--dispatch", action="store_true", help="also dispatch on the broker against polling"
    )
    parser.add_argument(
        "--only-dispatch", action="store_true", help="only the dispatch measure (part 3)"
    )
    args = parser.parse_args(argv)

    server = Server(args.pg)
    db = f"cleat_celery_bench_{os.getpid()}"
    logdir = Path(tempfile.mkdtemp(prefix="cleat-celery-bench-"))
    queue = f"cleat-bench-{uuid.uuid4().hex[:8]}"
    processes = _ints(args.processes)
    print(
        f"celery benchmark: {args.workflows} workflows x {args.steps} steps; runworker "
        f"processes {processes} x {args.concurrency} threads; one Celery worker x "
        f"{args.celery_concurrency} threads on {args.broker}; load average {_load()}; "
        f"logs in {logdir}"
    )
    figures: list[Figure] = []
    held: dict[str, tuple[int, float]] = {}
    with _databases(server, [db], args.keep):
        cleat = Cleat(server, db, 0, logdir)
        cleat.prepare()
        base = dict(cleat.env)
        celery_env = {
            "CELERY_BROKER_URL": args.broker,
            "CLEAT_WAIT_RECHECK_SECONDS": "30",
        }
        services = {
            "in-process": {"bench": SERVICE_TARGET},
            "celery": {"bench": f"celery:bench.celery_bench?queue={queue}"},
        }
        slow_services = {
            "in-process": {"bench": "bench.celery_bench.Slow"},
            "celery": {"bench": f"celery:bench.celery_bench.slow?queue={queue}"},
        }
        cleat.env = {**base, **celery_env}
        workers = celery_worker(cleat, queue, args.celery_concurrency, logdir / "celery.log")
        try:
            time.sleep(5)  # the Celery worker connects
            only_other = args.only_held or args.only_dispatch
            for kind in () if only_other else ("in-process", "celery"):
                cleat.env = {**base, **celery_env, "CLEAT_SERVICES": json.dumps(services[kind])}
                for n in processes:
                    figure = throughput(
                        cleat, kind, args.workflows, args.steps, n, args.concurrency
                    )
                    figures.append(figure)
                    print(
                        f"  {kind:10} {n} process(es): {figure.steps_per_s:8.1f} steps/s from "
                        f"the spawn, {figure.busy_steps_per_s:8.1f} from the first claim"
                    )
            if args.dispatch or args.only_dispatch:
                cleat.env = {
                    **base,
                    **celery_env,
                    "CLEAT_SERVICES": json.dumps(services["in-process"]),
                }
                for n in processes:
                    for kind in ("poll", "dispatch"):
                        if kind == "poll":
                            figure = throughput(
                                cleat, "in-process", args.workflows, args.steps, n, args.concurrency
                            )
                            figure.kind = "poll"
                        else:
                            figure = dispatched(
                                cleat, args.workflows, args.steps, n, args.concurrency, logdir
                            )
                        figures.append(figure)
                        print(
                            f"  {kind:10} {n} process(es): {figure.steps_per_s:8.1f} steps/s "
                            f"from the spawn, {figure.busy_steps_per_s:8.1f} from the first "
                            f"claim; load average {_load()}"
                        )
            for kind in () if args.only_dispatch else ("in-process", "celery"):
                cleat.env = {
                    **base,
                    **celery_env,
                    "CLEAT_SERVICES": json.dumps(slow_services[kind]),
                }
                held[kind] = threads_held(cleat, args.slow_runs, args.concurrency, kind)
                print(
                    f"  {kind:10} 1 s calls: {held[kind][1]:.2f} thread-seconds held per call, "
                    f"at most {held[kind][0]} at once"
                )
        finally:
            stop(workers)
    print()
    print("steps/s from the workers' spawn (from the first claim):")
    print(f"| calls to | {' | '.join(f'{n} process(es)' for n in processes)} |")
    print(f"|---|{'---|' * len(processes)}")
    for kind in ("in-process", "celery", "poll", "dispatch"):
        row = [f for f in figures if f.kind == kind]
        if not row:
            continue
        cells = " | ".join(
            f"{f.steps_per_s:.1f} ({f.busy_steps_per_s:.1f}) steps/s"
            f"{'' if f.ok else ' (NOT all done)'}"
            for f in row
        )
        print(f"| {kind} | {cells} |")
    print()
    print(
        f"worker threads held while {args.slow_runs} calls of 1 s run (runworker x "
        f"{args.concurrency} threads; goal for Celery: 0):"
    )
    for kind, (most, per_call) in held.items():
        print(f"  {kind:10}: {per_call:.2f} thread-seconds per call; at most {most} at once")


if __name__ == "__main__":
    main()
