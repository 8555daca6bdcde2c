"""The operator console (Django admin) for workflows.

Histories are read-only and nothing here writes rows directly: run actions go through
``workflows.services`` (``console/actions.py``), definition changes through
``workflows.definitions``. Every admin of a
tenant-scoped model derives from ``workflows.console.scoping.TenantScopedAdmin`` (the
request's tenant only; another tenant's id is a 404): on PostgreSQL row-level security
enforces it as well, on MariaDB and SQLite this scoping is the only fence, so list filters
read their choices through it too. What is not a tenant's (tenants, staff bindings, Django's
users and groups) is for superusers only: a tenant's staff must not see or change another
tenant's staff accounts, nor give themselves more rights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import admin as auth_admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import smart_split, unescape_string_literal

from workflows import services
from workflows.console import views
from workflows.console.actions import ACTIONS, RunAction
from workflows.console.display import (
    STATUS_COLOURS,
    WAITING,
    WAITING_COLOUR,
    age_text,
    detail_text,
    instance_status,
    size_text,
    status_label,
    wait_text,
)
from workflows.console.scoping import TenantScopedAdmin
from workflows.crypto import shown_column
from workflows.models import (
    AuditLog,
    RetentionPolicy,
    StaffTenant,
    Tenant,
    VersionTag,
    WorkflowDefinition,
    WorkflowInstance,
)
from workflows.redaction import redacted_text, redacted_value
from workflows.tenancy import of_tenant

# The console's own strip (templates/admin/base_site.html) links every page: the admin's
# app sidebar would take a quarter of a 1280 px window from the lists.
admin.site.enable_nav_sidebar = False

# A search reads the input and error of at most this many matching runs to check them
# against their redacted text (the database cannot redact).
SEARCH_SCAN_LIMIT = 1000


def _search_word(bit: str) -> str:
    """A word of a search as Django's admin splits it (a quoted phrase is one word)."""
    if len(bit) > 1 and bit[0] in "\"'" and bit[0] == bit[-1]:
        return unescape_string_literal(bit)
    return bit


def _tenant_id(request: HttpRequest) -> UUID:
    return views.tenant_of(request).id


def status_badge(status: str, label: str | None = None) -> str:
    colour = WAITING_COLOUR if status == WAITING else STATUS_COLOURS.get(status, "#6b7280")
    return format_html(
        '<span class="cleat-status cleat-status-{}" data-status="{}" style="background:{}">{}'
        "</span>",
        status,
        status,
        colour,
        label or status_label(status),
    )


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
            of_tenant(WorkflowInstance, _tenant_id(request))
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
        "created",
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
    search_help_text = (
        "Run id (exact), workflow id, or text in the input or the error (as shown: redacted "
        f"values do not match; the newest {SEARCH_SCAN_LIMIT} matching runs are checked)."
    )
    list_per_page = 50
    ordering = ("-created_at",)
    actions = [_bulk(a) for a in ACTIONS.values()]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).defer("compaction_state")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        try:
            run_id = UUID(term)
        except ValueError:
            pass
        else:
            return queryset.filter(Q(id=run_id) | Q(workflow_id=term)), False
        found, _ = super().get_search_results(request, queryset, search_term)
        if not term:
            return found, False
        # The database matched the stored text; keep only the runs whose text as shown
        # (redacted) matches too, or searching for a password would find its run.
        words = [_search_word(w) for w in smart_split(term)]
        words = [w.lower() for w in words if w]
        rows = found.order_by("-created_at").values_list(
            "pk", "tenant_id", "workflow_id", "input", "error"
        )
        shown = [
            pk
            for pk, tenant, workflow_id, input_text, error in rows[:SEARCH_SCAN_LIMIT]
            if all(
                w
                in f"{workflow_id}\n{redacted_text(_opened(tenant, pk, 'input', input_text))}\n"
                f"{redacted_text(_opened(tenant, pk, 'error', error))}".lower()
                for w in words
            )
        ]
        return queryset.filter(pk__in=shown), False

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
        return status_badge(instance_status(obj))

    @admin.display(description="waiting on")
    def waiting_column(self, obj: WorkflowInstance) -> str:
        return "" if obj.is_terminal else wait_text(obj.waiting_on)

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: WorkflowInstance) -> str:
        return age_text(obj.created_at)

    @admin.display(description="created at", ordering="created_at")
    def created(self, obj: WorkflowInstance) -> str:
        local = timezone.localtime(obj.created_at)
        return format_html(
            '<time datetime="{}" title="{}">{}</time>',
            obj.created_at.isoformat(),
            local.strftime("%Y-%m-%d %H:%M:%S %Z"),
            local.strftime("%m-%d %H:%M"),
        )

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
        "size_column",
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

    @admin.display(description="size", ordering="size")
    def size_column(self, obj: WorkflowDefinition) -> str:
        return format_html('<span title="{} bytes">{}</span>', obj.size, size_text(obj.size))

    @admin.display(description="tags")
    def tags(self, obj: WorkflowDefinition) -> str:
        names = (
            of_tenant(VersionTag, obj.tenant_id)
            .filter(name=obj.name, version=obj.version)
            .values_list("tag", flat=True)
        )
        return ", ".join(sorted(names))

    def _each(self, request: HttpRequest, queryset: QuerySet[Any], deprecate: bool) -> None:
        from workflows import definitions as defs
        from workflows.services import ServiceError

        tenant = views.tenant_of(request)
        change = defs.deprecate_definition if deprecate else defs.restore_definition
        done = 0
        for definition in of_tenant(queryset, tenant):
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
    list_display = ("created_at", "action", "operator", "run", "reason_text", "detail_text")
    list_filter = ("action", "created_at")
    search_fields = ("operator", "reason", "action")
    list_select_related = False
    # The reason and the detail are shown redacted, as everywhere else.
    fields = ("created_at", "action", "operator", "instance", "reason_text", "detail_text")

    @admin.display(description="reason")
    def reason_text(self, obj: AuditLog) -> str:
        return redacted_text(obj.reason)

    @admin.display(description="detail")
    def detail_text(self, obj: AuditLog) -> str:
        return detail_text(redacted_value(obj.detail))

    @admin.display(description="run")
    def run(self, obj: AuditLog) -> str:
        if not obj.instance_id:
            return "-"
        return format_html(
            '<a href="{}"><code>{}…</code></a>',
            views.instance_url(obj.instance_id),
            str(obj.instance_id)[:8],
        )


