"""``manage.py create_api_key --tenant T --name N --role R``: create an API key and print it.

The key is printed once, on the last line; only its SHA-256 is stored, so it cannot be shown
again (revoke it in the admin and create another if it is lost).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from workflows.api.keys import issue_api_key
from workflows.management.commands._common import add_tenant_argument, fail, tenant_from
from workflows.models import Role
from workflows.services import ServiceError


class Command(BaseCommand):
    help = "Create an API key for a tenant and print it (shown this once)."

    def add_arguments(self, parser: CommandParser) -> None:
        add_tenant_argument(parser)
        parser.add_argument("--name", required=True, help="what the key is for (shown in audit)")
        parser.add_argument(
            "--role",
            default=Role.OPERATOR,
            help=f"one of {', '.join(Role.values)} (default: operator)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_from(options)
        try:
            key, plaintext = issue_api_key(tenant, options["name"], options["role"])
        except ServiceError as exc:
            raise fail(exc) from None
        self.stderr.write(
            f"API key {key.name!r} ({key.role}) for tenant {tenant.name}; "
            "store it now, it is not shown again:"
        )
        self.stdout.write(plaintext)
