"""The schedules' REST serializers (``/api/v1/schedules``): output shapes, and inputs that
check types and bounds only -- every rule about a schedule is ``schedules.services``'s, whose
errors name the offending field.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from schedules import services as schedule_services
from schedules.models import MisfirePolicy, OverlapPolicy, Schedule
from workflows.api.serializers import (
    INT32_MAX,
    MAX_REASON,
    NAME_PATTERN,
    TAG_PATTERN,
    JsonTextField,
    KnownFieldsOnly,
)

MAX_NOTES = 10_000
# Dates and times are checked by the services (1970-2199, a UTC offset once parsed), which the
# admin and the command line share.
_INSTANT_HELP = "ISO 8601, from 1970 to 2199 (without an offset: the server's TIME_ZONE)."

_CRON_HELP = (
    "Five fields (minute hour day-of-month month day-of-week) or @hourly, @daily, @weekly, "
    "@monthly, @yearly, evaluated on the wall clock of `timezone`. An expression that can "
    "never fire (`0 0 30 2 *`) is refused."
)


# --- output --------------------------------------------------------------------------------------


class ScheduleSerializer(serializers.ModelSerializer):
    input = JsonTextField()
    buffered = serializers.IntegerField(
        source="buffered_count",
        read_only=True,
        help_text="Instants waiting for the previous run (buffer_one, buffer_all).",
    )

    class Meta:
        model = Schedule
        fields = [
            "id",
            *schedule_services.EDITABLE_FIELDS,
            "next_run_at",
            "last_run_at",
            "last_run_id",
            "buffered",
            "created_by_run",
            "created_at",
        ]
        read_only_fields = fields


class DeliverySerializer(serializers.Serializer):
    instant = serializers.DateTimeField(help_text="The instant delivered (UTC).")
    outcome = serializers.ChoiceField(
        choices=["started", "existing", "skipped", "buffered", "dropped"],
        help_text="started; existing: this instant's run already existed; skipped (overlap "
        "policy skip); buffered; dropped (buffer_one already holds one).",
    )
    run_id = serializers.UUIDField(allow_null=True)
    replaced = serializers.ListField(
        child=serializers.UUIDField(),
        help_text="Runs cancelled or terminated for this one (cancel_other, terminate_other).",
    )


class DeliveriesSerializer(serializers.Serializer):
    schedule = serializers.CharField()
    deliveries = DeliverySerializer(many=True)


class FireTimesSerializer(serializers.Serializer):
    cron = serializers.CharField()
    timezone = serializers.CharField()
    fire_times = serializers.ListField(
        child=serializers.DateTimeField(), help_text="The next instants, in UTC, oldest first."
    )
    local_times = serializers.ListField(
        child=serializers.CharField(), help_text="The same instants on the zone's wall clock."
    )


# --- input ---------------------------------------------------------------------------------------


class ScheduleWriteSerializer(serializers.Serializer):
    """A schedule's settable fields. Omitted on create (and on PUT): the defaults; on PATCH:
    unchanged. Read-only fields sent back (``id``, ``next_run_at``…) are ignored."""

    name = serializers.RegexField(NAME_PATTERN, max_length=128, help_text="Unique in the tenant.")
    workflow_name = serializers.RegexField(
        NAME_PATTERN, max_length=128, help_text="The definition each run starts."
    )
    workflow_version = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=INT32_MAX, help_text="Pin one."
    )
    workflow_tag = serializers.RegexField(
        TAG_PATTERN, max_length=64, required=False, allow_blank=True, help_text="Or a tag."
    )
    entry_point = serializers.CharField(required=False, max_length=128, help_text="Default run.")
    cron = serializers.CharField(max_length=128, help_text=_CRON_HELP)
    timezone = serializers.CharField(
        required=False, max_length=64, help_text="IANA zone name; default UTC."
    )
    input = serializers.JSONField(
        required=False, allow_null=True, help_text="JSON passed to every run."
    )
    enabled = serializers.BooleanField(required=False)
    misfire_policy = serializers.ChoiceField(
        choices=MisfirePolicy.choices, required=False, help_text="Default catch_up."
    )
    catch_up_limit = serializers.IntegerField(
        required=False, min_value=1, max_value=schedule_services.MAX_CATCH_UP_LIMIT
    )
    overlap_policy = serializers.ChoiceField(
        choices=OverlapPolicy.choices, required=False, help_text="Default allow."
    )
    pause_on_failure = serializers.BooleanField(required=False)
    notes = serializers.CharField(
        required=False, allow_blank=True, max_length=MAX_NOTES, trim_whitespace=False
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if isinstance(self.initial_data, dict):
            known = set(self.fields) | set(ScheduleSerializer.Meta.fields)
            unknown = sorted(str(key) for key in self.initial_data if key not in known)
            if unknown:
                raise serializers.ValidationError(
                    {unknown[0]: "This is not a field of a schedule."}, code="invalid"
                )
        if attrs.get("workflow_version") is not None and attrs.get("workflow_tag"):
            raise serializers.ValidationError(
                {"workflow_tag": "Give a workflow_version or a workflow_tag, not both."}
            )
        return attrs


class ScheduleFilterSerializer(serializers.Serializer):
    enabled = serializers.BooleanField(required=False, allow_null=True, default=None)
    workflow_name = serializers.RegexField(NAME_PATTERN, max_length=128, required=False)
    search = serializers.CharField(
        required=False, max_length=128, help_text="Text contained in the name or the notes."
    )


class PreviewQuerySerializer(serializers.Serializer):
    count = serializers.IntegerField(
        required=False, default=5, min_value=1, max_value=schedule_services.MAX_PREVIEW
    )
    after = serializers.DateTimeField(required=False, help_text=_INSTANT_HELP + " Default: now.")


class ExpressionPreviewSerializer(KnownFieldsOnly):
    cron = serializers.CharField(max_length=128, help_text=_CRON_HELP)
    timezone = serializers.CharField(required=False, default="UTC", max_length=64)
    count = serializers.IntegerField(
        required=False, default=5, min_value=1, max_value=schedule_services.MAX_PREVIEW
    )
    after = serializers.DateTimeField(required=False, help_text=_INSTANT_HELP + " Default: now.")


class TriggerSerializer(KnownFieldsOnly):
    overlap_policy = serializers.ChoiceField(
        choices=OverlapPolicy.choices,
        required=False,
        help_text="Use this overlap policy instead of the schedule's.",
    )


class BackfillSerializer(TriggerSerializer):
    start = serializers.DateTimeField(
        help_text=_INSTANT_HELP + " The first instant considered (inclusive)."
    )
    end = serializers.DateTimeField(
        help_text=_INSTANT_HELP + " The last instant considered (inclusive); not after start "
        "and not in the future."
    )


class DeleteSerializer(KnownFieldsOnly):
    reason = serializers.CharField(
        required=False, allow_blank=True, max_length=MAX_REASON, default=""
    )
