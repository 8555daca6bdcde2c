"""``manage.py runscheduler``: run the schedule tick outside a worker (or once)."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections
from django.utils import timezone

from schedules.scheduler import ScheduleTicker, tick
from workflows.management.commands._common import use_worker_connection_age
from workflows.services import ServiceError, get_tenant

log = logging.getLogger("cleat.scheduler")


class Command(BaseCommand):
    help = (
        "Start the runs cron schedules owe: tick until stopped (SIGTERM/SIGINT), sleeping until "
        "the next instant, or once with --once. Safe to run beside workers and other "
        "schedulers: each instant is claimed by exactly one."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="one tick, print it, exit")
        parser.add_argument(
            "--interval", type=float, default=1.0, help="look for new schedules this often (s)"
        )
        parser.add_argument("--tenant", default=None, help="one tenant (default: all)")
        parser.add_argument("--batch", type=int, default=200, help="schedules per tick")

    def handle(self, *args: Any, **options: Any) -> None:
        logging.getLogger("cleat").setLevel(logging.INFO)
        tenant = None
        if options["tenant"]:
            try:
                tenant = get_tenant(options["tenant"]).id
            except ServiceError as exc:
                raise CommandError(exc.message) from None
        if options["batch"] < 1 or options["interval"] <= 0:
            raise CommandError("--batch and --interval must be positive")
        if options["once"]:
            report = tick(timezone.now(), tenant=tenant, limit=options["batch"])
            self.stdout.write(report.summary())
            return
        use_worker_connection_age()  # a long-running loop like the worker's
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        ticker = ScheduleTicker(tenant, options["interval"], options["batch"])
        log.info("event=scheduler_started tenant=%s", tenant or "all")
        while not stop.is_set():
            close_old_connections()
            report = ticker.run_due(timezone.now())
            if report is not None and (report.progress or report.errors):
                log.info("event=scheduler_tick %s", report.summary())
            stop.wait(ticker.seconds_until_due(timezone.now()))
        close_old_connections()
        log.info("event=scheduler_stopped")
