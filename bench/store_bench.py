"""Store benchmark: persistence and the dispatch worker on PostgreSQL, next to DBOS Transact
and pgbench on the same server.

Run it from the repository root (PostgreSQL reachable as a superuser, ``pgbench`` on PATH;
``pip install -r bench/requirements.txt`` for the DBOS comparison)::

    .venv/bin/python -m bench.store_bench                       # everything, a few minutes
    .venv/bin/python -m bench.store_bench --no-dbos --latency-runs 50
    .venv/bin/python -m bench.store_bench --only profile        # where one step's time goes
    .venv/bin/python -m bench.store_bench --only breakdown      # where a start -> done goes
    .venv/bin/python -m bench.store_bench --only throughput --encryption compare

What it does (``bench/README.md``, section "Store benchmark", has the details):

1. creates a fresh database, migrates it as the superuser, and from then on connects as the
   application role ``cleat_app``, so row-level security applies as in production;
2. throughput: inserts 1,000 starts of a workflow that makes 10 durable calls to a Python
   service returning at once, then starts ``manage.py runworker --burst --processes N
   --concurrency C`` and times from the spawn until the last run's ``completed_at``
   (N = 1, then 2; the tables are emptied in between);
3. latency: a long-running ``runworker`` (LISTEN/NOTIFY) and ~200 sequential starts of a
   one-step workflow, each awaited; ``completed_at - created_at`` of the rows;
4. the same throughput workload as a Python workflow (``python_bench``'s ``STEPS_PY``,
   deployed as ``bench_steps_py``), one process, against the core module's figure;
5. the same throughput workload on DBOS Transact (``bench/dbos_workload.py``, its own
   database) and pgbench's single-client one-row INSERT rate on a one-table database;
6. a final table with the goals. ``--only profile`` runs segments in this process, one after
   another, and prints the SQL each step issues and a cProfile summary. ``--only breakdown``
   runs the latency workload against a worker whose loop is wrapped with timing hooks and
   prints each phase of a start -> done (the start's commit, the NOTIFY, the claim, the
   hand-off, the load, the segment, the finalize), the round trips and the GC pauses.

``--encryption on`` runs the workers with encryption at rest (``CLEAT_ENCRYPTION_KEYS``, a
fresh key); ``--encryption compare`` runs the throughput workload ``--compare-rounds`` times
each way, interleaved (off, on, on, off, ...: a machine whose load drifts weighs on both),
and prints the median steps/s of each and the cost of encryption.

Every database it creates is dropped at the end (``--keep`` keeps them).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import itertools
import json
import os
import platform
import pstats
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench import engine_bench

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
SERVICE_TARGET = "bench.store_bench.echo"

# Issue 16's goals (bench/README.md keeps the table of what was measured against them).
GOAL_VS_DBOS = 5.0  # cleat steps/s / DBOS steps/s, with one process and with two
GOAL_VS_PGBENCH = 1.0  # cleat steps/s per worker process / pgbench inserts/s
GOAL_P50_MS = 5.0
GOAL_P99_MS = 15.0
GOAL_SCALING = 1.3  # steps/s of two worker processes / one's
GOAL_PYTHON_VS_WAT = 0.5  # steps/s of the 10-step workload as Python / as a core module
PYTHON_DEFINITION = "bench_steps_py"


def echo(request: Any, *, idempotency_key: str, context: Any) -> dict[str, Any]:
    """The benchmark's service: returns at once (``CLEAT_SERVICES={"bench": ...}``)."""
    return {}


# N durable calls of bench.echo("{}"), N the decimal input; the result is `true`.
# The same N-step workload as the engine benchmark (one durable_call per step).
STEPS_WAT = engine_bench.STEPS_WAT


# --- PostgreSQL plumbing -----------------------------------------------------------------------


