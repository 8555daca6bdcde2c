"""What the API reads and writes. Output serializers list their fields explicitly and redact
sensitive values on the way out (``engine.redaction``); input serializers only validate --
nothing durable happens in a serializer: the views hand the validated data to the services.

Integers that reach the database are bounded to 32 bits (every backend stores them; none
should see an overflow), and strings to the column sizes, so bad input is a 400 on SQLite,
PostgreSQL and MariaDB alike.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from engine import lifecycle
from engine.errors import ErrorCode
from engine.events import CodecError, EncodedEvent, decode
from engine.storable import parse_readable, readable
from workflows.crypto import shown
from workflows.models import (
    NAME_PATTERN,
    PRIORITY_MAX,
    PRIORITY_MIN,
    ChildBinding,
    Promise,
    RoutingRule,
    RunStatus,
    Signal,
    UpdateRequest,
    VersionTag,
    WorkerProcess,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
)
from workflows.redaction import embedded_json, redacted_payload, redactor

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
MAX_REASON = 2000
MAX_UPDATE_WAIT_SECONDS = 30.0


def json_text(value: Any) -> str:
    """A parsed JSON value as the text the services store."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# --- input ---------------------------------------------------------------------------------------


class KnownFieldsOnly(serializers.Serializer):
    """A request body (or a write's options) whose every field the endpoint knows: any other
    is a 400 naming it, where DRF would drop it silently (``inptu`` for ``input`` would
    start a run with no input)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(str(key) for key in data if key not in self.fields)
            if unknown:
                raise serializers.ValidationError(
                    {unknown[0]: "This is not a field of this request."}, code="unknown_field"
                )
        return super().to_internal_value(data)


# --- output fields -------------------------------------------------------------------------------


@extend_schema_field({"description": "Any JSON value (sensitive fields redacted)."})
class JsonTextField(serializers.Field):
    """A JSON document stored as text, returned parsed, with sensitive values redacted."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["read_only"] = True
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> Any:
        value = shown(value)  # a payload whose key is missing: its placeholder
        if value == "":
            return None
        try:
            parsed = parse_readable(value)
        except (TypeError, ValueError):
            return redactor().string(readable(str(value)))
        return redactor().value(parsed)


@extend_schema_field({"description": "Any JSON value (sensitive fields redacted)."})
class RedactedJsonField(serializers.Field):
    """A JSON column (already parsed), with sensitive values redacted."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["read_only"] = True
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> Any:
        value = shown(value)  # a payload whose key is missing: its placeholder
        return redactor().value(readable(value))


def parse_state(value: Any) -> Any:
    """A query-state value as stored (JSON text), parsed; other values as they are. A lone
    surrogate (stored before the host refused them) reads as U+FFFD."""
    if isinstance(value, str):
        try:
            return parse_readable(value)
        except ValueError:
            return readable(value)
    return readable(value)


@extend_schema_field(
    {"type": "object", "additionalProperties": True, "description": "Key -> JSON value."}
)
class QueryStateField(serializers.Field):
    """A run's query state: each value (JSON text) parsed, sensitive values redacted."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["read_only"] = True
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> Any:
        value = shown(value)  # a payload whose key is missing: its placeholder
        if not isinstance(value, dict):
            return {}
        return redactor().value({k: parse_state(v) for k, v in value.items()})


