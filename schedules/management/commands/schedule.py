"""``manage.py schedule``: schedules from the command line, through ``schedules.services``.

    manage.py schedule list
    manage.py schedule create nightly --workflow report --cron "30 2 * * *" \\
        --timezone Europe/London --input '{"kind": "daily"}' --overlap skip
    manage.py schedule preview nightly --count 10
    manage.py schedule preview --cron "0 9 * * 1-5" --timezone America/New_York
    manage.py schedule pause nightly --reason "quarter close"
    manage.py schedule resume nightly
    manage.py schedule trigger nightly
    manage.py schedule backfill nightly --start 2026-11-01T00:00Z --end 2026-11-02T00:00Z
    manage.py schedule delete nightly

A schedule is named by its name or id. Errors exit non-zero with the reason and the field.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from schedules import services
from schedules.models import MisfirePolicy, OverlapPolicy, Schedule
from schedules.scheduler import Delivery
from workflows.management.commands._common import (
    add_tenant_argument,
    fail,
    parse_json_option,
    tenant_from,
)
from workflows.models import Tenant
from workflows.services import ServiceError
from workflows.tenancy import tenant_context

OPERATOR = "cli"


def _when(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = parse_datetime(value)
    except ValueError:
        parsed = None
    if parsed is None:
        raise CommandError(f"--{option} {value!r} is not a date and time (ISO 8601)")
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _describe(made: list[Delivery]) -> list[str]:
    lines = []
    for d in made:
        run = f" run {d.run_id}" if d.run_id else ""
        replaced = f" (replaced {', '.join(map(str, d.replaced))})" if d.replaced else ""
        lines.append(f"{d.instant.isoformat()} {d.outcome}{run}{replaced}")
    return lines or ["nothing delivered"]


class Command(BaseCommand):
    help = "List, create, preview, pause, resume, trigger, backfill or delete schedules."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

        listing = sub.add_parser("list", help="the tenant's schedules")
        add_tenant_argument(listing)

        create = sub.add_parser("create", help="create a schedule")
        create.add_argument("name")
        create.add_argument("--workflow", required=True, help="the definition each run starts")
        create.add_argument("--cron", required=True, help="5 fields or @hourly, @daily, ...")
        create.add_argument("--timezone", default="UTC", help="IANA zone (default UTC)")
        create.add_argument("--input", default=None, help="JSON passed to every run")
        create.add_argument("--workflow-version", type=int, default=None)
        create.add_argument("--workflow-tag", default="")
        create.add_argument("--entry-point", default="run")
        create.add_argument("--misfire", choices=MisfirePolicy.values, default="catch_up")
        create.add_argument("--catch-up-limit", type=int, default=60)
        create.add_argument("--overlap", choices=OverlapPolicy.values, default="allow")
        create.add_argument("--pause-on-failure", action="store_true")
        create.add_argument("--disabled", action="store_true", help="create it paused")
        create.add_argument("--notes", default="")
        add_tenant_argument(create)

        preview = sub.add_parser("preview", help="next fire times of a schedule or expression")
        preview.add_argument("schedule", nargs="?", help="name or id (or give --cron)")
        preview.add_argument("--cron", default=None)
        preview.add_argument("--timezone", default="UTC")
        preview.add_argument("--count", type=int, default=5)
        preview.add_argument("--after", default=None, help="ISO 8601 (default: now)")
        add_tenant_argument(preview)

        for name, text in (("pause", "disable"), ("resume", "enable"), ("delete", "delete")):
            action = sub.add_parser(name, help=f"{text} a schedule")
            action.add_argument("schedule", help="name or id")
            action.add_argument("--reason", default="")
            add_tenant_argument(action)

        trigger = sub.add_parser("trigger", help="fire now, under the overlap policy")
        trigger.add_argument("schedule", help="name or id")
        trigger.add_argument("--overlap", choices=OverlapPolicy.values, default=None)
        add_tenant_argument(trigger)

        backfill = sub.add_parser("backfill", help="deliver the instants of a past range")
        backfill.add_argument("schedule", help="name or id")
        backfill.add_argument("--start", required=True, help="ISO 8601 (UTC if no offset)")
        backfill.add_argument("--end", required=True, help="ISO 8601 (UTC if no offset)")
        backfill.add_argument("--overlap", choices=OverlapPolicy.values, default=None)
        add_tenant_argument(backfill)

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_from(options)
        try:
            getattr(self, "do_" + options["action"])(tenant, options)
        except ServiceError as exc:
            raise fail(exc) from None

    def _line(self, schedule: Schedule) -> str:
        state = "enabled" if schedule.enabled else "paused"
        nxt = schedule.next_run_at.isoformat() if schedule.next_run_at else "-"
        return (
            f"{schedule.name}  {schedule.workflow_name}  {schedule.cron!r} {schedule.timezone}  "
            f"{state}  next {nxt}  overlap {schedule.overlap_policy}  id {schedule.id}"
        )

    def do_list(self, tenant: Tenant, options: dict[str, Any]) -> None:
        with tenant_context(tenant.id):
            found = list(Schedule.objects.filter(tenant_id=tenant.id).order_by("name"))
        for schedule in found:
            self.stdout.write(self._line(schedule))
        if not found:
            self.stderr.write("no schedules")

    def do_create(self, tenant: Tenant, options: dict[str, Any]) -> None:
        made = services.create_schedule(
            tenant,
            operator=OPERATOR,
            name=options["name"],
            workflow_name=options["workflow"],
            workflow_version=options["workflow_version"],
            workflow_tag=options["workflow_tag"],
            entry_point=options["entry_point"],
            cron=options["cron"],
            timezone=options["timezone"],
            input=parse_json_option(options["input"], "input"),
            enabled=not options["disabled"],
            misfire_policy=options["misfire"],
            catch_up_limit=options["catch_up_limit"],
            overlap_policy=options["overlap"],
            pause_on_failure=options["pause_on_failure"],
            notes=options["notes"],
        )
        self.stdout.write(self._line(made))

    def do_preview(self, tenant: Tenant, options: dict[str, Any]) -> None:
        after = _when(options["after"], "after")
        if options["cron"] is not None:
            if options["schedule"]:
                raise CommandError("give a schedule or --cron, not both")
            cron, zone = options["cron"], options["timezone"]
            instants = services.preview_expression(cron, zone, count=options["count"], after=after)
        elif options["schedule"]:
            found = services.get_schedule(tenant, options["schedule"])
            cron, zone = found.cron, found.timezone
            instants = services.preview_schedule(tenant, found, count=options["count"], after=after)
        else:
            raise CommandError("give a schedule (name or id) or --cron")
        local = services.timing_for(cron, zone).zone
        for instant in instants:
            self.stdout.write(f"{instant.astimezone(local).isoformat()}  ({instant.isoformat()})")

    def do_pause(self, tenant: Tenant, options: dict[str, Any]) -> None:
        found = services.pause_schedule(
            tenant, options["schedule"], reason=options["reason"], operator=OPERATOR
        )
        self.stdout.write(self._line(found))

    def do_resume(self, tenant: Tenant, options: dict[str, Any]) -> None:
        found = services.resume_schedule(
            tenant, options["schedule"], reason=options["reason"], operator=OPERATOR
        )
        self.stdout.write(self._line(found))

    def do_delete(self, tenant: Tenant, options: dict[str, Any]) -> None:
        services.delete_schedule(
            tenant, options["schedule"], operator=OPERATOR, reason=options["reason"]
        )
        self.stdout.write(f"deleted {options['schedule']}")

    def do_trigger(self, tenant: Tenant, options: dict[str, Any]) -> None:
        made = services.trigger_schedule(
            tenant, options["schedule"], overlap_policy=options["overlap"], operator=OPERATOR
        )
        for line in _describe(made):
            self.stdout.write(line)

    def do_backfill(self, tenant: Tenant, options: dict[str, Any]) -> None:
        start, end = _when(options["start"], "start"), _when(options["end"], "end")
        assert start is not None and end is not None  # required options
        made = services.backfill_schedule(
            tenant,
            options["schedule"],
            start,
            end,
            overlap_policy=options["overlap"],
            operator=OPERATOR,
        )
        for line in _describe(made):
            self.stdout.write(line)
