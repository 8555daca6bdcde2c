"""``manage.py signal_workflow RUN_ID SIGNAL``: deliver a signal."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from workflows.management.commands._common import (
    add_tenant_argument,
    fail,
    parse_json_option,
    tenant_from,
)
from workflows.services import ServiceError, signal_workflow


class Command(BaseCommand):
    help = "Send a signal (with an optional JSON payload) to a workflow run."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("signal")
        parser.add_argument("--payload", default=None, help="JSON payload")
        add_tenant_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_from(options)
        payload = parse_json_option(options["payload"], "payload")
        try:
            signal_workflow(tenant, options["run_id"], options["signal"], payload)
        except ServiceError as exc:
            raise fail(exc) from None
        self.stdout.write(f"signal {options['signal']!r} delivered to {options['run_id']}")
