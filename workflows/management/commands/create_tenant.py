"""``manage.py create_tenant NAME``: create a tenant and print its id."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workflows.models import Tenant


class Command(BaseCommand):
    help = "Create a tenant."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument(
            "--schedule-quota",
            type=int,
            default=None,
            help="most schedules the tenant may hold (default: CLEAT_MAX_SCHEDULES_PER_TENANT; "
            "0: unlimited)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant(name=options["name"], schedule_quota=options["schedule_quota"])
        try:
            tenant.full_clean()
        except ValidationError as exc:
            raise CommandError(
                "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            ) from None
        tenant.save()
        self.stdout.write(str(tenant.id))