@dataclass
class Server:
    """The PostgreSQL server, reached as a superuser (``--pg``)."""

    url: str

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = str(parts.port or 5432)
        self.user = parts.username or "postgres"
        self.env = {**os.environ}
        if parts.password:
            self.env["PGPASSWORD"] = parts.password

    def db_url(self, db: str, user: str | None = None, query: str = "") -> str:
        parts = urlsplit(self.url)
        netloc = f"{user or self.user}@{self.host}:{self.port}"
        if parts.password and user is None:
            netloc = f"{self.user}:{parts.password}@{self.host}:{self.port}"
        return urlunsplit(("postgres", netloc, f"/{db}", query, ""))

    def _args(self) -> list[str]:
        return ["-h", self.host, "-p", self.port, "-U", self.user]

    def psql(self, db: str, sql: str) -> str:
        out = subprocess.run(
            ["psql", *self._args(), "-d", db, "-v", "ON_ERROR_STOP=1", "-tAc", sql],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    def create(self, db: str) -> None:
        self.drop(db)
        subprocess.run(["createdb", *self._args(), db], env=self.env, check=True)

    def drop(self, db: str) -> None:
        subprocess.run(
            ["dropdb", *self._args(), "--if-exists", "--force", db],
            env=self.env,
            check=True,
            capture_output=True,
        )

    def setting(self, name: str) -> str:
        return self.psql("postgres", f"SHOW {name}")


# --- the cleat side -------------------------------------------------------------------------------


@dataclass
class Cleat:
    server: Server
    db: str
    conn_max_age: int
    logdir: Path
    app_url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    # "wat": the steps workload as a core module; "python": as a Python workflow
    # (python_bench's STEPS_PY), deployed under the same name.
    workload: str = "wat"
    # Also deploy the workload as a Python workflow under PYTHON_DEFINITION.
    python_too: bool = False
    # The workers' --claim-ahead: runworker's default, or a number to compare with.
    claim_ahead: str = "auto"

    def prepare(self) -> None:
        """Create and migrate the database (as the owner); configure Django in this process
        as the application role."""
        self.server.create(self.db)
        owner_env = {
            **self.server.env,
            "DEBUG": "1",
            "DATABASE_URL": self.server.db_url(self.db),
        }
        subprocess.run(
            [PYTHON, "manage.py", "migrate", "-v", "0"],
            cwd=ROOT,
            env=owner_env,
            check=True,
        )
        query = f"conn_max_age={self.conn_max_age}" if self.conn_max_age else ""
        self.app_url = self.server.db_url(self.db, user="cleat_app", query=query)
        self.env = {
            **os.environ,
            "DATABASE_URL": self.app_url,
            "DEBUG": "0",
            "SECRET_KEY": "store-bench-" + uuid.uuid4().hex,
            "CLEAT_SERVICES": json.dumps({"bench": SERVICE_TARGET}),
            "DJANGO_SETTINGS_MODULE": "cleat_project.settings",
            "PYTHONPATH": str(ROOT),
        }
        os.environ.update(
            {k: self.env[k] for k in ("DATABASE_URL", "DEBUG", "SECRET_KEY", "CLEAT_SERVICES")}
        )
        os.environ["DJANGO_SETTINGS_MODULE"] = "cleat_project.settings"
        import django

        django.setup()
        import wasmtime

        from workflows.definitions import deploy_definition
        from workflows.models import DEFAULT_TENANT_ID
        from workflows.services import get_tenant

        self.tenant = get_tenant(str(DEFAULT_TENANT_ID))
        if self.workload == "python" or self.python_too:
            from bench.python_bench import build_steps_component

            component = build_steps_component()[0]
            if self.python_too:
                deploy_definition(self.tenant, PYTHON_DEFINITION, component)
        if self.workload == "python":
            deploy_definition(self.tenant, "bench_steps", component)
        else:
            deploy_definition(self.tenant, "bench_steps", wasmtime.wat2wasm(STEPS_WAT))

    def set_encryption(self, on: bool) -> None:
        """Encryption at rest on or off, for the workers and for this process's starts."""
        import base64

        from django.conf import settings

        from workflows import crypto

        keys = json.dumps({"bench": base64.b64encode(os.urandom(32)).decode()}) if on else ""
        self.env["CLEAT_ENCRYPTION_KEYS"] = keys
        self.env["CLEAT_ENCRYPTION_KEY_ID"] = ""
        settings.CLEAT_ENCRYPTION_KEYS = keys
        settings.CLEAT_ENCRYPTION_KEY_ID = ""
        crypto.reset()

    def reset(self) -> None:
        """Empty the run tables (as the owner) between rounds."""
        from django.db import connections

        connections.close_all()
        self.server.psql(
            self.db,
            "TRUNCATE workflows_workflowevent, workflows_signal, workflows_updaterequest, "
            "workflows_promise, workflows_workflowinstance CASCADE",
        )
        for table in ("workflows_workflowinstance", "workflows_workflowevent"):
            self.server.psql(self.db, f"VACUUM ANALYZE {table}")

    def analyze(self) -> None:
        """Statistics for the run tables as they are now (as pgbench vacuums before its run).
        A database in use has them (autovacuum analyzes a table within a minute of its rows
        changing); the tables just filled from empty have none, and without them the planner
        read a claimed run's instance through its tenant's index instead of its primary key
        (every run of the tenant, for each claimed run): about twice the server's CPU per
        step (bench/README.md, seventh pass)."""
        for table in ("workflows_workflowinstance", "workflows_workflowevent"):
            self.server.psql(self.db, f"ANALYZE {table}")

    def start_many(self, count: int, steps: int, definition: str = "bench_steps") -> None:
        from workflows.services import start_workflow

        for _ in range(count):
            start_workflow(self.tenant, definition, steps)

    def runworker(
        self, *args: str, log: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        out = open(self.logdir / log, "ab")  # noqa: SIM115 -- closed with the process
        return subprocess.Popen(
            [PYTHON, "manage.py", "runworker", *args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def summary(self) -> dict[str, Any]:
        from django.db.models import Count, Max, Min, Q, Sum

        from workflows.models import RunStatus, WorkflowEvent, WorkflowInstance
        from workflows.tenancy import tenant_context

        with tenant_context(self.tenant.id):
            agg = WorkflowInstance.objects.aggregate(
                runs=Count("id"),
                done=Count("id", filter=Q(status=RunStatus.DONE)),
                events=Sum("event_count"),
                first_claim=Min("started_at"),
                last_done=Max("completed_at"),
            )
            agg["event_rows"] = WorkflowEvent.objects.count()
        return agg


@dataclass
class Throughput:
    system: str
    processes: int
    concurrency: int
    workflows: int
    steps: int
    wall_s: float  # from the workers' spawn until the last run completed
    busy_s: float  # from the first claim until the last run completed
    ok: bool
    note: str = ""
    # CPU seconds spent on the run: by the worker processes, and by the local PostgreSQL
    # server (NaN when it is not local)
    worker_cpu_s: float = float("nan")
    database_cpu_s: float = float("nan")
    # What the server wrote meanwhile (the whole cluster's, as pg_stat_wal counts it): WAL
    # records and bytes, and MultiXacts made. Counts, unlike the CPU seconds, compare across
    # runs on a machine whose speed varies from one minute to the next.
    wal: ServerCounters | None = None
    # The worker processes' context switches (voluntary and not): a count too. On a worker
    # of many threads most are its threads handing the GIL to one another.
    context_switches: int | None = None

    @property
    def steps_per_s(self) -> float:
        return self.workflows * self.steps / self.wall_s

    @property
    def total_steps(self) -> int:
        return self.workflows * self.steps

    @property
    def workflows_per_s(self) -> float:
        return self.workflows / self.wall_s

    @property
    def busy_steps_per_s(self) -> float:
        return self.workflows * self.steps / self.busy_s if self.busy_s else 0.0


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command is in parentheses and may hold spaces: the fields after it are plain
    head, _, rest = text.rpartition(")")
    return [head.partition("(")[2], *rest.split()]


def database_cpu_seconds() -> float:
    """CPU seconds the local PostgreSQL server has used: its live processes, plus the
    backends that have exited (counted in the postmaster's children times). NaN when no
    ``postgres`` process is visible (a remote server)."""
    total = 0
    seen = False
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    stats = {pid: _proc_stat(pid) for pid in pids}
    postgres = {pid for pid, st in stats.items() if st is not None and st[0] == "postgres"}
    for pid in postgres:
        st = stats[pid]
        assert st is not None
        # fields after the command: state ppid ... utime(12) stime(13) cutime(14) cstime(15)
        total += int(st[12]) + int(st[13])
        if st[2] not in postgres:  # the postmaster: add the exited backends
            total += int(st[14]) + int(st[15])
        seen = True
    return total / _CLOCK_TICKS if seen else float("nan")


def process_cpu_seconds(pids: Iterable[int]) -> float:
    """User and system CPU seconds the live processes ``pids`` have used."""
    total = 0
    for pid in pids:
        st = _proc_stat(str(pid))
        if st is not None:
            total += int(st[12]) + int(st[13])
    return total / _CLOCK_TICKS


@dataclass(frozen=True)
class ServerCounters:
    wal_records: int
    wal_bytes: int
    multixacts: int

    @classmethod
    def read(cls, server: Server) -> ServerCounters:
        # mxid_age of MultiXact 1 is the cluster's next MultiXact id less one: a counter
        records, size, multixacts = server.psql(
            "postgres",
            "SELECT wal_records, wal_bytes::bigint, mxid_age('1'::xid) FROM pg_stat_wal",
        ).split("|")
        return cls(int(records), int(size), int(multixacts))

    def __sub__(self, other: ServerCounters) -> ServerCounters:
        return ServerCounters(
            self.wal_records - other.wal_records,
            self.wal_bytes - other.wal_bytes,
            self.multixacts - other.multixacts,
        )


def children_cpu_seconds() -> float:
    """CPU seconds of this process's waited-for children (and theirs)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def children_context_switches() -> int:
    """Context switches of this process's waited-for children (and theirs)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_nvcsw + usage.ru_nivcsw


def cleat_throughput(
    cleat: Cleat,
    workflows: int,
    steps: int,
    processes: int,
    concurrency: int,
    definition: str = "bench_steps",
) -> Throughput:
    from django.db import connections
    from django.utils import timezone

    cleat.reset()
    cleat.start_many(workflows, steps, definition)
    connections.close_all()
    cleat.analyze()
    database_cpu, worker_cpu = database_cpu_seconds(), children_cpu_seconds()
    switches = children_context_switches()
    wal = ServerCounters.read(cleat.server)
    spawn = timezone.now()
    proc = cleat.runworker(
        "--processes",
        str(processes),
        "--concurrency",
        str(concurrency),
        "--claim-ahead",
        cleat.claim_ahead,
        "--burst",
        log=f"{definition}-throughput-p{processes}-c{concurrency}.log",
    )
    code = proc.wait(timeout=1800)
    database_cpu = database_cpu_seconds() - database_cpu
    worker_cpu = children_cpu_seconds() - worker_cpu
    switches = children_context_switches() - switches
    wal = ServerCounters.read(cleat.server) - wal
    info = cleat.summary()
    ok = (
        code == 0
        and info["done"] == workflows
        and info["events"] == workflows * steps
        and info["event_rows"] == workflows * steps
    )
    last = info["last_done"] or timezone.now()
    return Throughput(
        "cleat-py" if definition == PYTHON_DEFINITION else "cleat",
        processes,
        concurrency,
        workflows,
        steps,
        (last - spawn).total_seconds(),
        (last - info["first_claim"]).total_seconds() if info["first_claim"] else 0.0,
        ok,
        "" if ok else f"exit {code}, {info}",
        worker_cpu,
        database_cpu,
        wal,
        switches,
    )


@dataclass
class Latency:
    samples_ms: list[float]  # completed_at - created_at of the rows
    observed_ms: list[float] = field(default_factory=list)  # start call -> done seen by a poll

    def pct(self, p: float, observed: bool = False) -> float:
        data = sorted(self.observed_ms if observed else self.samples_ms)
        if not data:
            return float("nan")
        k = (len(data) - 1) * p / 100
        lo, hi = int(k), min(int(k) + 1, len(data) - 1)
        return data[lo] + (data[hi] - data[lo]) * (k - lo)


def await_done(cleat: Cleat, run_id: Any, what: str) -> tuple[Any, Any]:
    """Poll a run's row every 2 ms until it is done: its (created_at, completed_at)."""
    from workflows.models import RunStatus, WorkflowInstance
    from workflows.tenancy import tenant_context

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with tenant_context(cleat.tenant.id):
            row = (
                WorkflowInstance.objects.filter(id=run_id)
                .values_list("status", "created_at", "completed_at")
                .get()
            )
        if row[0] == RunStatus.DONE:
            return row[1], row[2]
        if row[0] not in (RunStatus.READY, RunStatus.RUNNING):
            raise RuntimeError(f"{what} run ended {row[0]}")
        time.sleep(0.002)
    raise RuntimeError(f"{what} run not done after 30 s")


def cleat_latency(
    cleat: Cleat,
    runs: int,
    concurrency: int,
    definition: str = "bench_steps",
    env: dict[str, str] | None = None,
) -> Latency:
    from django.db import connections

    from workflows.services import start_workflow

    cleat.reset()
    worker = cleat.runworker("--concurrency", str(concurrency), log="cleat-latency.log", env=env)

    def one() -> tuple[float, float]:
        began = time.perf_counter()
        instance, _ = start_workflow(cleat.tenant, definition, 1)
        created, completed = await_done(cleat, instance.id, "latency")
        seen = (time.perf_counter() - began) * 1000
        return (completed - created).total_seconds() * 1000, seen

    try:
        for _ in range(5):  # warm-up: the worker's start-up, module compile, connections
            one()
        cleat.analyze()
        time.sleep(1.0)
        samples, observed = [], []
        for _ in range(runs):
            row_ms, seen_ms = one()
            samples.append(row_ms)
            observed.append(seen_ms)
            time.sleep(0.02)  # idle system: the worker is back in LISTEN
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
        connections.close_all()
    return Latency(samples, observed)


def python_latency(cleat: Cleat, runs: int, concurrency: int, rounds: int) -> None:
    """`--only python-latency`: start -> done of a 1-step Python workflow (python_bench's
    STEPS_PY) through the PostgreSQL worker, with ready instances (CLEAT_READY_INSTANCES=2)
    and without (0), rounds interleaved: each of its two segments (the call, then the end)
    instantiates the component, or takes an instance made ahead."""
    from bench.python_bench import build_steps_component
    from workflows.definitions import deploy_definition

    wasm, _ = build_steps_component()
    deploy_definition(cleat.tenant, "bench_py_steps", wasm)
    samples: dict[int, list[float]] = {0: [], 2: []}
    for _ in range(rounds):
        for ready in samples:
            latency = cleat_latency(
                cleat,
                runs,
                concurrency,
                definition="bench_py_steps",
                env={"CLEAT_READY_INSTANCES": str(ready)},
            )
            samples[ready] += latency.samples_ms
            print(
                f"python latency, ready instances {ready}: p50 {latency.pct(50):.2f} ms, "
                f"p99 {latency.pct(99):.2f} ms [load {_load()}]",
                flush=True,
            )
    for ready, unsorted in samples.items():
        values = sorted(unsorted)
        print(
            f"python latency, ready instances {ready}, all rounds: "
            f"p50 {_percentile(values, 50):.2f} ms, p90 {_percentile(values, 90):.2f} ms, "
            f"p99 {_percentile(values, 99):.2f} ms ({len(values)} runs)",
            flush=True,
        )


# --- where the latency goes --------------------------------------------------------------------
# `--only breakdown`: the latency workload with a worker whose functions are wrapped to note
# the wall clock (time.time(), comparable across the two processes) at each phase, and every
# SQL statement, commit and health check on each thread. The wrappers cost a few hundred
# microseconds per run, so the phases add up to a little more than the plain latency run.

BREAKDOWN_PHASES = (
    # (label, from mark, to mark)
    ("start: created_at -> commit (client)", "created", "committed"),
    ("commit -> NOTIFY received (listener)", "committed", "notified"),
    ("NOTIFY -> claim sent (loop wakes)", "notified", "claim>"),
    ("claim and its loads (one message, commit)", "claim>", "claim<"),
    ("claim -> segment thread starts", "claim<", "exec>"),
    ("segment thread -> load sent", "exec>", "load>"),
    ("load (from the claim's rows)", "load>", "load<"),
    ("instantiate, run, the step's append", "segment>", "segment<"),
    ("finalize (incl. its commit)", "finalize>", "finalize<"),
    ("row latency: completed_at - created_at", "created", "completed"),
    ("created_at -> finalize committed", "created", "finalize<"),
)


def trace_worker(out_path: str, concurrency: int) -> None:
    """The production worker loop with timing wrappers (run in the worker process)."""
    import threading

    import django

    django.setup()
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.utils import CursorWrapper

    from engine.runtime import WasmRuntime
    from workflows import executor, worker

    out = open(out_path, "a", buffering=1)  # noqa: SIM115 -- the process's lifetime
    lock = threading.Lock()

    def note(ev: str, **kw: Any) -> None:
        kw.update(ev=ev, t=time.time(), th=threading.current_thread().name)
        with lock:
            out.write(json.dumps(kw, default=str) + "\n")

    def timed(owner: Any, name: str, ev: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kw)
            finally:
                note(ev, ms=(time.perf_counter() - started) * 1000)

        setattr(owner, name, wrapper)

    def phase(owner: Any, name: str, ev: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args: Any, **kw: Any) -> Any:
            note(ev + ">")
            try:
                return original(*args, **kw)
            finally:
                note(ev + "<")

        setattr(owner, name, wrapper)

    import gc

    gc_started: list[float] = []

    def gc_callback(phase_name: str, info: dict[str, Any]) -> None:
        if phase_name == "start":
            gc_started.append(time.perf_counter())
        elif gc_started:
            ms = (time.perf_counter() - gc_started.pop()) * 1000
            if ms >= 1.0:
                note("gc", ms=ms, generation=info.get("generation"))

    gc.callbacks.append(gc_callback)
    timed(CursorWrapper, "_execute", "sql")
    timed(BaseDatabaseWrapper, "commit", "sql")
    timed(BaseDatabaseWrapper, "connect", "connect")
    # Django's health check (a SELECT 1), overridden by each backend's wrapper class
    from django.db import connections

    timed(type(connections["default"]), "is_usable", "sql")
    phase(worker, "claim_ready_instances", "claim")
    phase(executor, "load_run", "load")
    phase(executor, "finalize_segment", "finalize")
    phase(WasmRuntime, "run_segment", "segment")
    execute = worker.Worker._execute

    def traced_execute(self: Any, claim: Any) -> Any:
        note("exec>", run=str(claim.id))
        try:
            return execute(self, claim)
        finally:
            note("exec<", run=str(claim.id))

    worker.Worker._execute = traced_execute  # type: ignore[method-assign]
    listener_init = worker._PgListener.__init__

    def traced_listener(self: Any, params: Any, listen: Any, wake: Any) -> None:
        def on_notify() -> None:
            note("notified")
            wake()

        listener_init(self, params, listen, on_notify)

    worker._PgListener.__init__ = traced_listener  # type: ignore[method-assign]
    # As runworker does: the worker's connection lifetime, not the web process's (0).
    from workflows.management.commands._common import use_worker_connection_age

    use_worker_connection_age()
    w = worker.Worker(worker.WorkerOptions(concurrency=concurrency))
    w.install_signal_handlers()
    w.run()


def cleat_breakdown(cleat: Cleat, runs: int, concurrency: int) -> None:
    from django.db import connections

    from workflows.services import start_workflow
    from workflows.store import wake

    cleat.reset()
    trace = cleat.logdir / "breakdown.jsonl"
    out = open(cleat.logdir / "cleat-breakdown.log", "ab")  # noqa: SIM115
    command = ["-m", "bench.store_bench", "--trace-worker", str(trace)]
    worker = subprocess.Popen(
        [PYTHON, *command, "--concurrency", str(concurrency)],
        cwd=ROOT,
        env=cleat.env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    from django.db import transaction

    committed: list[float] = []
    real_ready = wake.ready_after_commit

    def ready_after_commit(*args: Any, **kw: Any) -> None:  # the start's: its commit is marked
        real_ready(*args, **kw)
        transaction.on_commit(lambda: committed.append(time.time()))

    wake.ready_after_commit = ready_after_commit  # type: ignore[assignment]

    def one() -> dict[str, Any]:
        instance, _ = start_workflow(cleat.tenant, "bench_steps", 1)
        created, completed = await_done(cleat, instance.id, "breakdown")
        return {
            "run": str(instance.id),
            "created": created.timestamp(),
            "committed": committed[-1],
            "completed": completed.timestamp(),
            "seen": time.time(),
        }

    try:
        for _ in range(5):
            one()
        cleat.analyze()
        time.sleep(1.0)
        samples = []
        for _ in range(runs):
            samples.append(one())
            time.sleep(0.02)
    finally:
        wake.ready_after_commit = real_ready  # type: ignore[assignment]
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
        connections.close_all()
    events = sorted(
        (json.loads(line) for line in trace.read_text().splitlines()), key=lambda e: e["t"]
    )
    rows, trips = _breakdown_rows(samples, events)
    print(f"\n== latency breakdown: {len(rows)} of {runs} sequential 1-step runs, ms")
    print(f"   {'phase':42} {'p50':>7} {'p90':>7} {'p99':>7}")
    for label, start, end in BREAKDOWN_PHASES:
        values = sorted(r[end] - r[start] for r in rows if start in r and end in r)
        if values:
            pct = [_percentile(values, p) * 1000 for p in (50, 90, 99)]
            print(f"   {label:42} {pct[0]:7.2f} {pct[1]:7.2f} {pct[2]:7.2f}")
    for where, counts in trips.items():
        print(f"   round trips per run, {where}: {statistics.median(counts):.0f} (median)")
    if samples:
        window = (samples[0]["created"], samples[-1]["seen"])
        pauses = [e["ms"] for e in events if e["ev"] == "gc" and window[0] <= e["t"] <= window[1]]
        print(
            f"   worker GC pauses >= 1 ms during the runs: {len(pauses)}"
            + (f", longest {max(pauses):.1f} ms" if pauses else "")
        )
    marks = ["created", "committed", "notified", "claim>", "claim<", "exec>", "load>", "load<"]
    marks += ["segment>", "segment<", "completed", "finalize>", "finalize<"]
    slowest = sorted(rows, key=lambda r: r["created"] - r["completed"])[:3]
    for r in slowest:  # where the outliers' time went: each mark after the previous one
        known = [m for m in marks if m in r]
        steps = ", ".join(f"{b} +{(r[b] - r[a]) * 1000:.1f}" for a, b in itertools.pairwise(known))
        print(f"   slow run, {(r['completed'] - r['created']) * 1000:.1f} ms: {steps}")
    (cleat.logdir / "breakdown-runs.json").write_text(json.dumps(rows))


def _percentile(data: Sequence[float], p: float) -> float:
    k = (len(data) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def _breakdown_rows(
    samples: Sequence[dict[str, Any]], events: Sequence[dict[str, Any]]
) -> tuple[list[dict[str, float]], dict[str, list[int]]]:
    """Each sample's marks from the worker's trace: the first of each kind after the
    previous one, within the sample's window, on the run's segment thread for its phases."""
    rows: list[dict[str, float]] = []
    trips: dict[str, list[int]] = {"loop (NOTIFY -> claim)": [], "segment thread": []}
    for sample in samples:
        window = [e for e in events if sample["committed"] - 0.001 <= e["t"] <= sample["seen"]]
        marks: dict[str, float] = {k: sample[k] for k in ("created", "committed", "completed")}
        start = next((e for e in window if e["ev"] == "exec>" and e["run"] == sample["run"]), None)
        end = next((e for e in window if e["ev"] == "exec<" and e["run"] == sample["run"]), None)
        if start is None or end is None:
            continue
        after = sample["committed"]
        for ev in ("notified", "claim>", "claim<"):
            found = next((e for e in window if e["ev"] == ev and e["t"] >= after), None)
            if found is None:
                break
            marks[ev] = after = found["t"]
        thread = [e for e in window if e["th"] == start["th"] and start["t"] <= e["t"] <= end["t"]]
        marks["exec>"], after = start["t"], start["t"]
        for ev in ("load>", "load<", "segment>", "segment<", "finalize>", "finalize<"):
            found = next((e for e in thread if e["ev"] == ev and e["t"] >= after), None)
            if found is None:
                break
            marks[ev] = after = found["t"]
        if "notified" in marks and "claim<" in marks:
            trips["loop (NOTIFY -> claim)"].append(
                sum(
                    1
                    for e in window
                    if e["ev"] == "sql"
                    and e["th"] == "MainThread"
                    and marks["notified"] <= e["t"] <= marks["claim<"]
                )
            )
        trips["segment thread"].append(sum(1 for e in thread if e["ev"] == "sql"))
        rows.append(marks)
    return rows, trips


# --- the comparisons ---------------------------------------------------------------------------


def dbos_throughput(
    server: Server,
    db: str,
    workflows: int,
    steps: int,
    processes: int,
    concurrency: int,
    poll_s: float,
    logdir: Path,
) -> Throughput:
    server.create(db)
    url = server.db_url(db).replace("postgres://", "postgresql+psycopg://", 1)
    common = ["--url", url, "--workflows", str(workflows), "--concurrency", str(concurrency)]
    common += ["--poll", str(poll_s)]
    subprocess.run(
        [PYTHON, "-m", "bench.dbos_workload", "setup", *common, "--steps", str(steps)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    server.psql(db, "ANALYZE")  # as cleat's tables (Cleat.analyze)
    spawn_ms = time.time() * 1000
    procs = []
    for i in range(processes):
        out = open(logdir / f"dbos-p{processes}-w{i}.log", "ab")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [PYTHON, "-m", "bench.dbos_workload", "worker", *common, "--executor", f"w{i}"],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        )
    codes = [p.wait(timeout=1800) for p in procs]
    row = server.psql(
        db,
        "SELECT count(*) FILTER (WHERE status = 'SUCCESS'), min(started_at_epoch_ms), "
        "max(completed_at), (SELECT count(*) FROM dbos.operation_outputs) "
        "FROM dbos.workflow_status",
    ).split("|")
    done, first, last, outputs = int(row[0]), float(row[1]), float(row[2]), int(row[3])
    ok = not any(codes) and done == workflows and outputs == workflows * steps
    return Throughput(
        "dbos",
        processes,
        concurrency,
        workflows,
        steps,
        (last - spawn_ms) / 1000,
        (last - first) / 1000,
        ok,
        "" if ok else f"exits {codes}, {done} succeeded, {outputs} step outputs",
    )


def pgbench_inserts(server: Server, db: str, seconds: int, workdir: Path) -> float:
    server.create(db)
    server.psql(db, "CREATE TABLE t (id bigserial PRIMARY KEY, v text NOT NULL)")
    script = workdir / "insert.sql"
    script.write_text("INSERT INTO t (v) VALUES ('x');\n")
    out = subprocess.run(
        ["pgbench", *server._args(), "-n", "-c", "1", "-T", str(seconds), "-f", str(script), db],
        env=server.env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found = re.search(r"tps = ([0-9.]+)", out)
    if not found:
        raise RuntimeError(f"cannot read pgbench's output:\n{out}")
    return float(found.group(1))


# --- profile -----------------------------------------------------------------------------------


def _statement_kind(sql: str) -> str:
    text = " ".join(sql.split())
    head = text[:80].upper()
    upper = text.upper()
    if "SET_CONFIG" in head and "WITH FENCE" in upper and "COMPLETED_AT = " in upper:
        return "set_config + finalize done (one message)"
    if "SET_CONFIG" in head and "WITH FENCE" in upper:
        return "set_config + fenced append (one message)"
    if "SET_CONFIG" in head and "ORDER BY STEP" in upper:
        return "set_config + load (one message)"
    if "SET_CONFIG" in head:
        return "set_config (tenant)"
    if "CLAIM_INSTANCES" in head:
        return "claim (definer function)"
    if head.startswith("SELECT") and "FOR NO KEY UPDATE" in text.upper():
        return "fence lock SELECT ... FOR NO KEY UPDATE"
    table = re.search(r'(?:FROM|INTO|UPDATE) "?(\w+)"?', text)
    verb = head.split(" ", 1)[0]
    if head.startswith("WITH"):
        verb = "WITH (CTE)"
    return f"{verb} {table.group(1) if table else ''}".strip()


def profile(cleat: Cleat, workflows: int, steps: int, with_cprofile: bool) -> None:
    """Execute segments in this process, one after another, recording every SQL statement
    (kind, count, time) and a cProfile of the whole."""
    from django.db import connection, connections
    from django.utils import timezone

    from workflows.executor import execute_claim, set_services
    from workflows.store.lifecycle import claim_ready_instances

    cleat.reset()
    cleat.start_many(workflows + 5, steps)
    cleat.analyze()
    connections.close_all()
    stats: dict[str, list[float]] = defaultdict(list)
    commits: list[float] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        t = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            stats[_statement_kind(sql)].append(time.perf_counter() - t)

    from engine.services import Services

    set_services(Services.from_settings({"bench": echo}))
    worker_id = "profile-" + uuid.uuid4().hex[:6]

    def run_one() -> int:
        claims = claim_ready_instances(worker_id, ["default"], 1, timezone.now(), load=True)
        if not claims:
            return 0
        report = execute_claim(claims[0], worker_id)
        assert report.outcome == "completed", report
        return 1

    for _ in range(5):  # warm-up: module compile, connection
        run_one()
    stats.clear()
    wrapper_db = connections["default"]
    profiler = cProfile.Profile()
    with connection.execute_wrapper(wrapper):
        original = wrapper_db.commit

        def timed_commit() -> None:
            t = time.perf_counter()
            try:
                original()
            finally:
                commits.append(time.perf_counter() - t)

        wrapper_db.commit = timed_commit  # type: ignore[method-assign]
        try:
            started = time.perf_counter()
            if with_cprofile:
                profiler.enable()
            done = sum(run_one() for _ in range(workflows))
            profiler.disable()
            elapsed = time.perf_counter() - started
        finally:
            del wrapper_db.commit
    total_steps = done * steps
    print(f"\n== profile: {done} workflows x {steps} steps, one at a time, in this process")
    print(
        f"   {elapsed:.2f} s: {total_steps / elapsed:.0f} steps/s, "
        f"{elapsed / total_steps * 1e3:.3f} ms per step (all costs of the segment included)"
    )
    print(f"   {'statement':48} {'count':>7} {'per step':>9} {'mean ms':>8} {'ms/step':>8}")
    rows = sorted(stats.items(), key=lambda kv: -sum(kv[1]))
    if commits:
        rows.append(("COMMIT (connection.commit)", commits))
    sql_time = 0.0
    for kind, times in rows:
        sql_time += sum(times)
        print(
            f"   {kind[:48]:48} {len(times):7d} {len(times) / total_steps:9.2f} "
            f"{statistics.fmean(times) * 1e3:8.3f} {sum(times) / total_steps * 1e3:8.3f}"
        )
    n_statements = sum(len(t) for t in stats.values()) + len(commits)
    print(
        f"   statements + commits per step: {n_statements / total_steps:.2f} "
        f"(+1 BEGIN per transaction, sent by psycopg); SQL wall time "
        f"{sql_time / total_steps * 1e3:.3f} ms/step of {elapsed / total_steps * 1e3:.3f}"
    )
    if not with_cprofile:
        set_services(None)
        connections.close_all()
        return
    buf = io.StringIO()
    ps = pstats.Stats(profiler, stream=buf).sort_stats("cumulative")
    ps.print_stats(
        r"(store/storage|store/lifecycle|executor|tenancy|session\.py|runtime\.py|"
        r"django/db/models/query\.py|psycopg/cursor\.py|transaction\.py)"
    )
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    print("   cProfile, cumulative (selected):")
    for ln in lines[:45]:
        print("   " + ln)
    set_services(None)
    connections.close_all()


# --- report ------------------------------------------------------------------------------------


def _fmt(value: float, unit: str = "") -> str:
    if value != value:  # NaN
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}{unit}"
    return f"{value:.2f}{unit}"


def print_throughput(label: str, t: Throughput) -> None:
    """One throughput run's line and its CPU per step, as it finishes."""
    print(
        f"{label} {t.processes} proc x {t.concurrency}: {t.wall_s:.2f} s, "
        f"{t.steps_per_s:.0f} steps/s, {t.workflows_per_s:.1f} wf/s "
        f"(from first claim: {t.busy_steps_per_s:.0f} steps/s) "
        f"{'ok' if t.ok else 'FAILED ' + t.note} [load {_load()}]\n"
        f"       CPU per step: worker {t.worker_cpu_s / t.total_steps * 1e3:.3f} ms, "
        f"database {t.database_cpu_s / t.total_steps * 1e3:.3f} ms"
        + (
            f"; WAL per step: {t.wal.wal_records / t.total_steps:.2f} records, "
            f"{t.wal.wal_bytes / t.total_steps:.0f} bytes; MultiXacts "
            f"{t.wal.multixacts}"
            if t.wal is not None
            else ""
        )
        + (
            f"; worker context switches per step: {t.context_switches / t.total_steps:.2f}"
            if t.context_switches is not None
            else ""
        ),
        flush=True,
    )


def print_table(
    cleat_runs: Sequence[Throughput],
    dbos_runs: Sequence[Throughput],
    latency: Latency | None,
    pgbench: float | None,
    python_runs: Sequence[Throughput] = (),
) -> None:
    print("\n== store benchmark: results")
    print(
        f"   machine: {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}, PostgreSQL {_server_version()}, "
        f"load average now {_load()}"
    )
    head = (
        f"   {'system':8} {'proc':>4} {'conc':>4} {'wall s':>7} {'steps/s':>8} "
        f"{'wf/s':>7} {'steps/s/proc':>12} {'busy steps/s':>12}  check"
    )
    print(head)
    for t in [*cleat_runs, *python_runs, *dbos_runs]:
        print(
            f"   {t.system:8} {t.processes:4d} {t.concurrency:4d} {t.wall_s:7.2f} "
            f"{t.steps_per_s:8.0f} {t.workflows_per_s:7.1f} {t.steps_per_s / t.processes:12.0f} "
            f"{t.busy_steps_per_s:12.0f}  {'ok' if t.ok else 'FAILED ' + t.note}"
        )
    if pgbench is not None:
        print(f"   pgbench -c 1 one-row INSERT: {pgbench:,.0f} tps")
    if latency is not None:
        s = latency.samples_ms
        print(
            f"   latency (completed_at - created_at, {len(s)} sequential 1-step runs): "
            f"p50 {latency.pct(50):.2f} ms, p90 {latency.pct(90):.2f} ms, "
            f"p99 {latency.pct(99):.2f} ms, max {max(s):.2f} ms"
        )
        print(
            "   latency seen by the client (start_workflow call -> a 2 ms poll sees done): "
            f"p50 {latency.pct(50, True):.2f} ms, p99 {latency.pct(99, True):.2f} ms"
        )

    print("\n   goal                                         figure            goal    met")
    by_proc_dbos = {t.processes: t for t in dbos_runs}
    for t in cleat_runs:
        d = by_proc_dbos.get(t.processes)
        if d is not None:
            ratio = t.steps_per_s / d.steps_per_s
            print(
                f"   cleat/DBOS steps/s, {t.processes} proc{'s' if t.processes > 1 else ' '}"
                f"{'':21} {ratio:6.2f}x ({t.steps_per_s:.0f}/{d.steps_per_s:.0f})"
                f"{'':>0} >= {GOAL_VS_DBOS:.1f}x  {'yes' if ratio >= GOAL_VS_DBOS else 'NO'}"
            )
        if pgbench:
            ratio = t.steps_per_s / t.processes / pgbench
            print(
                f"   cleat steps/s per process / pgbench, {t.processes} proc"
                f"{'s' if t.processes > 1 else ' '}      {ratio * 100:6.1f}% "
                f"({t.steps_per_s / t.processes:.0f}/{pgbench:.0f})"
                f"  >= {GOAL_VS_PGBENCH * 100:.0f}%   {'yes' if ratio >= GOAL_VS_PGBENCH else 'NO'}"
            )
    by_proc = {t.processes: t for t in cleat_runs}
    if 1 in by_proc and 2 in by_proc:
        one, two = by_proc[1], by_proc[2]
        ratio = two.busy_steps_per_s / one.busy_steps_per_s if one.busy_steps_per_s else 0.0
        print(
            f"   cleat 2 procs / 1 proc, steps/s from the first claim  {ratio:6.2f}x "
            f"({two.busy_steps_per_s:.0f}/{one.busy_steps_per_s:.0f})"
            f"  >= {GOAL_SCALING:.1f}x  {'yes' if ratio >= GOAL_SCALING else 'NO'}"
        )
    for py in python_runs:
        wat = by_proc.get(py.processes)
        if wat is None:
            print(
                f"   Python / WAT steps/s, {py.processes} proc: no core module run with as many "
                "processes to compare (--only throughput beside python-throughput)"
            )
            continue
        ratio = py.steps_per_s / wat.steps_per_s
        met = "yes" if ratio >= GOAL_PYTHON_VS_WAT else "NO"
        if not (py.ok and wat.ok):
            met = "FAILED run"
        print(
            f"   Python / WAT steps/s, {py.processes} proc{'s' if py.processes > 1 else ' '}"
            f"{'':21} {ratio * 100:6.1f}% ({py.steps_per_s:.0f}/{wat.steps_per_s:.0f})"
            f"  >= {GOAL_PYTHON_VS_WAT * 100:.0f}%   {met}"
        )
    if latency is not None:
        p50, p99 = latency.pct(50), latency.pct(99)
        print(
            f"   start->done latency p50{'':22} {p50:8.2f} ms{'':8} <= {GOAL_P50_MS:.0f} ms  "
            f"{'yes' if p50 <= GOAL_P50_MS else 'NO'}"
        )
        print(
            f"   start->done latency p99{'':22} {p99:8.2f} ms{'':8} <= {GOAL_P99_MS:.0f} ms  "
            f"{'yes' if p99 <= GOAL_P99_MS else 'NO'}"
        )


_SERVER_VERSION = "?"


def cpu_reference_ms(steps: int) -> float:
    """The machine's speed for Python code in this run: the milliseconds of one pure-Python
    loop of ``steps`` additions. The figures of CPU-bound work (a step's worker CPU, the
    drain, python_bench's steps) move with it, as the commit-bound ones move with pgbench's
    rate (bench/README.md, twenty-seventh pass)."""
    started = time.perf_counter()
    total = 0
    for i in range(steps):
        total += i
    return (time.perf_counter() - started) * 1000


def cpu_reference_line(steps: int = 5_000_000) -> str:
    """The benches' line for :func:`cpu_reference_ms`."""
    return f"CPU reference: a {steps:,}-step Python loop in {cpu_reference_ms(steps):,.0f} ms"


def _load() -> str:
    """The 1/5/15-minute load average: other processes on the machine skew every figure."""
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _server_version() -> str:
    return _SERVER_VERSION


# --- main --------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


@contextlib.contextmanager
def _databases(server: Server, names: Sequence[str], keep: bool) -> Iterator[None]:
    try:
        yield
    finally:
        if not keep:
            with contextlib.suppress(Exception):
                from django.db import connections

                connections.close_all()
            for name in names:
                with contextlib.suppress(Exception):
                    server.drop(name)


def compare_encryption(
    cleat: Cleat, workflows: int, steps: int, processes: int, concurrency: int, rounds: int
) -> None:
    """The throughput workload with and without encryption at rest, interleaved."""
    by_mode: dict[bool, list[float]] = {False: [], True: []}
    for i in range(rounds):
        for on in (False, True) if i % 2 == 0 else (True, False):
            cleat.set_encryption(on)
            t = cleat_throughput(cleat, workflows, steps, processes, concurrency)
            by_mode[on].append(t.steps_per_s)
            print(
                f"cleat  {processes} proc x {concurrency}, encryption {'on ' if on else 'off'}: "
                f"{t.steps_per_s:.0f} steps/s {'ok' if t.ok else 'FAILED ' + t.note} "
                f"[load {_load()}]",
                flush=True,
            )
    off, on = statistics.median(by_mode[False]), statistics.median(by_mode[True])
    print(
        f"encryption at rest, {processes} proc: median {off:.0f} steps/s off, {on:.0f} on: "
        f"cost {100 * (1 - on / off):.1f}% (goal <= 15%) [load {_load()}]",
        flush=True,
    )
    cleat.set_encryption(False)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--pg",
        default=os.environ.get("CLEAT_BENCH_PG", "postgres://postgres@127.0.0.1:5432"),
        help="superuser URL of the PostgreSQL server (env CLEAT_BENCH_PG)",
    )
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--processes", default="1,2", help="worker process counts, e.g. 1,2")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=16,
        help="segments per process (default 16: runworker's default on 2 CPUs; DBOS gets the same)",
    )
    parser.add_argument(
        "--claim-ahead",
        default="auto",
        help="the workers' runworker --claim-ahead (default auto, runworker's default)",
    )
    parser.add_argument(
        "--conn-max-age",
        type=int,
        default=0,
        help="CONN_MAX_AGE of the workers' connections (DATABASE_URL ?conn_max_age=); "
        "0 leaves it to the settings (env CONN_MAX_AGE, default 60 s: connections are kept)",
    )
    parser.add_argument(
        "--workload",
        choices=["wat", "python"],
        default="wat",
        help="the steps workflow as a core module (WAT) or a Python workflow; the worker's "
        "environment (CLEAT_READY_INSTANCES, ...) comes from this one",
    )
    parser.add_argument(
        "--python-processes",
        default="1",
        help="worker process counts of the Python throughput workload (compared with the "
        "core module's run of the same count)",
    )
    parser.add_argument("--latency-runs", type=int, default=200)
    parser.add_argument("--dbos", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--dbos-concurrency", type=int, default=None, help="default: --concurrency")
    parser.add_argument("--dbos-poll", type=float, default=0.05, help="DBOS queue poll (s)")
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument(
        "--only",
        choices=[
            "throughput",
            "python-throughput",
            "latency",
            "dbos",
            "pgbench",
            "profile",
            "breakdown",
            "python-latency",
        ],
        action="append",
        help="run only these parts (repeatable); default all but profile, breakdown and "
        "python-latency",
    )
    parser.add_argument(
        "--encryption",
        choices=["off", "on", "compare"],
        default="off",
        help="encryption at rest for the cleat workloads; compare: throughput both ways",
    )
    parser.add_argument(
        "--compare-rounds", type=int, default=3, help="--encryption compare: rounds each way"
    )
    parser.add_argument("--profile-workflows", type=int, default=200)
    parser.add_argument(
        "--cprofile", action="store_true", help="profile: add a cProfile listing (slower)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    parser.add_argument("--trace-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trace_worker:  # the worker process of `--only breakdown`
        trace_worker(args.trace_worker, args.concurrency)
        return
    parts = set(args.only or ["throughput", "python-throughput", "latency", "dbos", "pgbench"])
    if args.workload == "python":
        parts.discard("python-throughput")  # the workload is Python already
    if not args.dbos:
        parts.discard("dbos")

    global _SERVER_VERSION
    server = Server(args.pg)
    _SERVER_VERSION = server.setting("server_version")
    suffix = f"{os.getpid()}"
    names = {
        "cleat": f"cleat_bench_{suffix}",
        "dbos": f"dbos_bench_{suffix}",
        "pgbench": f"pgbench_bench_{suffix}",
    }
    logdir = Path(tempfile.mkdtemp(prefix="cleat-store-bench-"))
    processes = _ints(args.processes)
    print(
        f"store benchmark: {args.workflows} workflows x {args.steps} steps; worker processes "
        f"{processes}, concurrency {args.concurrency}, conn_max_age {args.conn_max_age}; "
        f"synchronous_commit={server.setting('synchronous_commit')}, "
        f"fsync={server.setting('fsync')}; load average {_load()}; logs in {logdir}"
    )
    print(cpu_reference_line())
    cleat_runs: list[Throughput] = []
    python_runs: list[Throughput] = []
    dbos_runs: list[Throughput] = []
    latency: Latency | None = None
    pgbench: float | None = None
    with _databases(server, list(names.values()), args.keep):
        needs_cleat = parts & {
            "throughput",
            "python-throughput",
            "latency",
            "profile",
            "breakdown",
            "python-latency",
        }
        cleat = Cleat(
            server,
            names["cleat"],
            args.conn_max_age,
            logdir,
            workload=args.workload,
            python_too="python-throughput" in parts,
            claim_ahead=args.claim_ahead,
        )
        if needs_cleat:
            cleat.prepare()
            cleat.set_encryption(args.encryption == "on")
        if "profile" in parts:
            profile(cleat, args.profile_workflows, args.steps, args.cprofile)
        if "throughput" in parts and args.encryption == "compare":
            for n in processes:
                compare_encryption(
                    cleat, args.workflows, args.steps, n, args.concurrency, args.compare_rounds
                )
        elif "throughput" in parts:
            for n in processes:
                t = cleat_throughput(cleat, args.workflows, args.steps, n, args.concurrency)
                cleat_runs.append(t)
                print_throughput("cleat ", t)
        if "python-throughput" in parts:
            for n in _ints(args.python_processes):
                t = cleat_throughput(
                    cleat, args.workflows, args.steps, n, args.concurrency, PYTHON_DEFINITION
                )
                python_runs.append(t)
                print_throughput("python", t)
        if "latency" in parts and args.latency_runs > 0:
            latency = cleat_latency(cleat, args.latency_runs, args.concurrency)
            print(
                f"cleat  latency: p50 {latency.pct(50):.2f} ms, p99 {latency.pct(99):.2f} ms "
                f"[load {_load()}]",
                flush=True,
            )
        if "python-latency" in parts and args.latency_runs > 0:
            python_latency(cleat, args.latency_runs, args.concurrency, args.compare_rounds)
        if "breakdown" in parts and args.latency_runs > 0:
            cleat_breakdown(cleat, args.latency_runs, args.concurrency)
        if "dbos" in parts:
            conc = args.dbos_concurrency or args.concurrency
            for n in processes:
                t = dbos_throughput(
                    server,
                    names["dbos"],
                    args.workflows,
                    args.steps,
                    n,
                    conc,
                    args.dbos_poll,
                    logdir,
                )
                dbos_runs.append(t)
                print(
                    f"dbos   {n} proc x {conc}: {t.wall_s:.2f} s, {t.steps_per_s:.0f} steps/s, "
                    f"{t.workflows_per_s:.1f} wf/s (from first start: "
                    f"{t.busy_steps_per_s:.0f} steps/s) {'ok' if t.ok else 'FAILED ' + t.note} "
                    f"[load {_load()}]",
                    flush=True,
                )
        if "pgbench" in parts:
            pgbench = pgbench_inserts(server, names["pgbench"], args.pgbench_seconds, logdir)
            print(f"pgbench: {pgbench:.0f} single-client INSERT tps [load {_load()}]", flush=True)
    if cleat_runs or python_runs or dbos_runs or latency or pgbench:
        print_table(cleat_runs, dbos_runs, latency, pgbench, python_runs)
    if not args.keep:
        shutil.rmtree(logdir, ignore_errors=True)


if __name__ == "__main__":
    main()
