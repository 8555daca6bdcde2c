"""``manage.py retry_workflow RUN_ID``: retry a failed or dead-lettered run.

By default the run replays its history (a last call that failed retryably is made again);
``--mode reexecute_last_call`` also makes again a last call that failed permanently, for a
run that failed because a service was configured wrongly and has been fixed since. Prints
what the retry does."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from engine import lifecycle
from workflows.management.commands._common import add_tenant_argument, fail, tenant_from
from workflows.services import ServiceError, retry_workflow


class Command(BaseCommand):
    help = "Retry a failed or dead-lettered workflow run and say what the retry does."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument(
            "--mode",
            choices=lifecycle.RETRY_MODES,
            default=lifecycle.RETRY_REPLAY,
            help="replay (default) or reexecute_last_call",
        )
        parser.add_argument("--reason", default="", help="kept in the audit log")
        add_tenant_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_from(options)
        try:
            instance = retry_workflow(
                tenant,
                options["run_id"],
                operator="command",
                reason=options["reason"],
                mode=options["mode"],
            )
        except ServiceError as exc:
            raise fail(exc) from None
        self.stdout.write(f"run {instance.id} retried: {instance.retry_plan.effect}")
