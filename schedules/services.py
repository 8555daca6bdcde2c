"""Operations on schedules: what the REST API, the admin and the commands call. Nothing
durable happens anywhere else (an admin form or a serializer validates through
:func:`validate_schedule` and saves through these).

Every function takes the tenant explicitly and runs in its tenant context. Errors are the
:class:`workflows.services.ServiceError` family with the offending ``field``: a bad cron
expression is ``InvalidInput(field="cron")`` whose message names the cron field (``minute
field '61': 61 is outside 0-59``), an unknown zone ``field="timezone"``, and so on.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone as dj_timezone

from engine.policies import Quota, quota_refusal
from schedules.cron import CronError, CronSchedule, compile_cron
from schedules.models import MisfirePolicy, OverlapPolicy, Schedule
from schedules.scheduler import Delivery, append_note, deliver
from workflows.definitions import resolve_definition
from workflows.models import AuditLog, Tenant
from workflows.policies import quotas_for
from workflows.services import (
    Conflict,
    InvalidInput,
    NotFound,
    ServiceError,
    check_name,
    json_text,
)
from workflows.tenancy import tenant_context

MAX_CATCH_UP_LIMIT = 10_000
# Most runs one backfill call may start, when CLEAT_MAX_BACKFILL_RUNS does not say: each is a
# run in the tenant's queue, so a wider range is several calls (and several audit rows).
MAX_BACKFILL_INSTANTS = 100
MAX_PREVIEW = 100

# Fields an operator sets (the scheduler owns next_run_at, last_run_*, the buffer).
EDITABLE_FIELDS = (
    "name",
    "workflow_name",
    "workflow_version",
    "workflow_tag",
    "entry_point",
    "cron",
    "timezone",
    "input",
    "enabled",
    "misfire_policy",
    "catch_up_limit",
    "overlap_policy",
    "pause_on_failure",
    "notes",
)
DEFAULTS: dict[str, Any] = {
    "workflow_version": None,
    "workflow_tag": "",
    "entry_point": "run",
    "timezone": "UTC",
    "input": None,
    "enabled": True,
    "misfire_policy": MisfirePolicy.CATCH_UP.value,
    "catch_up_limit": 60,
    "overlap_policy": OverlapPolicy.ALLOW.value,
    "pause_on_failure": False,
    "notes": "",
}


# Routes under /api/v1/schedules/ that a name would shadow.
RESERVED_NAMES = frozenset({"preview"})
# Instants the cron math is asked about stay within these: far enough for any real backfill
# or preview, and clear of datetime's limits once a zone's offset is applied.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)


def _looks_like_an_id(name: str) -> bool:
    try:
        uuid.UUID(name)
    except ValueError:
        return False
    return True


def _instant(value: Any, field: str) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidInput(f"{field} must be a date and time with a UTC offset", field)
    if not EARLIEST <= value < LATEST:
        raise InvalidInput(f"{field} must be from 1970 to 2199, not {value.isoformat()}", field)
    return value


class QuotaExceeded(Conflict):
    code = "quota_exceeded"
    http_status = 409


def _audit(
    tenant: Tenant, schedule: Schedule, action: str, operator: str, reason: str = "", **more: Any
) -> None:
    """An audit row for a change to a schedule, in the caller's transaction."""
    AuditLog.record(
        tenant,
        f"schedule_{action}",
        operator,
        reason,
        schedule=schedule.name,
        schedule_id=str(schedule.id),
        **more,
    )


# --- validation ----------------------------------------------------------------------------------


def timing_for(cron: str, timezone: str) -> CronSchedule:
    """The compiled schedule, or InvalidInput naming ``cron`` or ``timezone``."""
    if not isinstance(cron, str) or not cron.strip():
        raise InvalidInput("cron: an expression is required (e.g. '0 9 * * 1-5' or @daily)", "cron")
    if not isinstance(timezone, str):
        raise InvalidInput("timezone must be an IANA zone name such as Europe/London", "timezone")
    try:
        return compile_cron(cron, timezone or "UTC")
    except CronError as exc:
        if exc.field == "cron":
            raise InvalidInput(f"cron {cron!r} is invalid: {exc.message}", "cron") from None
        raise InvalidInput(f"timezone: {exc.message}", "timezone") from None


def _choice(value: Any, field: str, allowed: list[str]) -> str:
    if value not in allowed:
        raise InvalidInput(f"{field} must be one of {', '.join(allowed)}, not {value!r}", field)
    return str(value)


