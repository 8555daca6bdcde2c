"""``manage.py purge``: apply the retention policies now (docs/operations.md, "Data lifetime")."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workflows import retention
from workflows.management.commands._common import tenant_from


class Command(BaseCommand):
    help = (
        "Delete what the retention policies no longer keep: finished and dead-lettered runs "
        "with all they own, expired start idempotency keys, old service calls and audit rows. "
        "Batches of at most 1,000 rows per transaction; safe beside running workers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", default=None, help="one tenant (name or id; default all)")
        parser.add_argument(
            "--dry-run", action="store_true", help="print what would be deleted, delete nothing"
        )
        parser.add_argument(
            "--finished-days",
            default=None,
            help="keep finished runs this many days for this call ('off': keep them; "
            "0: purge every finished run now), whatever the policies say",
        )
        parser.add_argument(
            "--dead-lettered-days",
            default=None,
            help="the same for dead-lettered runs",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        overrides: dict[str, Any] = {}
        for name in ("finished_days", "dead_lettered_days"):
            value = options[name]
            if value is not None:
                try:
                    overrides[name] = retention.parse_days(value, "--" + name.replace("_", "-"))
                except ValueError as exc:
                    raise CommandError(str(exc)) from None
        tenant = tenant_from(options) if options["tenant"] else None
        dry_run = bool(options["dry_run"])
        try:
            report = retention.purge(
                tenant=tenant, dry_run=dry_run, progress=self.stdout.write, **overrides
            )
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        verb = "would delete" if dry_run else "deleted"
        if not report.counts:
            self.stdout.write(f"nothing to purge ({verb} 0 rows)")
            return
        width = max(len(table) for table in report.counts)
        for table, rows in sorted(report.counts.items()):
            self.stdout.write(f"{table.ljust(width)}  {verb} {rows}")
