"""OpenAPI generation (drf-spectacular): the API-key security scheme, and the error
responses every operation can give, in the one error shape, added to each operation."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema

from workflows.api.serializers import ErrorSerializer

ERROR_DESCRIPTIONS = {
    400: "Invalid input: bad JSON, a field that fails validation, an unknown definition, "
    "invalid WASM.",
    401: "No credentials, or an invalid or revoked API key.",
    403: "The key's role does not allow this.",
    404: "No such resource in the caller's tenant.",
    409: "Conflict: a stale generation, or a transition the current state does not allow.",
    413: "The body, or a payload in it, is larger than the configured limit.",
    415: "Unsupported Content-Type.",
    429: "Too many requests for this key; retry after the Retry-After header's seconds.",
}


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "workflows.api.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key, created with `manage.py create_api_key` or in the admin.",
        }


class StaffSessionScheme(OpenApiAuthenticationExtension):
    target_class = "workflows.api.authentication.StaffSessionAuthentication"
    name = "adminSession"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "cookie",
            "name": settings.SESSION_COOKIE_NAME,
            "description": "A staff user's admin session (browsable API; CSRF applies).",
        }


class CleatAutoSchema(AutoSchema):
    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        if direction != "response" or not hasattr(self.view, "action_roles"):
            return responses
        codes = {400, 401, 403, 429}
        if "{" in self.path:
            codes.add(404)
        if self.method in ("POST", "PUT", "PATCH"):
            codes |= {413, 415}
        handler = getattr(self.view, str(getattr(self.view, "action", "")), None)
        codes |= set(getattr(handler, "cleat_errors", ()))
        for code in sorted(codes):
            key = str(code)
            if key not in responses:
                response = self._get_response_for_code(ErrorSerializer, key, direction=direction)
                response["description"] = ERROR_DESCRIPTIONS[code]
                responses[key] = response
        return responses