@extend_schema_field(OpenApiTypes.STR)
class RedactedTextField(serializers.Field):
    """Free text (an error message, an event payload) with sensitive values redacted."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["read_only"] = True
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> str:
        value = shown(value)  # a payload whose key is missing: its placeholder
        return redactor().string(readable(str(value)))


# --- errors (documentation of the shape the exception handler renders) --------------------------


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Stable machine-readable code, e.g. `not_found`.")
    message = serializers.CharField(help_text="What is wrong, for a person.")
    field = serializers.CharField(
        allow_null=True, help_text="The input field at fault, when there is one."
    )


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


# --- definitions ---------------------------------------------------------------------------------


class DefinitionSerializer(serializers.ModelSerializer):
    active_runs = serializers.IntegerField(
        read_only=True, help_text="Runs of this version that are ready, running or paused."
    )

    class Meta:
        model = WorkflowDefinition
        fields = [
            "name",
            "version",
            "sha256",
            "size",
            "kind",
            "abi_version",
            "min_version",
            "entry_points",
            "plugin_dependencies",
            "plugin_versions",
            "max_history_length",
            "retry_max_attempts",
            "retry_initial_interval_s",
            "retry_backoff_coefficient",
            "retry_max_interval_s",
            "deprecated",
            "child_binding",
            "child_versions",
            "allowed_signal_callers",
            "active_runs",
            "created_at",
        ]
        read_only_fields = fields


class DeployOptionsSerializer(KnownFieldsOnly):
    """Deploy options: form fields of a multipart upload, or query parameters of a raw body."""

    name = serializers.RegexField(NAME_PATTERN, max_length=128, help_text="Workflow name.")
    version = serializers.IntegerField(
        required=False, min_value=1, max_value=INT32_MAX, help_text="Default: latest + 1."
    )
    min_version = serializers.IntegerField(required=False, min_value=0, max_value=INT32_MAX)
    max_history_length = serializers.IntegerField(required=False, min_value=0, max_value=INT32_MAX)
    retry_max_attempts = serializers.IntegerField(required=False, min_value=1, max_value=1000)
    child_binding = serializers.ChoiceField(
        choices=ChildBinding.choices,
        required=False,
        allow_blank=True,
        help_text="How this version's children get their versions: frozen, stable, latest, "
        "or empty (the parent's version, else the newest compatible).",
    )
    child_versions = serializers.JSONField(
        required=False,
        binary=True,
        help_text='With child_binding frozen: {"child name": version}, as a JSON object.',
    )
    plugin_dependencies = serializers.JSONField(
        required=False,
        binary=True,
        help_text='Semver constraints on plugins, as a JSON object ({"llm": ">=1.2.0"}), '
        "resolved at deploy to the newest configured versions that satisfy them.",
    )
    allowed_signal_callers = serializers.JSONField(
        required=False,
        binary=True,
        help_text="With CLEAT_REQUIRE_SIGNAL_AUTH on: the workflows whose runs may signal "
        'this version\'s runs, as a JSON array (["billing"]); none given: no workflow may.',
    )


class DeployUploadSerializer(DeployOptionsSerializer):
    wasm = serializers.FileField(help_text="The module (.wasm).")


class DefinitionNameSerializer(serializers.Serializer):
    name = serializers.CharField()
    latest_version = serializers.IntegerField()
    versions = serializers.ListField(child=serializers.IntegerField())
    deprecated_versions = serializers.ListField(child=serializers.IntegerField())
    tags = serializers.DictField(child=serializers.IntegerField())
    routing = serializers.ListField(child=serializers.DictField())


class ReasonSerializer(KnownFieldsOnly):
    reason = serializers.CharField(
        required=False, allow_blank=True, max_length=MAX_REASON, default=""
    )


class RetryRequestSerializer(ReasonSerializer):
    mode = serializers.ChoiceField(
        choices=list(lifecycle.RETRY_MODES),
        required=False,
        default=lifecycle.RETRY_REPLAY,
        help_text="`replay` (default): replay the history, making again only a last call "
        "that failed retryably. `reexecute_last_call`: also make again a last call that "
        "failed permanently (a service configured wrongly, since fixed).",
    )


class RetryPlanSerializer(serializers.Serializer):
    mode = serializers.CharField()
    forgets_step = serializers.IntegerField(
        allow_null=True, help_text="The step executed again rather than replayed, if any."
    )
    effect = serializers.CharField(help_text="What the worker will do with the run.")


class PurgeResultSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.IntegerField()
    runs_deleted = serializers.IntegerField()


class TagSerializer(serializers.ModelSerializer):
    class Meta:
        model = VersionTag
        fields = ["tag", "version"]
        read_only_fields = fields


class SetTagSerializer(KnownFieldsOnly):
    tag = serializers.RegexField(TAG_PATTERN, max_length=64)
    version = serializers.IntegerField(min_value=1, max_value=INT32_MAX)


class RoutingRuleSerializer(KnownFieldsOnly, serializers.ModelSerializer):
    version = serializers.IntegerField(min_value=1, max_value=INT32_MAX)
    weight = serializers.FloatField(min_value=0.0, max_value=1e9)

    class Meta:
        model = RoutingRule
        fields = ["version", "weight"]


class RoutingRulesSerializer(KnownFieldsOnly):
    rules = RoutingRuleSerializer(many=True, help_text="An empty list removes routing.")


class GCRequestSerializer(KnownFieldsOnly):
    dry_run = serializers.BooleanField(default=True, help_text="Report only; delete nothing.")
    min_versions_to_keep = serializers.IntegerField(default=3, min_value=0, max_value=10_000)
    max_age_days = serializers.FloatField(
        default=30.0, min_value=0.0, max_value=36_500.0, help_text="Only older versions go."
    )
    name = serializers.RegexField(NAME_PATTERN, max_length=128, required=False)


class VersionRefSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.IntegerField()
    reason = serializers.CharField(allow_blank=True)


class GCResultSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField()
    removed = VersionRefSerializer(many=True)
    skipped = VersionRefSerializer(many=True)
    runs_deleted = serializers.IntegerField()


class StaleQuerySerializer(serializers.Serializer):
    stale_after_days = serializers.FloatField(default=30.0, min_value=0.0, max_value=36_500.0)
    purge_after_days = serializers.FloatField(default=90.0, min_value=0.0, max_value=36_500.0)


class StaleAlertSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.IntegerField()
    deprecated = serializers.BooleanField()
    active_instances = serializers.IntegerField()
    days_since_created = serializers.IntegerField()
    message = serializers.CharField()


class DefinitionListQuerySerializer(serializers.Serializer):
    name = serializers.RegexField(NAME_PATTERN, max_length=128, required=False)
    deprecated = serializers.BooleanField(required=False, allow_null=True, default=None)


# --- runs ----------------------------------------------------------------------------------------


class RunSerializer(serializers.ModelSerializer):
    definition = serializers.CharField(source="definition_name", read_only=True)
    version = serializers.IntegerField(source="definition_version", read_only=True)
    input = JsonTextField()
    result = JsonTextField(allow_null=True)
    error = RedactedTextField(allow_null=True)
    waiting_on = RedactedJsonField(allow_null=True)
    query_state = QueryStateField()
    events = serializers.IntegerField(source="event_count", read_only=True)
    compacted_events = serializers.IntegerField(
        read_only=True,
        help_text=(
            "How many of the first events are in the run's compaction checkpoint (0: none): "
            "`/events` pages through the rest, `/history` returns them all."
        ),
    )
    trace_id = serializers.CharField(
        read_only=True,
        allow_null=True,
        help_text="The W3C trace id of the run's spans (32 hex digits); null when not traced.",
    )
    parent = serializers.UUIDField(source="parent_id", read_only=True, allow_null=True)
    continued_from = serializers.UUIDField(
        source="continued_from_id", read_only=True, allow_null=True
    )
    continued_as = serializers.SerializerMethodField()
    detached_from = serializers.UUIDField(
        read_only=True,
        allow_null=True,
        help_text="The run that started this one with `run_detached` (its end wakes that run); "
        "null for a run started otherwise.",
    )

    class Meta:
        model = WorkflowInstance
        fields = [
            "id",
            "workflow_id",
            "definition",
            "version",
            "entry_point",
            "status",
            "input",
            "result",
            "error",
            "error_code",
            "waiting_on",
            "attempt",
            "generation",
            "priority",
            "task_queue",
            "events",
            "compacted_events",
            "query_state",
            "parent",
            "continued_from",
            "continued_as",
            "detached_from",
            "cancel_requested",
            "trace_id",
            "created_at",
            "started_at",
            "completed_at",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field({"type": "string", "format": "uuid", "nullable": True, "readOnly": True})
    def get_continued_as(self, instance: WorkflowInstance) -> str | None:
        try:
            successor = instance.continued_as
        except WorkflowInstance.DoesNotExist:
            return None
        return str(successor.id) if successor is not None else None


class RetriedRunSerializer(RunSerializer):
    """A retried run, as ``GET workflows/{run}`` shows it, with what its retry does."""

    retry = RetryPlanSerializer(source="retry_plan", read_only=True)

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "retry"]
        read_only_fields = fields


class StartRunSerializer(KnownFieldsOnly):
    definition = serializers.RegexField(NAME_PATTERN, max_length=128, help_text="Workflow name.")
    version = serializers.IntegerField(
        required=False, min_value=1, max_value=INT32_MAX, help_text="Pin a version."
    )
    tag = serializers.RegexField(TAG_PATTERN, max_length=64, required=False, help_text="Or a tag.")
    input = serializers.JSONField(
        required=False, default=None, allow_null=True, help_text="Any JSON value."
    )
    idempotency_key = serializers.CharField(
        required=False,
        max_length=255,
        help_text="Starting again with the same key returns the existing run (200).",
    )
    priority = serializers.IntegerField(
        required=False,
        default=0,
        min_value=PRIORITY_MIN,
        max_value=PRIORITY_MAX,
        help_text=(
            "Orders this tenant's own runs (claims take turns between tenants); at most the "
            "key's role allows (CLEAT_PRIORITY_MAX_BY_ROLE)."
        ),
    )
    task_queue = serializers.CharField(required=False, default="default", max_length=64)
    workflow_id = serializers.CharField(required=False, max_length=128)
    entry_point = serializers.CharField(required=False, default="run", max_length=128)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("version") is not None and attrs.get("tag"):
            raise serializers.ValidationError({"tag": "Give a version or a tag, not both."})
        return attrs


def _choices(values: list[str]) -> str:
    return ", ".join(values)


class RunFilterSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=RunStatus.choices, required=False)
    definition = serializers.RegexField(NAME_PATTERN, max_length=128, required=False)
    version = serializers.IntegerField(required=False, min_value=1, max_value=INT32_MAX)
    error_code = serializers.ChoiceField(
        choices=[(c.value, c.value) for c in ErrorCode], required=False
    )
    created_after = serializers.DateTimeField(required=False)
    created_before = serializers.DateTimeField(required=False)
    search = serializers.CharField(
        required=False, max_length=256, help_text="Text contained in the input or the error."
    )
    task_queue = serializers.CharField(required=False, max_length=64)


class SignalRequestSerializer(KnownFieldsOnly):
    name = serializers.CharField(max_length=256)
    payload = serializers.JSONField(required=False, default=None, allow_null=True)


class SignalSerializer(serializers.ModelSerializer):
    payload = JsonTextField()

    class Meta:
        model = Signal
        fields = ["id", "name", "payload", "created_at", "consumed_at"]
        read_only_fields = fields


class ForceCompleteSerializer(ReasonSerializer):
    generation = serializers.IntegerField(
        min_value=0, max_value=2**63 - 1, help_text="The generation you looked at (409 if stale)."
    )
    result = serializers.JSONField(required=False, default=None, allow_null=True)


class ForceFailSerializer(ReasonSerializer):
    generation = serializers.IntegerField(min_value=0, max_value=2**63 - 1)
    message = serializers.CharField(max_length=10_000)
    code = serializers.ChoiceField(choices=[(c.value, c.value) for c in ErrorCode], default="error")


class ReReplaySerializer(ReasonSerializer):
    generation = serializers.IntegerField(min_value=0, max_value=2**63 - 1)


class MoveVersionSerializer(ReasonSerializer):
    version = serializers.IntegerField(min_value=1, max_value=INT32_MAX)
    generation = serializers.IntegerField(required=False, min_value=0, max_value=2**63 - 1)


class UpdateRequestSerializer(KnownFieldsOnly):
    name = serializers.CharField(max_length=128)
    payload = serializers.JSONField(required=False, default=None, allow_null=True)
    wait_seconds = serializers.FloatField(
        required=False,
        default=10.0,
        min_value=0.0,
        max_value=MAX_UPDATE_WAIT_SECONDS,
        help_text="How long to wait for the handler's answer (0: do not wait).",
    )


class UpdateSerializer(serializers.ModelSerializer):
    result = JsonTextField(allow_null=True)

    class Meta:
        model = UpdateRequest
        fields = ["id", "name", "status", "result", "created_at", "completed_at"]
        read_only_fields = fields


class QueryStateQuerySerializer(serializers.Serializer):
    key = serializers.CharField(required=False, max_length=255)


class QueryStateSerializer(serializers.Serializer):
    key = serializers.CharField(allow_null=True)
    value = RedactedJsonField(allow_null=True)


class EventsQuerySerializer(serializers.Serializer):
    decoded = serializers.BooleanField(
        required=False, default=False, help_text="Add each event's decoded fields."
    )


class EventSerializer(serializers.ModelSerializer):
    type = serializers.CharField(source="event_type", read_only=True)
    payload = RedactedTextField(
        help_text="The stored payload, as the checksum covers it: compact JSON with short keys."
    )
    data = serializers.SerializerMethodField(
        help_text="The payload as a JSON object, the JSON its fields hold parsed "
        '(`"req": {"sku": "book"}`), sensitive values redacted.'
    )
    pending = serializers.BooleanField(read_only=True, help_text="A write-ahead intent.")
    decoded = serializers.SerializerMethodField()

    class Meta:
        model = WorkflowEvent
        fields = [
            "step",
            "type",
            "type_code",
            "timestamp_ms",
            "payload",
            "data",
            "checksum",
            "pending",
            "decoded",
        ]
        read_only_fields = fields

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "readOnly": True,
            "description": "With ?decoded=true: the event's fields by name, and a description.",
            "properties": {
                "description": {"type": "string"},
                "fields": {"type": "object", "additionalProperties": True},
                "decode_error": {"type": "string"},
            },
        }
    )
    @extend_schema_field({"description": "Any JSON value.", "readOnly": True})
    def get_data(self, event: WorkflowEvent) -> Any:
        return redacted_payload(event.payload)

    def get_decoded(self, event: WorkflowEvent) -> dict[str, Any] | None:
        if not self.context.get("decoded"):
            return None
        stored = EncodedEvent(
            event.step, event.type_code, event.timestamp_ms, event.payload, event.checksum
        )
        try:
            decoded = decode(stored)
        except CodecError as exc:
            return {"decode_error": str(exc)}
        fields = {
            f.name: list(value) if isinstance(value := getattr(decoded, f.name), tuple) else value
            for f in dataclasses.fields(decoded)
            if f.name not in ("step", "ts")
        }
        return {
            "description": redactor().string(decoded.describe()),
            "fields": redactor().value(embedded_json(fields)),
        }


# --- promises ------------------------------------------------------------------------------------


class PromiseSerializer(serializers.ModelSerializer):
    run_id = serializers.UUIDField(source="instance_id", read_only=True)
    value = JsonTextField(allow_null=True)
    error = RedactedTextField(allow_null=True)

    class Meta:
        model = Promise
        fields = ["id", "run_id", "name", "status", "value", "error", "created_at", "settled_at"]
        read_only_fields = fields


class ResolvePromiseSerializer(KnownFieldsOnly):
    value = serializers.JSONField(required=False, default=None, allow_null=True)


class RejectPromiseSerializer(KnownFieldsOnly):
    message = serializers.CharField(max_length=10_000)


# --- health --------------------------------------------------------------------------------------


class WorkerFilterSerializer(serializers.Serializer):
    stale = serializers.BooleanField(
        required=False, help_text="Only stale workers (true) or only live ones (false)."
    )


class WorkerSerializer(serializers.ModelSerializer):
    """A worker as it last reported itself; ``heartbeat_age_s`` and ``stale`` are computed
    against the database's clock at the time of the request."""

    heartbeat_age_s = serializers.SerializerMethodField()
    stale = serializers.SerializerMethodField()
    task_queues = serializers.ListField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = WorkerProcess
        fields = [
            "worker_id",
            "host",
            "pid",
            "task_queues",
            "concurrency",
            "runs_held",
            "started_at",
            "heartbeat_at",
            "heartbeat_interval_s",
            "heartbeat_age_s",
            "stale",
            "steps_total",
            "steps_per_s",
            "last_error_at",
        ]
        # The error text stays in the console (fleet staff): a loop's error can quote a
        # statement with another tenant's values, and every tenant's keys see this list.
        read_only_fields = fields

    def get_heartbeat_age_s(self, worker: WorkerProcess) -> float:
        return round(worker.heartbeat_age_s(self.context["now"]), 3)

    def get_stale(self, worker: WorkerProcess) -> bool:
        return worker.is_stale(self.context["now"])


class HealthSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["ok", "unavailable"])
    database = serializers.CharField()
    migrations = serializers.CharField()


# --- retention -----------------------------------------------------------------------------------

_RETENTION_HELP = "Days kept, 'off' to keep forever, or null to inherit."


@extend_schema_field(
    {
        "oneOf": [{"type": "integer", "minimum": 0}, {"type": "string", "enum": ["off"]}],
        "nullable": True,
        "description": _RETENTION_HELP,
    }
)
class RetentionDaysField(serializers.JSONField):
    """Days, ``"off"`` or null; the retention service checks the value and names the field."""


class DefinitionRetentionSerializer(serializers.Serializer):
    finished_days = RetentionDaysField(required=False, allow_null=True)
    dead_lettered_days = RetentionDaysField(required=False, allow_null=True)
    start_keys_days = RetentionDaysField(required=False, allow_null=True)


class TenantRetentionSerializer(DefinitionRetentionSerializer):
    service_keys_days = RetentionDaysField(required=False, allow_null=True)
    audit_days = RetentionDaysField(required=False, allow_null=True)


class RetentionUpdateSerializer(KnownFieldsOnly, TenantRetentionSerializer):
    definitions = serializers.DictField(
        child=DefinitionRetentionSerializer(),
        required=False,
        help_text="Overrides by definition name; a definition left out has none.",
    )


class DefinitionRetentionViewSerializer(serializers.Serializer):
    policy = DefinitionRetentionSerializer(help_text="What this definition's override sets.")
    effective = DefinitionRetentionSerializer(help_text="What applies to its runs.")


class RetentionSerializer(serializers.Serializer):
    defaults = TenantRetentionSerializer(help_text="The CLEAT_RETAIN_* settings.")
    tenant = TenantRetentionSerializer(help_text="What this tenant's policy sets.")
    effective = TenantRetentionSerializer(help_text="What applies to this tenant.")
    definitions = serializers.DictField(child=DefinitionRetentionViewSerializer())
