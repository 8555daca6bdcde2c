"""``POST /api/v1/task-calls/<tenant>/<task id>/outcome``: the outcome of a task cleat sent
as a durable call, reported by a Celery worker outside this Django project (inside it, the
worker's hook writes to the database directly: ``workflows.celery_calls``).

Authenticated by the call's own token (``X-Cleat-Task-Token``, from the ``cleat_call``
header of the task's message), not by an API key: the worker holds no key of the tenant,
and a token opens one call only. Body: ``{"status": "ok", "result": <JSON>}`` or
``{"status": "error" | "permanent" | "retries_exhausted", "error": "message"}``.
"""

from __future__ import annotations

import json
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework import status as http
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView

from engine.status import AbiStatus
from engine.task_calls import Disposition
from workflows.api.errors import error_body
from workflows.api.serializers import ErrorSerializer
from workflows.store import task_calls

TOKEN_HEADER = "X-Cleat-Task-Token"
STATUSES = {
    "ok": AbiStatus.OK,
    "error": AbiStatus.ERROR,
    "permanent": AbiStatus.PERMANENT,
    "retries_exhausted": AbiStatus.RETRIES_EXHAUSTED,
}


def _bad(field: str, message: str) -> Response:
    return Response(error_body("invalid", message, field), status=http.HTTP_400_BAD_REQUEST)


OUTCOME_REQUEST = inline_serializer(
    "TaskOutcome",
    {
        "status": serializers.ChoiceField(choices=list(STATUSES)),
        "result": serializers.JSONField(required=False, help_text="The task's result (ok)."),
        "error": serializers.CharField(required=False, help_text="The failure's message."),
    },
)
OUTCOME_RESPONSE = inline_serializer(
    "TaskOutcomeRecorded",
    {"outcome": serializers.ChoiceField(choices=["recorded", "duplicate", "stale"])},
)


class TaskOutcomeThrottle(AnonRateThrottle):
    """Per client address (the caller has no key): ``CLEAT_TASK_OUTCOME_RATE``."""

    scope = "task_outcome"


class TaskOutcomeView(APIView):
    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    throttle_classes = [TaskOutcomeThrottle]

    @extend_schema(
        operation_id="task_call_outcome",
        summary="Report the outcome of a task cleat sent as a durable call",
        request=OUTCOME_REQUEST,
        responses={
            200: OUTCOME_RESPONSE,
            400: ErrorSerializer,
            401: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            413: ErrorSerializer,
            415: ErrorSerializer,
            429: ErrorSerializer,
        },
        parameters=[
            OpenApiParameter(
                TOKEN_HEADER,
                str,
                OpenApiParameter.HEADER,
                required=True,
                description="The call's token, from the task's cleat_call header.",
            )
        ],
        auth=[],
        tags=["task-calls"],
    )
    def post(self, request: Request, tenant: Any, task_id: Any) -> Response:
        token = request.headers.get(TOKEN_HEADER, "")
        if not token:
            return Response(
                error_body("not_authenticated", f"{TOKEN_HEADER} is required"),
                status=http.HTTP_401_UNAUTHORIZED,
            )
        body = request.data
        if not isinstance(body, dict):
            return _bad("body", "must be a JSON object")
        name = body.get("status")
        if name not in STATUSES:
            return _bad("status", f"must be one of {', '.join(STATUSES)}")
        status = STATUSES[name]
        if status == AbiStatus.OK:
            if "result" not in body:
                return _bad("result", "is required when status is ok")
            payload = json.dumps(body["result"], separators=(",", ":"), ensure_ascii=False)
        else:
            error = body.get("error")
            if not isinstance(error, str) or not error:
                return _bad("error", "must be a non-empty string when the task failed")
            payload = error
        verdict = task_calls.report_outcome(tenant, str(task_id), token, status, payload)
        if verdict is Disposition.REFUSED:
            return Response(
                error_body("permission_denied", "the token does not match"),
                status=http.HTTP_403_FORBIDDEN,
            )
        return Response({"outcome": verdict.value})
