"""Runs each request in its tenant's context (RLS on PostgreSQL).

For the admin: the tenant chosen in the session (``cleat_tenant``), else the default
tenant. The REST API sets the context from the API key instead.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from workflows.models import DEFAULT_TENANT_ID
from workflows.tenancy import tenant_context

SESSION_KEY = "cleat_tenant"


class TenantContextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith("/admin/"):
            return self.get_response(request)
        tenant = request.session.get(SESSION_KEY) or str(DEFAULT_TENANT_ID)
        with tenant_context(tenant):
            return self.get_response(request)
