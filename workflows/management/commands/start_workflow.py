"""``manage.py start_workflow NAME [INPUT]``: start a run; prints its id as the last line.

The input is JSON, given as the second argument (``start_workflow order '{"sku": "book"}'``)
or with ``--input``; not both."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from workflows.management.commands._common import (
    VersionOptionMixin,
    add_tenant_argument,
    fail,
    one_of,
    parse_json_option,
    tenant_from,
)
from workflows.services import ServiceError, start_workflow


class Command(VersionOptionMixin, BaseCommand):
    help = "Start a workflow run and print its run id."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument(
            "input_json", nargs="?", default=None, metavar="INPUT", help="JSON input"
        )
        parser.add_argument("--version", type=int, default=None, dest="def_version")
        parser.add_argument("--tag", default=None)
        parser.add_argument("--input", default=None, help="JSON input (or give it after NAME)")
        parser.add_argument("--idempotency-key", default=None)
        parser.add_argument("--priority", type=int, default=0)
        parser.add_argument("--task-queue", default="default")
        add_tenant_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_from(options)
        payload = parse_json_option(one_of(options, "input_json", "input"), "input")
        try:
            instance, created = start_workflow(
                tenant,
                options["name"],
                payload,
                version=options["def_version"],
                tag=options["tag"],
                idempotency_key=options["idempotency_key"],
                priority=options["priority"],
                task_queue=options["task_queue"],
            )
        except ServiceError as exc:
            raise fail(exc) from None
        if not created:
            self.stderr.write("a run with this idempotency key exists; returning it")
        self.stdout.write(str(instance.id))
