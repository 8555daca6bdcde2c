"""Randomized soak: a mixed workload under random faults, then the fault suite's checker.

Run it from the repository root (PostgreSQL's server binaries in ``CLEAT_PG_BIN``, default
``/usr/lib/postgresql/15/bin``; nothing else: it makes a throwaway cluster of its own)::

    .venv/bin/python -m bench.soak                    # 5 minutes
    .venv/bin/python -m bench.soak --minutes 2 --seed 7

What it does:

1. creates a throwaway PostgreSQL cluster (``tests/integration/support/pgcluster.py``: its own
   directory and port; the machine's server is never touched), migrates it, and connects as
   the application role (row-level security on);
2. serves the idempotent HTTP ledger and puts the misbehaving TCP proxy
   (``support/netproxy.py``) in front of the cluster;
3. keeps three ``runworker`` processes alive, each started on a random footing: through the
   proxy or not, its clock skewed by up to +-30 s, and sometimes armed to crash at a random
   crash point (``engine.faults``) on a random hit; a dead worker is replaced at once;
4. meanwhile feeds the workload of ``support/faults.py`` (runs that call the ledger, start
   a child, sleep, wait for a signal, continue as new once), signals runs at random, and
   creates every-minute schedules;
5. every few seconds injects a random fault: SIGKILL a worker, SIGSTOP one past its lease
   and SIGCONT it, cut every connection, refuse new connections for a while, slow the
   network, partition a worker's network past its lease, restart the database (fast or as
   a crash);
6. stops the faults, lets a healthy worker finish every run, and runs the checker.

It prints the operations (runs started, signals sent, schedules, segments, ledger calls),
the faults injected by kind, and the violations the checker found, which must be 0 (the
exit code is 1 otherwise).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEASE_S = 3.0
WORKERS = 3
CRASH_POINTS = (
    "after_call",
    "after_append",
    "finalize",
    "continue_as_new",
    "child_start",
    "schedule_fire",
    "before_wake",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long faults go on")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--fault-every", type=float, default=4.0, help="mean seconds")
    parser.add_argument("--keep-logs", action="store_true", help="print the log folder")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    from tests.integration.support.pgcluster import throwaway_cluster

    with throwaway_cluster() as cluster:
        env = dict(
            os.environ,
            DJANGO_SETTINGS_MODULE="cleat_project.settings",
            DATABASE_URL=cluster.url(),
            DEBUG="1",
        )
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v0"], env=env, check=True
        )
        os.environ.update(
            DJANGO_SETTINGS_MODULE="cleat_project.settings",
            DATABASE_URL=cluster.url(user="cleat_app"),
            DEBUG="1",
        )
        import django

        django.setup()
        return _soak(cluster, rng, seed, args)


def _soak(cluster: object, rng: random.Random, seed: int, args: argparse.Namespace) -> int:
    from django.db import OperationalError, close_old_connections, connection
    from django.utils import timezone

    from tests.integration.support.faults import Workload, check, unfinished
    from tests.integration.support.ledger import Ledger
    from tests.integration.support.netproxy import FaultyProxy
    from tests.integration.support.processes import WorkerProcess, command_env
    from workflows.models import DEFAULT_TENANT_ID, Tenant

    logs = Path(tempfile.mkdtemp(prefix="cleat-soak-"))
    faults: Counter[str] = Counter()
    ops: Counter[str] = Counter()
    started_at = time.monotonic()
    port = cluster.port  # type: ignore[attr-defined]
    direct = cluster.url(user="cleat_app")  # type: ignore[attr-defined]

    def retrying(fn: object, *a: object) -> object:
        for _ in range(60):
            try:
                return fn(*a)  # type: ignore[operator]
            except OperationalError:
                connection.close()
                time.sleep(0.5)
        raise RuntimeError("the database stayed away for 30 s")

    with (
        Ledger().serving() as ledger,
        FaultyProxy("127.0.0.1", port).serving() as proxy,
    ):
        proxied = direct.replace(f":{port}/", f":{proxy.port}/")
        tenant = Tenant.objects.get(id=DEFAULT_TENANT_ID)
        workload = Workload(tenant)
        schedules: list[str] = []
        workers: dict[str, tuple[WorkerProcess, bool]] = {}
        serial = 0

        def spawn(healthy: bool = False) -> None:
            nonlocal serial
            serial += 1
            name = f"w{serial}"
            through_proxy = not healthy and rng.random() < 0.6
            # The re-check of waiting runs (an hour by default) is what recovers a wake-up lost
            # to a worker dying between a child's commit and its wake of the parent.
            extra = {
                "DATABASE_URL": proxied if through_proxy else direct,
                "CLEAT_WAIT_RECHECK_SECONDS": "5",
            }
            if not healthy:
                skew = rng.choice((0, 0, 30, -30, rng.uniform(-30, 30)))
                if skew:
                    extra["CLEAT_TEST_CLOCK_OFFSET_SECONDS"] = f"{skew:.1f}"
                    faults["skewed worker"] += 1
                if rng.random() < 0.5:
                    point = rng.choice(CRASH_POINTS)
                    extra["CLEAT_TEST_CRASH_AT"] = f"{point}:{rng.randint(1, 12)}"
            env = command_env({"ledger": ledger.url}, **extra)
            args_ = ["--worker-id", name, "--poll-interval", "0.2", "--lease", str(LEASE_S)]
            workers[name] = (WorkerProcess(logs / f"{name}.log", args_, env), through_proxy)

        def reap_dead() -> None:
            for name, (w, _) in list(workers.items()):
                code = w.proc.poll()
                if code is None:
                    continue
                if code == 70:
                    point = w.log().split("event=crash_point point=", 1)[-1].split()[0]
                    faults[f"crash at {point}"] += 1
                w.close()
                del workers[name]
                spawn()

        for _ in range(WORKERS):
            spawn()
        deadline = started_at + args.minutes * 60
        next_fault = time.monotonic() + rng.expovariate(1 / args.fault_every)
        runs: list[str] = []
        while time.monotonic() < deadline:
            close_old_connections()
            reap_dead()
            if unfinished_safe(unfinished, tenant, connection) < 40:
                runs += retrying(workload.start_jobs, rng.randint(1, 4))  # type: ignore[operator]
                ops["runs started"] = workload.started
            for run in rng.sample(runs, min(len(runs), 2)):
                if retrying(workload.signal, run):
                    ops["signals sent"] += 1
            if len(schedules) < 6 and rng.random() < 0.02:
                schedules += retrying(  # type: ignore[operator]
                    workload.create_schedules, 1, timezone.now(), f"soak{len(schedules)}"
                )
                ops["schedules"] = len(schedules)
            if time.monotonic() >= next_fault:
                inject(rng, workers, proxy, cluster, faults, connection)
                next_fault = time.monotonic() + rng.expovariate(1 / args.fault_every)
            time.sleep(0.5)
        # Faults off: a healthy worker joins, and the rest are stopped.
        proxy.resume()
        proxy.drop(False)
        proxy.delay(0)
        spawn(healthy=True)
        healer = f"w{serial}"
        for name, (w, _) in list(workers.items()):
            if name != healer:
                w.close()
                del workers[name]
        settle = time.monotonic()
        while unfinished_safe(unfinished, tenant, connection) != 0:
            if time.monotonic() - settle > 180:
                break
            time.sleep(0.5)
        healer_proc = workers[healer][0]
        healer_proc.terminate()
        healer_proc.wait(60)
        segments = sum(
            log.read_text(errors="replace").count("event=segment ") for log in logs.glob("*.log")
        )
        ops["segments"] = segments
        report = check(tenant, ledger, schedules)
        ops["ledger calls (requests)"] = sum(ledger.requests.values())
        ops["ledger effects"] = len(ledger.entries)
        ops["schedule firings"] = report.firings
        ops["runs checked"] = report.runs
        ops["events checked"] = report.events
    minutes = (time.monotonic() - started_at) / 60
    print(f"\nsoak: seed {seed}, {minutes:.1f} min ({args.minutes:g} of faults), logs {logs}")
    print("operations:")
    for name, count in ops.items():
        print(f"  {name:28s} {count}")
    print(f"faults injected: {sum(faults.values())}")
    for name, count in sorted(faults.items()):
        print(f"  {name:28s} {count}")
    print(f"violations: {len(report.violations)}")
    for violation in report.violations[:30]:
        print(f"  {violation}")
    return 1 if report.violations else 0


def unfinished_safe(unfinished: object, tenant: object, connection: object) -> int:
    from django.db import OperationalError

    try:
        return int(unfinished(tenant))  # type: ignore[operator]
    except OperationalError:
        connection.close()  # type: ignore[attr-defined]
        return -1


def inject(
    rng: random.Random,
    workers: dict[str, tuple[object, bool]],
    proxy: object,
    cluster: object,
    faults: Counter[str],
    connection: object,
) -> None:
    kind = rng.choice(
        ("kill", "stop", "cut", "drop", "delay", "partition", "restart", "restart", "kill")
    )
    names = list(workers)
    if kind == "kill" and names:
        w, _ = workers[rng.choice(names)]
        os.kill(w.proc.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    elif kind == "stop" and names:
        w, _ = workers[rng.choice(names)]
        pid = w.proc.pid  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGSTOP)
        time.sleep(LEASE_S + rng.uniform(0.5, 2))
        os.kill(pid, signal.SIGCONT)
    elif kind == "cut":
        proxy.cut()  # type: ignore[attr-defined]
    elif kind == "drop":
        proxy.cut()  # type: ignore[attr-defined]
        proxy.drop(True)  # type: ignore[attr-defined]
        time.sleep(rng.uniform(0.5, 2))
        proxy.drop(False)  # type: ignore[attr-defined]
    elif kind == "delay":
        proxy.delay(rng.uniform(0.005, 0.05))  # type: ignore[attr-defined]
        time.sleep(rng.uniform(1, 4))
        proxy.delay(0)  # type: ignore[attr-defined]
    elif kind == "partition":
        proxy.pause()  # type: ignore[attr-defined]
        time.sleep(LEASE_S + rng.uniform(0.5, 2))
        proxy.resume()  # type: ignore[attr-defined]
    elif kind == "restart":
        connection.close()  # type: ignore[attr-defined]
        mode = rng.choice(("fast", "immediate"))
        cluster.restart(down_s=rng.uniform(0.2, 2), mode=mode)  # type: ignore[attr-defined]
        kind = f"restart ({mode})"
    else:
        return
    faults[kind] += 1


if __name__ == "__main__":
    sys.exit(main())
