"""``manage.py show_workflow RUN_ID``: print a run as one JSON object."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from workflows.management.commands._common import add_tenant_argument, fail, tenant_from
from workflows.models import instance_summary
from workflows.services import ServiceError, get_instance
from workflows.tenancy import tenant_context


class Command(BaseCommand):
    help = "Print a workflow run (id, status, result, error, error_code, waiting_on, ...) as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        add_tenant_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_from(options)
        try:
            with tenant_context(tenant.id):
                instance = get_instance(tenant, options["run_id"])
                summary = instance_summary(instance)
        except ServiceError as exc:
            raise fail(exc) from None
        self.stdout.write(json.dumps(summary))
