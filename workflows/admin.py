"""The operator console (Django admin) for workflows.

Histories are read-only and nothing here writes rows directly: run actions go through
``workflows.services`` (``console/actions.py``), definition changes through
``workflows.services.deploy_definition`` and ``workflows.definitions``. Every queryset is
scoped to the request's tenant (``request.cleat_tenant``, set by the tenant middleware): on
PostgreSQL row-level security enforces it as well, on the other backends this scoping is
the only fence, so list filters read their choices through it too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils.html import format_html

from workflows import services
from workflows.console import views
from workflows.console.actions import ACTIONS, RunAction
from workflows.console.display import STATUS_COLOURS, age_text, wait_text
from workflows.models import (
    AuditLog,
    StaffTenant,
    Tenant,
    VersionTag,
    WorkflowDefinition,
    WorkflowInstance,
)


def _tenant_id(request: HttpRequest) -> UUID:
    return views.tenant_of(request).id


def status_badge(status: str, label: str | None = None) -> str:
    return format_html(
        '<span class="cleat-status cleat-status-{}" style="background:{}">{}</span>',
        status,
        STATUS_COLOURS.get(status, "#6b7280"),
        label or status.replace("_", "-"),
    )


class TenantScopedAdmin(admin.ModelAdmin):
    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).filter(tenant_id=_tenant_id(request))


class ReadOnlyAdmin(TenantScopedAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --- list filters whose choices come from this tenant's rows ------------------------------------


class _ValuesFilter(admin.SimpleListFilter):
    field = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[Any, str]]:
        values = (
            WorkflowInstance.objects.filter(tenant_id=_tenant_id(request))
            .order_by(self.field)
            .values_list(self.field, flat=True)
            .distinct()
        )
        return [(str(v), str(v)) for v in values[:200]]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class DefinitionFilter(_ValuesFilter):
    title = "definition"
    parameter_name = "definition"
    field = "definition_name"


class VersionFilter(_ValuesFilter):
    title = "version"
    parameter_name = "version"
    field = "definition_version"

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        return (
            queryset.filter(definition_version=int(value)) if value.isdigit() else queryset.none()
        )


class TaskQueueFilter(_ValuesFilter):
    title = "task queue"
    parameter_name = "queue"
    field = "task_queue"


class TenantFilter(admin.SimpleListFilter):
    """For superusers: picking a tenant switches the console to it (the middleware reads the
    same ``tenant`` parameter and remembers the choice), so this list shows that tenant."""

    title = "tenant"
    parameter_name = "tenant"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(t.id), t.name) for t in Tenant.objects.filter(is_active=True)]

    def __init__(self, request: HttpRequest, *args: Any) -> None:
        self.current = str(_tenant_id(request))
        super().__init__(request, *args)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(tenant_id=_tenant_id(request))

    def choices(self, changelist: Any) -> Any:
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.current == str(lookup),
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }


# --- instances ----------------------------------------------------------------------------------


def _bulk(action: RunAction) -> Callable[..., Any]:
    def run(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return views.bulk_action(request, queryset, action, run.__name__)

    run.__name__ = f"bulk_{action.name}"
    return admin.action(description=f"{action.label} selected runs…", permissions=["operate"])(run)


@admin.register(WorkflowInstance)
class WorkflowInstanceAdmin(ReadOnlyAdmin):
    list_display = (
        "run",
        "definition",
        "status_column",
        "waiting_column",
        "attempt",
        "age",
        "error_code",
        "created_at",
    )
    list_display_links = ("run",)
    list_filter = (
        "status",
        DefinitionFilter,
        VersionFilter,
        TaskQueueFilter,
        "error_code",
        "created_at",
    )
    search_fields = ("workflow_id", "input", "error")
    search_help_text = "Run id (exact), workflow id, or text in the input or the error."
    list_per_page = 50
    ordering = ("-created_at",)
    actions = [_bulk(a) for a in ACTIONS.values()]

    def get_list_filter(self, request: HttpRequest) -> Any:
        filters = list(super().get_list_filter(request))
        if request.user.is_superuser:
            filters.insert(1, TenantFilter)
        return filters

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).defer("compaction_state")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        try:
            run_id = UUID(term)
        except ValueError:
            return super().get_search_results(request, queryset, search_term)
        return queryset.filter(Q(id=run_id) | Q(workflow_id=term)), False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return views.can_operate(request)

    @admin.display(description="run", ordering="id")
    def run(self, obj: WorkflowInstance) -> str:
        return format_html('<code title="{}">{}…</code>', obj.id, str(obj.id)[:8])

    @admin.display(description="definition", ordering="definition_name")
    def definition(self, obj: WorkflowInstance) -> str:
        return f"{obj.definition_name} v{obj.definition_version}"

    @admin.display(description="status", ordering="status")
    def status_column(self, obj: WorkflowInstance) -> str:
        return status_badge(obj.status, obj.get_status_display())

    @admin.display(description="waiting on")
    def waiting_column(self, obj: WorkflowInstance) -> str:
        return "" if obj.is_terminal else wait_text(obj.waiting_on)

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: WorkflowInstance) -> str:
        return age_text(obj.created_at)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        return views.instance_page(request, object_id)

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        custom = [
            path(
                "<path:object_id>/action/<str:name>/",
                wrap(views.action_page),
                name="workflows_workflowinstance_action",
            ),
            path(
                "<path:object_id>/state/",
                wrap(views.state_page),
                name="workflows_workflowinstance_state",
            ),
            path(
                "<path:object_id>/timeline.svg",
                wrap(views.timeline_download),
                name="workflows_workflowinstance_timeline",
            ),
        ]
        return custom + super().get_urls()


# --- definitions --------------------------------------------------------------------------------


@admin.register(WorkflowDefinition)
class WorkflowDefinitionAdmin(TenantScopedAdmin):
    list_display = (
        "name",
        "version",
        "tags",
        "kind",
        "abi_version",
        "size",
        "deprecated",
        "created_at",
    )
    list_filter = ("deprecated", "kind")
    search_fields = ("name", "sha256")
    actions = ["deprecate_selected", "restore_selected"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).defer("wasm")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # purging a version is a service operation with its own checks

    @admin.display(description="tags")
    def tags(self, obj: WorkflowDefinition) -> str:
        names = VersionTag.objects.filter(
            tenant_id=obj.tenant_id, name=obj.name, version=obj.version
        ).values_list("tag", flat=True)
        return ", ".join(sorted(names))

    def _each(self, request: HttpRequest, queryset: QuerySet[Any], deprecate: bool) -> None:
        from workflows import definitions as defs
        from workflows.services import ServiceError

        tenant = views.tenant_of(request)
        change = defs.deprecate_definition if deprecate else defs.restore_definition
        done = 0
        for definition in queryset.filter(tenant_id=tenant.id):
            try:
                change(tenant, definition.name, definition.version, views.operator_of(request))
            except ServiceError as exc:
                self.message_user(request, exc.message, level="error")
            else:
                done += 1
        verb = "deprecated" if deprecate else "restored"
        self.message_user(request, f"{done} version(s) {verb}.")

    @admin.action(description="Deprecate selected versions", permissions=["change"])
    def deprecate_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, True)

    @admin.action(description="Restore selected versions", permissions=["change"])
    def restore_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, False)

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return views.deploy_page(request)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        return views.definition_page(request, object_id)


# --- audit log, tenants, staff bindings ---------------------------------------------------------


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "action", "operator", "run", "reason")
    list_filter = ("action", "created_at")
    search_fields = ("operator", "reason", "action")
    list_select_related = False

    @admin.display(description="run")
    def run(self, obj: AuditLog) -> str:
        if not obj.instance_id:
            return str(obj.detail or "")
        return format_html(
            '<a href="{}"><code>{}…</code></a>',
            views.instance_url(obj.instance_id),
            str(obj.instance_id)[:8],
        )


class SuperuserOnly(admin.ModelAdmin):
    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)


@admin.register(Tenant)
class TenantAdmin(SuperuserOnly):
    """Tenants are created with ``manage.py create_tenant``; here superusers set a tenant's
    running cap and schedule quota, and deactivate or reactivate it (actions that call the
    services, which pause or resume its runs and write the audit row; the flag itself is not
    a form field)."""

    list_display = (
        "name",
        "id",
        "is_active",
        "max_running",
        "schedule_quota",
        "last_claimed_at",
        "created_at",
    )
    search_fields = ("name",)
    fields = ("name", "is_active", "max_running", "schedule_quota", "last_claimed_at")
    readonly_fields = ("name", "is_active", "last_claimed_at")
    actions = ("deactivate_tenants", "reactivate_tenants")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Deactivate: pause every run and schedule of the tenant")
    def deactivate_tenants(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> None:
        self._each(request, queryset, services.deactivate_tenant, "paused")

    @admin.action(description="Reactivate: resume the runs their deactivation paused")
    def reactivate_tenants(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> None:
        self._each(request, queryset, services.reactivate_tenant, "resumed")

    def _each(
        self,
        request: HttpRequest,
        queryset: QuerySet[Tenant],
        change: Callable[..., int],
        verb: str,
    ) -> None:
        operator = f"admin:{request.user.get_username()}"
        for tenant in queryset:
            try:
                count = change(tenant, operator)
            except services.ServiceError as exc:
                self.message_user(request, exc.message, messages.WARNING)
            else:
                self.message_user(request, f"{tenant.name}: {count} run(s) {verb}")


@admin.register(StaffTenant)
class StaffTenantAdmin(SuperuserOnly):
    list_display = ("user", "tenant")
    list_filter = ("tenant",)
    search_fields = ("user__username",)
    autocomplete_fields = ()

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "user":
            from django.contrib.auth import get_user_model

            kwargs["queryset"] = get_user_model().objects.filter(is_staff=True, is_superuser=False)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)
