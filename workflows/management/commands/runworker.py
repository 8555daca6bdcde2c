"""``manage.py runworker``: run the dispatch worker."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import Any, Protocol

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection, connections

from workflows import tracing
from workflows.management.commands._common import use_worker_connection_age
from workflows.models import Tenant
from workflows.rls import bypass_reasons, format_reasons
from workflows.services import ServiceError, get_tenant
from workflows.worker import (
    AUTO_AHEAD_THREADS,
    CLAIM_AHEAD_AUTO,
    Worker,
    WorkerOptions,
    default_worker_id,
    freeze_long_lived_objects,
)

log = logging.getLogger("cleat.worker")


# Threads per CPU by default, and the bounds: a step mostly waits for its commit (or a
# service), so several threads per CPU keep one busy and make the group commit's batches
# bigger; each thread holds a database connection, hence the ceiling. On the project's
# 2-core test machine 16 threads made 18% more steps/s than 8 with one process and 12% more
# with two, at less CPU a step on both sides (bench/README.md, seventeenth pass).
THREADS_PER_CPU = 8
MIN_THREADS, MAX_THREADS = 4, 32


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which a container's CPU set
    narrows), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


def default_concurrency(vendor: str) -> int:
    """The default threads of a worker process: 1 on SQLite (one writer); elsewhere
    THREADS_PER_CPU per usable CPU, between MIN_THREADS and MAX_THREADS (16 on 2 CPUs)."""
    if vendor == "sqlite":
        return 1
    return max(MIN_THREADS, min(MAX_THREADS, THREADS_PER_CPU * usable_cpus()))


def parse_claim_ahead(value: str) -> int | str:
    """``--claim-ahead``: ``auto`` or a number of runs, 0 or more."""
    text = value.strip().lower()
    if text == CLAIM_AHEAD_AUTO:
        return CLAIM_AHEAD_AUTO
    try:
        ahead = int(text)
    except ValueError:
        ahead = -1
    if ahead < 0:
        raise CommandError(
            f"--claim-ahead must be 0 or more, or {CLAIM_AHEAD_AUTO} (got {value!r})"
        )
    return ahead


# A worker serves no URL and renders no page: its start-up leaves out the web side's system
# checks, whose URL check imports the whole web stack (the URL configuration, DRF's views,
# drf-spectacular): about 0.2 s of every worker process's start. `manage.py check` and the
# web server's start run them all.
WEB_CHECK_TAGS = frozenset(
    {checks.Tags.urls, checks.Tags.templates, checks.Tags.staticfiles, checks.Tags.admin}
)


def worker_check_tags() -> list[str]:
    """The tags of the system checks a worker runs at start-up: every registered tag (cleat's
    own included, ``workflows.apps.CHECK_TAG``) but the web side's."""
    return sorted(set(checks.registry.registry.tags_available()) - WEB_CHECK_TAGS)


