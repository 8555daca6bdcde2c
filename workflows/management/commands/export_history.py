"""``manage.py export_history RUN_ID [-o FILE]``: a run's history as a replayable document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workflows.management.commands._common import add_tenant_argument, fail, tenant_from
from workflows.services import ServiceError, export_history


class Command(BaseCommand):
    help = (
        "Write a run's history (format cleat-history/1) to stdout or a file, to replay it "
        "against a new build in a test with engine.testing.replay."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("-o", "--output", help="write to this file instead of stdout")
        add_tenant_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_from(options)
        try:
            recorded = export_history(tenant, options["run_id"])
        except ServiceError as exc:
            raise fail(exc) from None
        text = recorded.dumps()
        if options["output"]:
            path = Path(options["output"])
            try:
                path.write_text(text + "\n", encoding="utf-8")
            except OSError as exc:
                raise CommandError(f"cannot write {path}: {exc.strerror}") from None
            self.stdout.write(f"{len(recorded.history)} events of run {recorded.run_id} -> {path}")
        else:
            self.stdout.write(text)