def _integer(value: Any, field: str, low: int, high: int, *, optional: bool = False) -> int | None:
    if value in (None, "") and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidInput(f"{field} must be an integer from {low} to {high}", field)
    try:
        number = int(value)
    except ValueError:
        raise InvalidInput(f"{field} must be an integer from {low} to {high}", field) from None
    if not low <= number <= high:
        raise InvalidInput(f"{field} must be from {low} to {high}, not {number}", field)
    return number


def _text(value: Any, field: str, max_length: int, *, required: bool = False) -> str:
    text = "" if value is None else value
    if not isinstance(text, str):
        raise InvalidInput(f"{field} must be a string", field)
    if required and not text:
        raise InvalidInput(f"{field} is required", field)
    if len(text) > max_length:
        raise InvalidInput(f"{field} is longer than {max_length} characters", field)
    return text


def validate_schedule(
    tenant: Tenant,
    values: dict[str, Any],
    *,
    schedule_id: uuid.UUID | None = None,
    check_definition: bool = True,
) -> dict[str, Any]:
    """Check every field of a schedule (defaults filled in) and return the values to store.
    Raises InvalidInput / NotFound / Conflict naming the first offending field. Call it in
    the tenant's context (it reads the definitions)."""
    unknown = set(values) - set(EDITABLE_FIELDS)
    if unknown:
        field = sorted(unknown)[0]
        raise InvalidInput(f"{field} is not a schedule field that can be set", field)
    merged = {**DEFAULTS, **values}
    clean: dict[str, Any] = {}
    clean["name"] = _text(merged.get("name"), "name", 128, required=True)
    check_name(clean["name"], "name")
    if clean["name"] in RESERVED_NAMES or _looks_like_an_id(clean["name"]):
        raise InvalidInput(
            f"name {clean['name']!r} cannot be used: schedules are addressed by id or name, "
            "and this one reads as an id or a route",
            "name",
        )
    taken = Schedule.objects.filter(tenant_id=tenant.id, name=clean["name"])
    if schedule_id is not None:
        taken = taken.exclude(id=schedule_id)
    if taken.exists():
        raise Conflict(f"a schedule named {clean['name']!r} already exists", "name")
    timing = timing_for(merged.get("cron") or "", merged.get("timezone") or "UTC")
    clean["cron"], clean["timezone"] = " ".join(timing.expression.split()), timing.timezone
    clean["misfire_policy"] = _choice(
        merged["misfire_policy"], "misfire_policy", MisfirePolicy.values
    )
    clean["overlap_policy"] = _choice(
        merged["overlap_policy"], "overlap_policy", OverlapPolicy.values
    )
    clean["catch_up_limit"] = _integer(
        merged["catch_up_limit"], "catch_up_limit", 1, MAX_CATCH_UP_LIMIT
    )
    clean["workflow_version"] = _integer(
        merged["workflow_version"], "workflow_version", 1, 2**31 - 1, optional=True
    )
    clean["workflow_tag"] = _text(merged["workflow_tag"], "workflow_tag", 64)
    if clean["workflow_version"] is not None and clean["workflow_tag"]:
        raise InvalidInput(
            "give a workflow_version or a workflow_tag, not both (set the other to null/empty)",
            "workflow_tag",
        )
    clean["entry_point"] = _text(merged["entry_point"], "entry_point", 128) or "run"
    clean["input"] = json_text(merged["input"], "input")
    clean["notes"] = _text(merged["notes"], "notes", 10_000)
    for flag in ("enabled", "pause_on_failure"):
        if not isinstance(merged[flag], bool):
            raise InvalidInput(f"{flag} must be true or false", flag)
        clean[flag] = merged[flag]
    clean["workflow_name"] = _text(merged.get("workflow_name"), "workflow_name", 128, required=True)
    if not check_definition:
        return clean
    try:
        definition = resolve_definition(
            tenant,
            clean["workflow_name"],
            version=clean["workflow_version"],
            tag=clean["workflow_tag"] or None,
        )
    except NotFound as exc:
        renamed = {
            "definition": "workflow_name",
            "version": "workflow_version",
            "tag": "workflow_tag",
        }
        raise NotFound(exc.message, renamed.get(exc.field or "", "workflow_name")) from None
    if clean["entry_point"] not in (definition.entry_points or []):
        raise InvalidInput(
            f"{definition.name} version {definition.version} has no entry point "
            f"{clean['entry_point']!r} (it exports: {', '.join(definition.entry_points)})",
            "entry_point",
        )
    return clean


# --- reading ---------------------------------------------------------------------------------