class Command(BaseCommand):
    help = "Run the workflow dispatch worker (claims due runs and executes their segments)."

    @property  # type: ignore[override]
    def requires_system_checks(self) -> list[str]:
        return worker_check_tags()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queues", default="default", help="comma-separated task queues")
        parser.add_argument(
            "--concurrency",
            type=int,
            default=None,
            help=f"segments at once (threads; default {THREADS_PER_CPU} per CPU, {MIN_THREADS} "
            f"to {MAX_THREADS}; 1 on SQLite)",
        )
        parser.add_argument("--processes", type=int, default=1, help="worker processes to start")
        parser.add_argument("--worker-id", default=None)
        parser.add_argument("--tenant", default=None, help="serve one tenant (default: all)")
        parser.add_argument("--poll-interval", type=float, default=1.0, help="seconds")
        parser.add_argument("--lease", type=float, default=60.0, help="lease in seconds")
        parser.add_argument(
            "--claim-ahead",
            default=CLAIM_AHEAD_AUTO,
            help="runs claimed beyond the threads, queued for the next free one: a number (0: "
            "none), or auto, a queue that follows the backlog, up to "
            f"{AUTO_AHEAD_THREADS} times the threads (default auto)",
        )
        parser.add_argument("--burst", action="store_true", help="exit when nothing is due")
        parser.add_argument(
            "--metrics-port", type=int, default=None, help="serve Prometheus metrics"
        )
        parser.add_argument(
            "--require-rls",
            action="store_true",
            help="refuse to start when row-level security is bypassed (PostgreSQL)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        logging.getLogger("cleat").setLevel(logging.INFO)
        use_worker_connection_age()
        queues = [q.strip() for q in options["queues"].split(",") if q.strip()]
        if not queues:
            raise CommandError("--queues needs at least one task queue")
        if options["processes"] < 1:
            raise CommandError("--processes must be at least 1")
        tenant: Tenant | None = None
        if options["tenant"]:
            try:
                tenant = get_tenant(options["tenant"])
            except ServiceError as exc:
                raise CommandError(exc.message) from None
        try:
            reasons = bypass_reasons(connection)
        except DatabaseError as exc:
            # A database down or unreachable at start-up: say so (a supervisor restarts us).
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CommandError(f"cannot reach the database: {first}") from None
        if reasons:
            message = format_reasons(reasons)
            if options["require_rls"]:
                raise CommandError(message)
            self.stderr.write(self.style.WARNING(message))
        concurrency = options["concurrency"]
        if concurrency is None:
            concurrency = default_concurrency(connection.vendor)
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1")
        claim_ahead = parse_claim_ahead(str(options["claim_ahead"]))
        try:
            tracing.tracer()  # a bad CLEAT_TRACING (or OTLP without its package) stops here
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        # What every worker of this command runs with (a forked one too, its id suffixed).
        worker_options = WorkerOptions(
            worker_id=options["worker_id"] or default_worker_id(),
            task_queues=queues,
            concurrency=concurrency,
            tenant=tenant.id if tenant else None,
            poll_interval_s=options["poll_interval"],
            lease_s=options["lease"],
            burst=options["burst"],
            claim_ahead=claim_ahead,
        )
        if options["processes"] > 1:
            self._supervise(options, worker_options)
            return
        self._run_worker(options, worker_options)

    def _run_worker(self, options: dict[str, Any], worker_options: WorkerOptions) -> None:
        """This process's worker, until it is told to stop (or, with --burst, idle)."""
        if options["metrics_port"]:
            from prometheus_client import start_http_server

            start_http_server(options["metrics_port"])
        worker = Worker(worker_options)
        worker.install_signal_handlers()
        # A forked worker starts with the stop signals blocked (_supervise): one that came
        # meanwhile is handled now, by this worker's handler.
        _unblock_stop_signals()
        try:
            processed = worker.run()
        finally:
            tracing.shutdown()  # export the spans still buffered
        if options["burst"]:
            self.stdout.write(f"processed {processed} segment(s)")

    def _supervise(self, options: dict[str, Any], worker_options: WorkerOptions) -> None:
        """Start N single-process workers and forward SIGTERM/SIGINT to them.

        Each is a fork of this process where that is safe (a POSIX system, and no thread
        started here yet): it starts with Django, the engine and the checks already loaded
        and done, in milliseconds instead of the ~0.4 s of a new interpreter, and runs its
        worker with what this process found (queues, threads, tenant) instead of checking
        the database and the settings again. Elsewhere each is a new ``runworker
        --processes 1`` process."""
        base_id = worker_options.worker_id
        # The handler is in place before the first worker starts: a stop signal that came
        # between a start and the handler (a forked worker starts in milliseconds) killed
        # this process and left its workers running without it.
        forward = _StopForwarder()
        for signum in STOP_SIGNALS:
            signal.signal(signum, forward)
        forked = hasattr(os, "fork") and threading.active_count() == 1
        if forked:
            # Blocked while it forks: a forked child inherits the mask and this handler, and
            # must not act on a stop signal (die of it, or forward it) before its worker's
            # handler is in place (_run_worker unblocks them then).
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                children = self._fork_workers(options, worker_options)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        else:
            children = [
                self._spawn_worker(options, f"{base_id}-{i}") for i in range(options["processes"])
            ]
        forward.started(children)

        log.info(
            "event=workers_started processes=%d started_as=%s pids=%s",
            len(children),
            "fork" if forked else "new_process",
            ",".join(str(child.pid) for child in children),
        )
        codes = _wait_for(children)
        if any(codes):
            raise CommandError(f"worker processes exited with {codes}")

    def _fork_workers(self, options: dict[str, Any], worker_options: WorkerOptions) -> list[_Child]:
        # A forked child must not share this process's database connection: closed first,
        # each process opens its own.
        connections.close_all()
        # What is alive now (Django, the project, the engine) is moved out of the collector's
        # reach once, here: each child then starts without a full collection of its own, and
        # the collector never writes to those objects, whose pages stay shared with this
        # process instead of being copied into each child.
        freeze_long_lived_objects()
        sys.stdout.flush()
        sys.stderr.flush()
        children: list[_Child] = []
        supervisor = os.getpid()
        for i in range(options["processes"]):
            pid = os.fork()
            if pid == 0:  # the child: one worker, then out without running the parent's code
                _stop_with_supervisor(supervisor)
                child = replace(worker_options, worker_id=f"{worker_options.worker_id}-{i}")
                os._exit(self._forked_worker({**options, "metrics_port": None}, child))
            children.append(_Forked(pid))
        return children

    def _forked_worker(self, options: dict[str, Any], worker_options: WorkerOptions) -> int:
        """A forked child's worker (what ``runworker --processes 1`` runs); its exit code."""
        code = 0
        try:
            self._run_worker(options, worker_options)
        except CommandError as exc:
            self.stderr.write(f"CommandError: {exc}")
            code = exc.returncode
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            log.exception("event=worker_crashed")
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        return code

    def _spawn_worker(self, options: dict[str, Any], worker_id: str) -> _Child:
        argv = [
            sys.executable,
            sys.argv[0],
            "runworker",
            "--processes",
            "1",
            "--worker-id",
            worker_id,
        ]
        for flag in (
            "queues",
            "concurrency",
            "tenant",
            "poll_interval",
            "lease",
            "claim_ahead",
        ):
            if options[flag] is not None:
                argv += [f"--{flag.replace('_', '-')}", str(options[flag])]
        if options["burst"]:
            argv.append("--burst")
        return subprocess.Popen(argv, env=os.environ.copy())


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _StopForwarder:
    """The supervisor's SIGTERM/SIGINT handler: each one is forwarded to every worker. One
    that comes while the workers are being started is kept, and forwarded once they all are
    (:meth:`started`)."""

    def __init__(self) -> None:
        self.children: list[_Child] | None = None  # None: still being started
        self.told: int | None = None

    def __call__(self, signum: int, _frame: Any) -> None:
        self.told = signum
        if self.children is not None:
            self._forward(self.children, signum)

    def started(self, children: list[_Child]) -> None:
        self.children = list(children)
        if self.told is not None:
            self._forward(self.children, self.told)

    @staticmethod
    def _forward(children: list[_Child], signum: int) -> None:
        for child in children:
            child.send_signal(signum)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _stop_with_supervisor(supervisor: int) -> None:
    """Linux: this forked worker is sent SIGTERM when its supervisor dies without forwarding
    one (killed with SIGKILL, by the OOM killer), so it stops cleanly, giving its queued runs
    back, instead of running on unsupervised. Elsewhere nothing (a supervisor's death leaves
    its workers running, as it does a spawned worker's)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != supervisor:  # it died before the request: stop now
        os.kill(os.getpid(), signal.SIGTERM)  # blocked until the worker's handler is in place


def _unblock_stop_signals() -> None:
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class _Child(Protocol):
    pid: int

    def send_signal(self, signum: int) -> None: ...

    def poll(self) -> int | None: ...


# How often the supervisor looks at its workers while it waits for them to end. CPython runs
# a signal's handler on the main thread, once that thread runs Python again: a stop signal
# the kernel gave to another thread of the supervisor (an exporter's, when tracing is on;
# the main thread blocks the stop signals while it forks) would wait, behind a main thread
# blocked until some worker ended, and never be forwarded. Each look runs it.
WAIT_POLL_S = 0.2


def _wait_for(children: list[_Child]) -> list[int]:
    """Every worker's exit code, once all have ended; handlers of the stop signals run
    meanwhile (WAIT_POLL_S)."""
    codes: list[int | None] = [None] * len(children)
    while True:
        for i, child in enumerate(children):
            if codes[i] is None:
                codes[i] = child.poll()
        if all(code is not None for code in codes):
            return [code for code in codes if code is not None]
        time.sleep(WAIT_POLL_S)


class _Forked:
    """A forked worker process, as the supervisor handles it (``subprocess.Popen``'s way)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.code: int | None = None

    def send_signal(self, signum: int) -> None:
        if self.code is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def poll(self) -> int | None:
        """Its exit code once it has ended, else None (without waiting)."""
        if self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid != 0:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code
