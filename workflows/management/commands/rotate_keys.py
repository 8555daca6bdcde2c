"""``manage.py rotate_keys``: re-seal stored payloads under the current encryption key;
``--check`` counts the rows each key still protects (docs/operations.md, "Data lifetime")."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workflows import crypto, rotation
from workflows.management.commands._common import tenant_from


class Command(BaseCommand):
    help = (
        "Re-seal every stored payload not sealed under CLEAT_ENCRYPTION_KEY_ID (older keys, "
        "plaintext rows) in batches of at most 1,000 rows per transaction; safe beside "
        "running workers and resumable. --check prints how many rows each key protects."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", default=None, help="one tenant (name or id; default all)")
        parser.add_argument(
            "--check", action="store_true", help="count the rows per key, change nothing"
        )
        parser.add_argument(
            "--batch-size", type=int, default=rotation.BATCH, help="rows per transaction (1-1000)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        crypto.reset()  # the settings as this process has them
        tenant = tenant_from(options) if options["tenant"] else None
        try:
            ring = rotation.require_keyring()
            if options["check"]:
                self._check(ring, rotation.check(tenant=tenant))
                return
            report = rotation.rotate(
                tenant=tenant, batch=options["batch_size"], progress=self.stdout.write
            )
        except (ImproperlyConfigured, ValueError) as exc:
            raise CommandError(str(exc)) from None
        total = sum(report.resealed.values())
        self.stdout.write(
            f"re-sealed {total} rows under key {ring.current!r} in {report.batches} batches"
        )
        if report.unopened:
            missing = ", ".join(f"{k!r} ({n} rows)" for k, n in sorted(report.unopened.items()))
            raise CommandError(
                f"rows sealed with keys that are not configured were left as they are: {missing}"
            )

    def _check(self, ring: crypto.Keyring, counts: dict[str, Any]) -> None:
        labels = {ring.current: " (current)"}
        order = [ring.current, *sorted(k for k in counts if k != ring.current)]
        for key_id in order:
            columns = counts.get(key_id, {})
            total = sum(columns.values())
            if key_id in ("(other keys)", rotation.PLAINTEXT) and not total:
                continue
            name = key_id if key_id.startswith("(") else f"key {key_id}"
            self.stdout.write(f"{name}{labels.get(key_id, '')}: {total} rows")
            for column, n in sorted(columns.items()):
                if n:
                    self.stdout.write(f"  {column}: {n}")
