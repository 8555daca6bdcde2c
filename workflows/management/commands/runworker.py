"""``manage.py runworker``: run the dispatch worker."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection

from workflows import tracing
from workflows.management.commands._common import use_worker_connection_age
from workflows.models import Tenant
from workflows.rls import bypass_reasons, format_reasons
from workflows.services import ServiceError, get_tenant
from workflows.worker import Worker, WorkerOptions, default_worker_id


def default_concurrency(vendor: str) -> int:
    """The default threads of a worker process: 4; 1 on SQLite (one writer)."""
    return 1 if vendor == "sqlite" else 4


class Command(BaseCommand):
    help = "Run the workflow dispatch worker (claims due runs and executes their segments)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queues", default="default", help="comma-separated task queues")
        parser.add_argument(
            "--concurrency",
            type=int,
            default=None,
            help="segments at once (threads; default 4, 1 on SQLite)",
        )
        parser.add_argument("--processes", type=int, default=1, help="worker processes to start")
        parser.add_argument("--worker-id", default=None)
        parser.add_argument("--tenant", default=None, help="serve one tenant (default: all)")
        parser.add_argument("--poll-interval", type=float, default=1.0, help="seconds")
        parser.add_argument("--lease", type=float, default=60.0, help="lease in seconds")
        parser.add_argument(
            "--claim-ahead",
            type=int,
            default=0,
            help="runs claimed beyond the threads, queued for the next free one (default 0)",
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
        if options["claim_ahead"] < 0:
            raise CommandError("--claim-ahead must be 0 or more")
        try:
            tracing.tracer()  # a bad CLEAT_TRACING (or OTLP without its package) stops here
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        if options["processes"] > 1:
            self._supervise(options)
            return
        if options["metrics_port"]:
            from prometheus_client import start_http_server

            start_http_server(options["metrics_port"])
        worker = Worker(
            WorkerOptions(
                worker_id=options["worker_id"] or default_worker_id(),
                task_queues=queues,
                concurrency=concurrency,
                tenant=tenant.id if tenant else None,
                poll_interval_s=options["poll_interval"],
                lease_s=options["lease"],
                burst=options["burst"],
                claim_ahead=options["claim_ahead"],
            )
        )
        worker.install_signal_handlers()
        try:
            processed = worker.run()
        finally:
            tracing.shutdown()  # export the spans still buffered
        if options["burst"]:
            self.stdout.write(f"processed {processed} segment(s)")

    def _supervise(self, options: dict[str, Any]) -> None:
        """Start N single-process workers and forward SIGTERM/SIGINT to them."""
        base_id = options["worker_id"] or default_worker_id()
        children = []
        for i in range(options["processes"]):
            argv = [
                sys.executable,
                sys.argv[0],
                "runworker",
                "--processes",
                "1",
                "--worker-id",
                f"{base_id}-{i}",
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
            children.append(subprocess.Popen(argv, env=os.environ.copy()))

        def forward(signum: int, _frame: Any) -> None:
            for child in children:
                child.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        codes = [child.wait() for child in children]
        if any(codes):
            raise CommandError(f"worker processes exited with {codes}")