def get_schedule(
    tenant: Tenant, schedule: str | uuid.UUID | Schedule, *, lock: bool = False
) -> Schedule:
    """A schedule by id or name (NotFound naming ``schedule``). ``lock``: locked for the
    caller's transaction (call it inside the tenant context then)."""
    key = schedule.id if isinstance(schedule, Schedule) else schedule
    query = Schedule.objects.filter(tenant_id=tenant.id)
    try:
        query = query.filter(id=uuid.UUID(str(key)))
    except ValueError:
        query = query.filter(name=str(key))
    if lock:
        query = query.select_for_update()
    with tenant_context(tenant.id):
        found = query.first()
    if found is None:
        raise NotFound(f"no schedule {key}", "schedule")
    return found


def preview_expression(
    cron: str, timezone: str = "UTC", *, count: int = 5, after: datetime | None = None
) -> list[datetime]:
    """The next ``count`` instants of an expression (for forms); InvalidInput naming the
    field for a bad expression or zone."""
    count = _integer(count, "count", 1, MAX_PREVIEW) or 5
    after = _instant(after, "after") if after is not None else dj_timezone.now()
    return timing_for(cron, timezone).preview(after, count)


def preview_schedule(
    tenant: Tenant,
    schedule: str | uuid.UUID | Schedule,
    *,
    count: int = 5,
    after: datetime | None = None,
) -> list[datetime]:
    with tenant_context(tenant.id):
        found = get_schedule(tenant, schedule)
    return preview_expression(found.cron, found.timezone, count=count, after=after)


# --- writing ---------------------------------------------------------------------------------


def create_schedule(
    tenant: Tenant, *, now: datetime | None = None, operator: str = "system", **values: Any
) -> Schedule:
    """Create a schedule (fields as in :data:`EDITABLE_FIELDS`; ``name``, ``workflow_name``
    and ``cron`` required). Its first instant is the first after ``now``."""
    now = now or dj_timezone.now()
    with tenant_context(tenant.id):
        clean = validate_schedule(tenant, values)
        refusal = quota_refusal(
            quotas_for(tenant.id),
            Quota.SCHEDULES,
            Schedule.objects.filter(tenant_id=tenant.id).count(),
        )
        if refusal is not None:
            raise QuotaExceeded(refusal, "name")
        timing = compile_cron(clean["cron"], clean["timezone"])
        try:
            with transaction.atomic():
                created = Schedule.objects.create(
                    tenant=tenant, next_run_at=timing.next_after(now), **clean
                )
        except IntegrityError:
            raise Conflict(f"a schedule named {clean['name']!r} already exists", "name") from None
        _audit(tenant, created, "created", operator, cron=created.cron, timezone=created.timezone)
    return created


def update_schedule(
    tenant: Tenant,
    schedule: str | uuid.UUID | Schedule,
    *,
    now: datetime | None = None,
    operator: str = "system",
    **changes: Any,
) -> Schedule:
    """Change some fields. A new expression or zone, or enabling a disabled schedule,
    restarts it at its first instant after ``now`` (nothing missed meanwhile is owed)."""
    now = now or dj_timezone.now()
    with tenant_context(tenant.id):
        found = get_schedule(tenant, schedule, lock=True)
        current = {name: getattr(found, name) for name in EDITABLE_FIELDS}
        # The definition is checked when what the schedule starts changes: pausing or
        # renaming a schedule whose workflow was removed since must still be possible.
        starts = {"workflow_name", "workflow_version", "workflow_tag", "entry_point"}
        check = any(changes[k] != current[k] for k in starts if k in changes) or (
            changes.get("enabled") is True and not found.enabled
        )
        clean = validate_schedule(
            tenant, {**current, **changes}, schedule_id=found.id, check_definition=check
        )
        restart = (
            clean["cron"] != found.cron
            or clean["timezone"] != found.timezone
            or (clean["enabled"] and not found.enabled)
        )
        for name, value in clean.items():
            setattr(found, name, value)
        if restart:
            found.next_run_at = compile_cron(found.cron, found.timezone).next_after(now)
        changed = sorted(name for name, value in clean.items() if current[name] != value)
        try:
            with transaction.atomic():
                found.save()
        except IntegrityError:
            raise Conflict(f"a schedule named {clean['name']!r} already exists", "name") from None
        if changed:
            _audit(tenant, found, "updated", operator, fields=changed)
    return found


def delete_schedule(
    tenant: Tenant,
    schedule: str | uuid.UUID | Schedule,
    *,
    operator: str = "system",
    reason: str = "",
) -> None:
    with tenant_context(tenant.id):
        found = get_schedule(tenant, schedule, lock=True)
        _audit(tenant, found, "deleted", operator, reason)
        found.delete()


