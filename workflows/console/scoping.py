"""Tenant scoping for every console admin of a tenant-scoped model.

The console's tenant is the request's (``request.cleat_tenant``, set by
``workflows.middleware``). On PostgreSQL row-level security hides other tenants' rows as
well; on MariaDB and SQLite there is none, so this mixin is the only fence and every admin of
a tenant-scoped model derives from it:

* the changelist, the change, delete and history pages and the actions read through
  :meth:`TenantScopedAdmin.get_queryset`, which keeps only the tenant's rows
  (``workflows.tenancy.of_tenant``);
* an object id of another tenant (or of none) on a change, delete or history page is a 404,
  the same answer as for an id that does not exist, so the page says nothing about the other
  tenant (Django's own answer, a redirect with "does not exist", would do the same but is not
  an error status for clients and tests);
* an action POSTed with an id outside the tenant is a 404 too, instead of silently acting on
  the rest of the selection (or, in an admin that trusted the ids, on the foreign row).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponseBase

from workflows.models import Tenant
from workflows.tenancy import of_tenant


def request_tenant(request: HttpRequest) -> Tenant:
    """The console tenant of ``request``; refused when the middleware set none."""
    tenant = getattr(request, "cleat_tenant", None)
    if tenant is None:  # the middleware sets it on every /admin/ request
        raise PermissionDenied("no tenant context")
    return tenant


class TenantScopedAdmin(admin.ModelAdmin):
    """A ModelAdmin that shows and acts on the console tenant's rows only."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return of_tenant(super().get_queryset(request), request_tenant(request))

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Model | None:
        found = super().get_object(request, object_id, from_field)
        if found is None:
            raise Http404(f"No {self.opts.verbose_name} {object_id!r} in this tenant.")
        return found

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> HttpResponseBase | None:
        selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
        if selected and request.POST.get("select_across") != "1":
            self._require_in_tenant(request, selected)
        return super().response_action(request, queryset)

    def _require_in_tenant(self, request: HttpRequest, selected: list[str]) -> None:
        pk = self.opts.pk
        ids = set()
        for value in selected:
            try:
                ids.add(pk.to_python(value))
            except ValidationError:
                raise Http404(f"No {self.opts.verbose_name} {value!r} in this tenant.") from None
        found = set(self.get_queryset(request).filter(pk__in=ids).values_list("pk", flat=True))
        missing = ids - found
        if missing:
            raise Http404(
                f"No {self.opts.verbose_name} {sorted(map(str, missing))[0]!r} in this tenant."
            )
