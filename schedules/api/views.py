"""Schedules through the REST API (``/api/v1/schedules``): CRUD, pause and resume, trigger,
a preview of the next fire times, backfill, and a preview of an expression not yet saved.

The serializers (``schedules/api/serializers.py``) check types and bounds only; every rule
about a schedule (the cron expression, the zone, the definition, version, tag and entry
point, the quota) is ``schedules.services``'s, whose errors name the offending field. A
schedule is addressed by its id or by its name.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from engine.redaction import REDACTED
from schedules import services as schedule_services
from schedules.api.serializers import (
    BackfillSerializer,
    DeleteSerializer,
    DeliveriesSerializer,
    ExpressionPreviewSerializer,
    FireTimesSerializer,
    PreviewQuerySerializer,
    ScheduleFilterSerializer,
    ScheduleSerializer,
    ScheduleWriteSerializer,
    TriggerSerializer,
)
from schedules.models import Schedule
from schedules.scheduler import Delivery, firing_key_prefix
from workflows import services
from workflows.api import serializers as s
from workflows.api.errors import InvalidRequest
from workflows.api.pagination import RunPagination, StrictCursorPagination
from workflows.api.serializers import ReasonSerializer, json_text
from workflows.api.views import NAME_REGEX, TenantViewSet, _errors
from workflows.models import Role, WorkflowInstance
from workflows.tenancy import of_tenant

# --- the viewset ---------------------------------------------------------------------------------


class SchedulePagination(StrictCursorPagination):
    ordering = "name"


def _fire_times(cron: str, zone: str, instants: list[datetime]) -> dict[str, Any]:
    local = schedule_services.timing_for(cron, zone).zone
    return {
        "cron": cron,
        "timezone": zone,
        "fire_times": instants,
        "local_times": [i.astimezone(local).isoformat() for i in instants],
    }


def _deliveries(schedule: Schedule, made: list[Delivery]) -> dict[str, Any]:
    return DeliveriesSerializer(
        {
            "schedule": schedule.name,
            "deliveries": [
                {
                    "instant": d.instant,
                    "outcome": d.outcome,
                    "run_id": d.run_id,
                    "replaced": list(d.replaced),
                }
                for d in made
            ],
        }
    ).data


@extend_schema(tags=["schedules"])
class ScheduleViewSet(TenantViewSet):
    """Cron schedules that start workflows."""

    # The URL names a schedule by id or by name; "name" types the path parameter as a string.
    lookup_field = "name"
    lookup_url_kwarg = "schedule"
    lookup_value_regex = NAME_REGEX
    serializer_class = ScheduleSerializer
    pagination_class = SchedulePagination
    # Previewing an expression changes nothing: read_only keys may (it is a POST for its body).
    action_roles = {"preview_expression": Role.READ_ONLY}

    def get_queryset(self) -> QuerySet[Schedule]:
        if getattr(self, "swagger_fake_view", False):
            return Schedule.objects.none()
        return of_tenant(Schedule, self.tenant)

    def _one(self, key: str) -> Schedule:
        return schedule_services.get_schedule(self.tenant, key)

    def _write(self, partial: bool) -> dict[str, Any]:
        serializer = ScheduleWriteSerializer(data=self.request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        values = dict(serializer.validated_data)
        if "input" in values:
            text = json_text(values["input"])
            if REDACTED in text:
                # What a GET returns is redacted: sent back, it would replace the real values.
                raise InvalidRequest(
                    f"input contains {REDACTED}, the placeholder of a redacted value: send "
                    "the real values (or leave input out of a PATCH to keep them)",
                    "invalid",
                    "input",
                )
            values["input"] = text
        return values

    def _saved(self, save: Any) -> Schedule:
        try:
            saved: Schedule = save()
        except services.NotFound as exc:
            if exc.field in ("workflow_name", "workflow_version", "workflow_tag"):
                # The body names a definition that does not exist: bad input, not a bad URL.
                raise InvalidRequest(exc.message, "unknown_definition", exc.field) from None
            raise
        return saved

    def _delivered(self, deliver: Any) -> list[Delivery]:
        """Trigger or backfill: a schedule whose workflow can no longer be started (its
        definition, version or tag removed since) is a conflict with the schedule's state,
        not a missing URL."""
        try:
            made: list[Delivery] = deliver()
        except services.NotFound as exc:
            if exc.field == "schedule":
                raise
            raise services.Conflict(
                f"the schedule's workflow cannot be started: {exc.message}", "workflow_name"
            ) from None
        except services.InvalidInput as exc:
            if exc.field != "entry_point":
                raise
            raise services.Conflict(
                f"the schedule's workflow cannot be started: {exc.message}", "entry_point"
            ) from None
        return made

    @extend_schema(
        summary="List schedules",
        parameters=[ScheduleFilterSerializer],
        responses=ScheduleSerializer(many=True),
    )
    def list(self, request: Request) -> Response:
        query = self.params(ScheduleFilterSerializer)
        found = self.get_queryset()
        if query.get("enabled") is not None:
            found = found.filter(enabled=query["enabled"])
        if query.get("workflow_name"):
            found = found.filter(workflow_name=query["workflow_name"])
        if query.get("search"):
            text = query["search"]
            found = found.filter(Q(name__icontains=text) | Q(notes__icontains=text))
        return self.paginated(found, ScheduleSerializer)

    @extend_schema(
        summary="Create a schedule",
        description=(
            "`name`, `workflow_name` and `cron` are required. The definition (and the version, "
            "tag and entry point given) must exist; the first fire time is the expression's "
            "first instant after now. 409 for a name already used or a full schedule quota."
        ),
        request=ScheduleWriteSerializer,
        responses={201: ScheduleSerializer},
    )
    @_errors(409)
    def create(self, request: Request) -> Response:
        values = self._write(partial=False)
        created = self._saved(
            lambda: schedule_services.create_schedule(self.tenant, operator=self.operator, **values)
        )
        return Response(ScheduleSerializer(created).data, status=status.HTTP_201_CREATED)

    @extend_schema(summary="A schedule (by id or name)")
    def retrieve(self, request: Request, schedule: str) -> Response:
        return Response(ScheduleSerializer(self._one(schedule)).data)

    @extend_schema(
        summary="Replace a schedule's settings",
        description=(
            "Every settable field; those omitted take their defaults. A new expression or zone, "
            "or enabling, restarts the schedule at its next future instant."
        ),
        request=ScheduleWriteSerializer,
        responses=ScheduleSerializer,
    )
    @_errors(409)
    def update(self, request: Request, schedule: str) -> Response:
        values = {**schedule_services.DEFAULTS, **self._write(partial=False)}
        saved = self._saved(
            lambda: schedule_services.update_schedule(
                self.tenant, schedule, operator=self.operator, **values
            )
        )
        return Response(ScheduleSerializer(saved).data)

    @extend_schema(
        summary="Change some of a schedule's settings",
        description=(
            "Only the fields given change. A new expression or zone, or enabling, restarts the "
            "schedule at its next future instant."
        ),
        request=ScheduleWriteSerializer(partial=True),
        responses=ScheduleSerializer,
    )
    @_errors(409)
    def partial_update(self, request: Request, schedule: str) -> Response:
        values = self._write(partial=True)
        saved = self._saved(
            lambda: schedule_services.update_schedule(
                self.tenant, schedule, operator=self.operator, **values
            )
        )
        return Response(ScheduleSerializer(saved).data)

    @extend_schema(
        summary="Delete a schedule",
        description="Runs it started are not touched. `?reason=` goes to the audit log.",
        parameters=[DeleteSerializer],
        responses={204: None},
    )
    def destroy(self, request: Request, schedule: str) -> Response:
        reason = self.params(DeleteSerializer)["reason"]
        schedule_services.delete_schedule(
            self.tenant, schedule, operator=self.operator, reason=reason
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        summary="Pause (disable) a schedule",
        description="Idempotent. The reason is recorded in its notes and the audit log.",
        request=ReasonSerializer,
        responses=ScheduleSerializer,
    )
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, schedule: str) -> Response:
        reason = self.validated(ReasonSerializer)["reason"]
        paused = schedule_services.pause_schedule(
            self.tenant, schedule, reason=reason, operator=self.operator
        )
        return Response(ScheduleSerializer(paused).data)

    @extend_schema(
        summary="Resume (enable) a schedule",
        description=(
            "Idempotent. It fires next at its first instant after now: what it would have "
            "fired while paused is not owed (backfill delivers that)."
        ),
        request=ReasonSerializer,
        responses=ScheduleSerializer,
    )
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, schedule: str) -> Response:
        reason = self.validated(ReasonSerializer)["reason"]
        resumed = schedule_services.resume_schedule(
            self.tenant, schedule, reason=reason, operator=self.operator
        )
        return Response(ScheduleSerializer(resumed).data)

    @extend_schema(
        summary="Fire now",
        description=(
            "Delivers the instant now, off the cron (a paused schedule too), under the "
            "schedule's overlap policy or the one given."
        ),
        request=TriggerSerializer,
        responses=DeliveriesSerializer,
    )
    @_errors(409)
    @action(detail=True, methods=["post"])
    def trigger(self, request: Request, schedule: str) -> Response:
        body = self.validated(TriggerSerializer)
        made = self._delivered(
            lambda: schedule_services.trigger_schedule(
                self.tenant,
                schedule,
                overlap_policy=body.get("overlap_policy"),
                operator=self.operator,
            )
        )
        return Response(_deliveries(self._one(schedule), made))

    @extend_schema(
        summary="Deliver the instants of a past time range",
        description=(
            "Every instant of the expression in `[start, end]` (past only, at most "
            "`CLEAT_MAX_BACKFILL_RUNS`, default "
            f"{schedule_services.MAX_BACKFILL_INSTANTS}), oldest first, each under the overlap "
            "policy (the schedule's, or the one given). An instant that already fired returns "
            "its existing run."
        ),
        request=BackfillSerializer,
        responses=DeliveriesSerializer,
    )
    @_errors(409)
    @action(detail=True, methods=["post"])
    def backfill(self, request: Request, schedule: str) -> Response:
        body = self.validated(BackfillSerializer)
        made = self._delivered(
            lambda: schedule_services.backfill_schedule(
                self.tenant,
                schedule,
                body["start"],
                body["end"],
                overlap_policy=body.get("overlap_policy"),
                operator=self.operator,
            )
        )
        return Response(_deliveries(self._one(schedule), made))

    @extend_schema(
        summary="Runs the schedule started, newest first",
        description=(
            "Every run one of its instants started (by the scheduler, trigger or backfill), "
            "found by the instant's start key, so a renamed schedule keeps its runs. Runs "
            "they continued as are not included."
        ),
        responses=s.RunSerializer(many=True),
    )
    @action(detail=True, methods=["get"], pagination_class=RunPagination)
    def runs(self, request: Request, schedule: str) -> Response:
        found = self._one(schedule)
        started = (
            WorkflowInstance.objects.filter(
                tenant_id=self.tenant.id,
                start_idempotency_key__startswith=firing_key_prefix(found.id),
            )
            .select_related("continued_as")
            .defer("compaction_state", "continued_as__compaction_state")
        )
        return self.paginated(started, s.RunSerializer)

    @extend_schema(
        summary="The schedule's next fire times",
        parameters=[PreviewQuerySerializer],
        responses=FireTimesSerializer,
    )
    @action(detail=True, methods=["get"], url_path="preview", pagination_class=None)
    def preview(self, request: Request, schedule: str) -> Response:
        query = self.params(PreviewQuerySerializer)
        found = self._one(schedule)
        instants = schedule_services.preview_schedule(
            self.tenant, found, count=query["count"], after=query.get("after") or timezone.now()
        )
        return Response(FireTimesSerializer(_fire_times(found.cron, found.timezone, instants)).data)

    @extend_schema(
        summary="Preview an expression before saving it",
        description="Checks `cron` and `timezone` as a create would and lists the next instants.",
        request=ExpressionPreviewSerializer,
        responses=FireTimesSerializer,
    )
    @action(detail=False, methods=["post"], url_path="preview", pagination_class=None)
    def preview_expression(self, request: Request) -> Response:
        body = self.validated(ExpressionPreviewSerializer)
        instants = schedule_services.preview_expression(
            body["cron"], body["timezone"], count=body["count"], after=body.get("after")
        )
        timing = schedule_services.timing_for(body["cron"], body["timezone"])
        return Response(
            FireTimesSerializer(_fire_times(timing.expression, timing.timezone, instants)).data
        )
