"""The operator console (Django admin). Histories are read-only; nothing here writes rows
directly: actions go through ``workflows.services``."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from workflows.models import AuditLog, Tenant, WorkflowDefinition, WorkflowEvent, WorkflowInstance


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("name", "id", "is_active", "schedule_quota", "created_at")
    search_fields = ("name",)


@admin.register(WorkflowDefinition)
class WorkflowDefinitionAdmin(ReadOnly):
    list_display = ("name", "version", "kind", "abi_version", "size", "deprecated", "created_at")
    list_filter = ("kind", "deprecated")
    search_fields = ("name", "sha256")
    exclude = ("wasm",)


class EventInline(admin.TabularInline):
    model = WorkflowEvent
    fields = ("step", "type_code", "payload", "timestamp_ms", "checksum")
    readonly_fields = fields
    extra = 0
    can_delete = False
    max_num = 0


@admin.register(WorkflowInstance)
class WorkflowInstanceAdmin(ReadOnly):
    list_display = (
        "id",
        "definition_name",
        "definition_version",
        "status",
        "waiting_description",
        "attempt",
        "created_at",
    )
    list_filter = ("status", "definition_name", "task_queue", "error_code")
    search_fields = ("id", "workflow_id", "input", "error")
    date_hierarchy = "created_at"
    inlines = [EventInline]


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnly):
    list_display = ("created_at", "action", "operator", "instance", "reason")
    list_filter = ("action",)
