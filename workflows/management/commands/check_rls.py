"""``manage.py check_rls``: name every way this connection escapes row-level security."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from workflows.rls import bypass_reasons, format_reasons


class Command(BaseCommand):
    help = "Check that row-level security applies to this database connection (PostgreSQL)."

    def handle(self, *args: Any, **options: Any) -> None:
        if connection.vendor != "postgresql":
            self.stdout.write(
                f"{connection.vendor}: no row-level security; "
                "the store scopes every query by tenant"
            )
            return
        reasons = bypass_reasons(connection)
        if reasons:
            raise CommandError(format_reasons(reasons))
        self.stdout.write(self.style.SUCCESS("row-level security is enforced on this connection"))
