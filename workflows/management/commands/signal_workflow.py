"""``manage.py signal_workflow RUN_ID SIGNAL [PAYLOAD]``: deliver a signal.

The payload is JSON, given as the third argument (``signal_workflow RUN shipped '{"carrier":
"ups"}'``) or with ``--payload``; not both."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from workflows.management.commands._common import (
    add_tenant_argument,
    fail,
    one_of,
    parse_json_option,
    tenant_from,
)
from workflows.services import ServiceError, signal_workflow


class Command(BaseCommand):
    help = "Send a signal (with an optional JSON payload) to a workflow run."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("signal")
        parser.add_argument(
            "payload_json", nargs="?", default=None, metavar="PAYLOAD", help="JSON payload"
        )
        parser.add_argument(
            "--payload", default=None, help="JSON payload (or give it after SIGNAL)"
        )
        add_tenant_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_from(options)
        payload = parse_json_option(one_of(options, "payload_json", "payload"), "payload")
        try:
            signal_workflow(tenant, options["run_id"], options["signal"], payload)
        except ServiceError as exc:
            raise fail(exc) from None
        self.stdout.write(f"signal {options['signal']!r} delivered to {options['run_id']}")