def pause_schedule(
    tenant: Tenant,
    schedule: str | uuid.UUID | Schedule,
    *,
    reason: str = "",
    operator: str = "api",
    now: datetime | None = None,
) -> Schedule:
    """Disable it (idempotent); the reason goes into its notes."""
    now = now or dj_timezone.now()
    with tenant_context(tenant.id):
        found = get_schedule(tenant, schedule, lock=True)
        if found.enabled:
            found.enabled = False
            found.notes = append_note(
                found.notes, now, f"paused by {operator}" + (f": {reason}" if reason else "")
            )
            found.save(update_fields=["enabled", "notes"])
            _audit(tenant, found, "paused", operator, reason)
    return found


def resume_schedule(
    tenant: Tenant,
    schedule: str | uuid.UUID | Schedule,
    *,
    operator: str = "api",
    reason: str = "",
    now: datetime | None = None,
) -> Schedule:
    """Enable it (idempotent) at its first instant after ``now``: what it would have fired
    while paused is not owed (use :func:`backfill_schedule` for that)."""
    now = now or dj_timezone.now()
    with tenant_context(tenant.id):
        found = get_schedule(tenant, schedule, lock=True)
        if not found.enabled:
            timing = timing_for(found.cron, found.timezone)
            found.enabled = True
            found.next_run_at = timing.next_after(now)
            found.notes = append_note(
                found.notes, now, f"resumed by {operator}" + (f": {reason}" if reason else "")
            )
            found.save(update_fields=["enabled", "next_run_at", "notes"])
            _audit(tenant, found, "resumed", operator, reason)
    return found


def _policy(value: str | None) -> str | None:
    if value is None:
        return None
    return _choice(value, "overlap_policy", OverlapPolicy.values)


def trigger_schedule(
    tenant: Tenant,
    schedule: str | uuid.UUID | Schedule,
    *,
    now: datetime | None = None,
    overlap_policy: str | None = None,
    operator: str = "system",
) -> list[Delivery]:
    """Fire now, off the cron (works on a disabled schedule too), honouring the overlap
    policy (``overlap_policy`` overrides it). The instant is ``now``."""
    now = now or dj_timezone.now()
    policy = _policy(overlap_policy)
    with tenant_context(tenant.id):
        found = get_schedule(tenant, schedule, lock=True)
        made = deliver(found, tenant, now, now, policy=policy)
        _audit(tenant, found, "triggered", operator, outcomes=[d.outcome for d in made])
        return made


def max_backfill_runs() -> int:
    return int(getattr(settings, "CLEAT_MAX_BACKFILL_RUNS", 0) or MAX_BACKFILL_INSTANTS)


def backfill_schedule(
    tenant: Tenant,
    schedule: str | uuid.UUID | Schedule,
    start: datetime,
    end: datetime,
    *,
    now: datetime | None = None,
    overlap_policy: str | None = None,
    max_instants: int | None = None,
    operator: str = "system",
) -> list[Delivery]:
    """Deliver every instant ``start <= i <= end`` the schedule names, oldest first, each
    under the overlap policy (so ``skip`` delivers the first and skips those that find it
    still going, ``buffer_all`` queues them behind one another). An instant that already
    fired returns its existing run (the start idempotency key is per instant)."""
    now = now or dj_timezone.now()
    if max_instants is None:
        max_instants = max_backfill_runs()
    policy = _policy(overlap_policy)
    start, end = _instant(start, "start"), _instant(end, "end")
    if end < start:
        raise InvalidInput("end is before start", "end")
    if end > now:
        raise InvalidInput("end is in the future: a backfill covers instants already past", "end")
    with tenant_context(tenant.id):
        found = get_schedule(tenant, schedule, lock=True)
        timing = timing_for(found.cron, found.timezone)
        instants = timing.between(start, end, max_instants)
        if len(instants) > max_instants:
            raise InvalidInput(
                f"the range holds more than {max_instants} instants of {found.cron!r}, the "
                "most one backfill may start (CLEAT_MAX_BACKFILL_RUNS); backfill a shorter range",
                "end",
            )
        made: list[Delivery] = []
        for instant in instants:
            made += deliver(found, tenant, instant, now, policy=policy)
        _audit(
            tenant,
            found,
            "backfilled",
            operator,
            start=start.isoformat(),
            end=end.isoformat(),
            instants=len(instants),
        )
    return made


__all__ = [
    "EDITABLE_FIELDS",
    "QuotaExceeded",
    "ServiceError",
    "backfill_schedule",
    "create_schedule",
    "delete_schedule",
    "get_schedule",
    "pause_schedule",
    "preview_expression",
    "preview_schedule",
    "resume_schedule",
    "timing_for",
    "trigger_schedule",
    "update_schedule",
    "validate_schedule",
]
