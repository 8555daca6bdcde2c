"""One error shape everywhere: ``{"error": {"code", "message", "field"}}``.

The service layer raises :class:`~workflows.services.ServiceError` subclasses (each knows its
HTTP status); DRF raises its own ``APIException``\\ s (authentication, permissions, parsing,
throttling, validation). :func:`exception_handler` renders both in the shape above, and turns
anything unexpected into a bare 500 -- logged here, never a stack trace in a response. The
404/500 handlers of the project use :func:`error_response` for every path under ``/api/``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response

from workflows.services import ServiceError

log = logging.getLogger("cleat.api")


class FieldError(exceptions.APIException):
    """An API error that can name the input field at fault."""

    def __init__(self, detail: Any = None, code: str | None = None, field: str | None = None):
        super().__init__(detail, code)
        self.field = field


class InvalidRequest(FieldError):
    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "The request is invalid."
    default_code = "invalid"


class Conflict(FieldError):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The run's state does not allow this."
    default_code = "conflict"


class PayloadTooLarge(FieldError):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is larger than this endpoint accepts."
    default_code = "payload_too_large"


class ServiceUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The service is not ready."
    default_code = "unavailable"


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field}}


def error_response(status_code: int, code: str, message: str) -> JsonResponse:
    """A plain Django response in the API's error shape (for the 404/500 handlers)."""
    return JsonResponse(error_body(code, message), status=status_code)


def _first_error(detail: Any, path: tuple[str, ...] = ()) -> tuple[str | None, str, str]:
    """The first (field path, message, code) of a nested ValidationError detail."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            inner = () if key in ("non_field_errors", "detail") else (str(key),)
            return _first_error(value, path + inner)
    if isinstance(detail, list):
        for index, value in enumerate(detail):
            nested = isinstance(value, dict | list)
            return _first_error(value, path + ((str(index),) if nested else ()))
    code = getattr(detail, "code", None) or "invalid"
    return (".".join(path) or None, str(detail), str(code))


def _count_errors(detail: Any) -> int:
    if isinstance(detail, dict):
        return sum(_count_errors(v) for v in detail.values())
    if isinstance(detail, list):
        return sum(_count_errors(v) for v in detail)
    return 1


def _validation(exc: exceptions.ValidationError) -> tuple[str | None, str, str]:
    field, message, code = _first_error(exc.detail)
    if code in ("required", "null", "blank"):
        code = "invalid"
    more = _count_errors(exc.detail) - 1
    text = f"{field}: {message}" if field else message
    if more > 0:
        text += f" (and {more} more problem{'s' if more > 1 else ''})"
    return field, text, code if code == "invalid" else f"invalid_{code}"


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """DRF's exception handler for every API view (``REST_FRAMEWORK["EXCEPTION_HANDLER"]``)."""
    headers: dict[str, str] = {}
    field: str | None = None
    if isinstance(exc, ServiceError):
        status_code, code, message, field = exc.http_status, exc.code, exc.message, exc.field
    elif isinstance(exc, exceptions.ValidationError):
        status_code = status.HTTP_400_BAD_REQUEST
        field, message, code = _validation(exc)
    elif isinstance(exc, exceptions.ParseError):
        status_code, message = status.HTTP_400_BAD_REQUEST, str(exc.detail)
        code = "invalid_json" if "JSON" in message else "malformed_request"
    elif isinstance(exc, exceptions.UnsupportedMediaType):
        status_code, code = exc.status_code, "unsupported_media_type"
        message = str(exc.detail)
        accepted = [
            str(p.media_type)
            for p in getattr(context.get("request"), "parsers", None) or []
            if getattr(p, "media_type", None)
        ]
        others = [a for a in accepted if a != "application/json"]
        if "application/json" in accepted:
            message += " Send the body as JSON, with the header Content-Type: application/json"
            message += f" (this endpoint also takes {', '.join(others)})." if others else "."
        elif accepted:
            message += f" This endpoint takes {', '.join(accepted)}."
    elif isinstance(exc, exceptions.APIException):
        status_code = exc.status_code
        code = str(getattr(exc.detail, "code", None) or exc.default_code)
        message = str(exc.detail)
        field = getattr(exc, "field", None)
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = str(exc.auth_header)  # type: ignore[attr-defined]
        wait = getattr(exc, "wait", None)
        if wait is not None:
            headers["Retry-After"] = str(int(wait) + 1)
    elif isinstance(exc, Http404):
        status_code, code, message = 404, "not_found", "Not found."
    elif isinstance(exc, DjangoPermissionDenied):
        status_code, code, message = 403, "permission_denied", "Permission denied."
    elif isinstance(exc, RequestDataTooBig):
        status_code, code = 413, "payload_too_large"
        message = "The request body is larger than this endpoint accepts."
    elif isinstance(exc, SuspiciousOperation):
        status_code, code, message = 400, "malformed_request", "The request is malformed."
    else:
        request = context.get("request")
        log.exception(
            "event=api_error method=%s path=%s",
            getattr(request, "method", "?"),
            getattr(request, "path", "?"),
        )
        status_code, code, message = 500, "internal", "Internal server error."
    # Imported here: rest_framework.views reads the parser settings when it is imported, and
    # the parsers import this module (a cycle whoever of the two is imported first).
    from rest_framework.views import set_rollback

    set_rollback()
    return Response(error_body(code, message, field), status=status_code, headers=headers)


@csrf_exempt  # a 404 is a 404 whatever the method; CSRF's HTML 403 would break the shape
def not_found_view(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    """Any path under ``/api/`` that no route matches; a path that matches without its
    trailing slash says so (the API's paths have none)."""
    message = f"No API endpoint at {request.path}."
    if request.path.endswith("/") and _is_endpoint(request.path.rstrip("/")):
        message += (
            f" The API's paths have no trailing slash: {request.method} {request.path.rstrip('/')}"
        )
    return error_response(404, "not_found", message)


def _is_endpoint(path: str) -> bool:
    from django.urls import Resolver404, resolve

    try:
        match = resolve(path)
    except Resolver404:
        return False
    return match.func is not not_found_view


def handler404(request: HttpRequest, exception: Exception | None = None) -> Any:
    """The project's 404 handler: JSON under ``/api/``, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return not_found_view(request)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception or Http404())


def handler500(request: HttpRequest) -> Any:
    """The project's 500 handler: JSON under ``/api/`` (no stack trace), Django's page
    elsewhere. Only reached for errors outside the API views, which handle their own."""
    if request.path.startswith("/api/"):
        return error_response(500, "internal", "Internal server error.")
    from django.views.defaults import server_error

    return server_error(request)
