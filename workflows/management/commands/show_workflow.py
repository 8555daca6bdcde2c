"""``manage.py show_workflow RUN_ID``: print a run as one JSON object.

The run's result and query-state values are stored as JSON text; they are printed as the
JSON values they are (``"result": {"status": "shipped"}``), as the API shows them, not as
strings holding JSON."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from engine.storable import parse_readable
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
        self.stdout.write(json.dumps(readable_summary(summary)))


def _value(text: Any) -> Any:
    """Stored JSON text as its value (text that is not JSON stays the text)."""
    if not isinstance(text, str):
        return text
    try:
        return parse_readable(text)
    except ValueError:
        return text


def readable_summary(summary: dict[str, Any]) -> dict[str, Any]:
    state = summary.get("query_state")
    return {
        **summary,
        "result": _value(summary["result"]),
        "query_state": {k: _value(v) for k, v in state.items()} if isinstance(state, dict) else {},
    }