RETENTION_FIELDS = (
    "definition_name",
    "finished_days",
    "dead_lettered_days",
    "start_keys_days",
    "service_keys_days",
    "audit_days",
)


class RetentionPolicyForm(forms.ModelForm):
    """The policy form, refusing a second row for the same definition (or a second tenant
    policy) with a form error: the unique constraint names the tenant, which the form does
    not show, so Django's own unique check skips it and the insert would fail."""

    tenant_id: UUID | None = None  # set per request by RetentionPolicyAdmin.get_form

    class Meta:
        model = RetentionPolicy
        fields = RETENTION_FIELDS

    def clean_definition_name(self) -> str:
        name: str = self.cleaned_data.get("definition_name") or ""
        if self.tenant_id is None:
            return name
        rows = of_tenant(RetentionPolicy, self.tenant_id).filter(definition_name=name)
        if self.instance.pk is not None:
            rows = rows.exclude(pk=self.instance.pk)
        if rows.exists():
            whose = f"definition {name!r}" if name else "the tenant"
            raise forms.ValidationError(
                f"a policy for {whose} exists already: change that one instead"
            )
        return name


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(TenantScopedAdmin):
    """The tenant's retention policy (the row without a definition name) and its
    definitions' overrides; saved through workflows.retention, with an audit row."""

    form = RetentionPolicyForm

    list_display = (
        "__str__",
        "finished_days",
        "dead_lettered_days",
        "start_keys_days",
        "service_keys_days",
        "audit_days",
        "updated_at",
    )
    fields = RETENTION_FIELDS

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        form.tenant_id = views.tenant_of(request).id
        return form

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        from workflows import retention

        obj.tenant = views.tenant_of(request)
        retention.save_policy(obj, views.operator_of(request))


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
        "max_children_per_run",
        "max_locks_per_run",
        "last_claimed_at",
        "created_at",
    )
    search_fields = ("name",)
    fields = (
        "name",
        "is_active",
        "max_running",
        "schedule_quota",
        "max_children_per_run",
        "max_locks_per_run",
        "last_claimed_at",
    )
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
            kwargs["queryset"] = get_user_model().objects.filter(is_staff=True, is_superuser=False)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


# Django's users and groups are not a tenant's: a staff user holding auth permissions could
# otherwise list every tenant's staff, or make themselves a superuser.
for _model in (get_user_model(), Group):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)


@admin.register(get_user_model())
class UserAdmin(SuperuserOnly, auth_admin.UserAdmin):  # type: ignore[type-arg]
    pass


@admin.register(Group)
class GroupAdmin(SuperuserOnly, auth_admin.GroupAdmin):
    pass


def _opened(tenant: Any, run_id: Any, field: str, text: str | None) -> str | None:
    """A run's payload column read past the model, opened (workflows/crypto.py)."""
    return shown_column(WorkflowInstance, field, tenant, (run_id,), text)
