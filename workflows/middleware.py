"""Runs each operator-console request in its tenant's context (RLS on PostgreSQL).

Which tenant, for ``/admin/`` requests:

* a **superuser** works in the tenant chosen in the session (``cleat_tenant``), else the
  default tenant; only the header's tenant switcher changes it, by a POST with a CSRF token
  to ``console:switch_tenant``. A query string never switches: a link or an image on another
  site (or in a run's input) must not move a superuser's console into another tenant, where
  their next click would act;
* a **staff user bound to a tenant** (``StaffTenant``) works in that tenant only: the session
  and the query string are ignored, so a crafted URL cannot reach another tenant;
* any **other staff user** is refused (403): a console login that belongs to no tenant must
  not fall back to one;
* the login page and anonymous requests get the default tenant's context, in which they read
  nothing.

The REST API sets the context from the API key instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseForbidden

from workflows.models import DEFAULT_TENANT_ID, StaffTenant, Tenant
from workflows.tenancy import tenant_context

SESSION_KEY = "cleat_tenant"


class TenantContextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith("/admin/"):
            return self.get_response(request)
        tenant = console_tenant(request)
        if tenant is None:
            return HttpResponseForbidden(
                "This staff account is not bound to a tenant. Ask an administrator to add a "
                "staff tenant binding for it (Workflows: Staff tenant bindings).",
                content_type="text/plain",
            )
        request.cleat_tenant = tenant  # type: ignore[attr-defined]
        user = getattr(request, "user", None)
        if user is not None and user.is_active and user.is_superuser:
            request.cleat_tenant_choices = _all_tenants  # type: ignore[attr-defined]
        with tenant_context(tenant.id):
            return self.get_response(request)


def _all_tenants() -> list[Tenant]:
    return list(Tenant.objects.filter(is_active=True).order_by("name"))


def console_tenant(request: HttpRequest) -> Tenant | None:
    """The tenant this request works in; None for a staff user bound to none."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.is_active:
        return _default_tenant()
    if user.is_superuser:
        wanted = request.session.get(SESSION_KEY)
        found = _tenant(wanted) if wanted else None
        if found is None:
            request.session.pop(SESSION_KEY, None)
            return _default_tenant()
        return found
    if not user.is_staff:
        return _default_tenant()
    binding = StaffTenant.objects.select_related("tenant").filter(user_id=user.pk).first()
    if binding is None or not binding.tenant.is_active:
        return None
    return binding.tenant


def _tenant(value: str) -> Tenant | None:
    try:
        tenant_id = uuid.UUID(str(value))
    except ValueError:
        return None
    return Tenant.objects.filter(id=tenant_id, is_active=True).first()


def _default_tenant() -> Tenant:
    found = Tenant.objects.filter(id=DEFAULT_TENANT_ID).first()
    # The migration creates it; a database flushed by a test may lack it until a fixture
    # restores it, and an unsaved stand-in scopes queries to it all the same.
    return found or Tenant(id=DEFAULT_TENANT_ID, name="default")
