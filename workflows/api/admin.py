"""API keys in the admin: create one (the key is shown once, on the page after saving),
list them, revoke them. The key is created by ``workflows.api.keys`` like the
``create_api_key`` command does; only its hash is stored."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from workflows.api.keys import issue_api_key, revoke_api_key
from workflows.models import ApiKey, Role, Tenant


class ApiKeyCreationForm(forms.ModelForm):
    class Meta:
        model = ApiKey
        fields = ["tenant", "name", "role"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "tenant", "role", "created_at", "last_used_at", "revoked_at")
    list_filter = ("role", "tenant")
    search_fields = ("name", "prefix")
    readonly_fields = ("prefix", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any):
        if obj is None:
            kwargs["form"] = ApiKeyCreationForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return ["tenant", "name", "role"]
        return ["tenant", "name", "role", "prefix", "created_at", "last_used_at", "revoked_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return []
        return ["tenant", "role", "prefix", "created_at", "last_used_at", "revoked_at"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Revoke instead: the row stays, so the audit trail can still name the key.
        return False

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            obj.save(update_fields=["name"])
            return
        tenant: Tenant = form.cleaned_data["tenant"]
        key, plaintext = issue_api_key(
            tenant, form.cleaned_data["name"], form.cleaned_data.get("role") or Role.OPERATOR
        )
        obj.pk = key.pk
        obj.prefix = key.prefix
        obj.key_hash = key.key_hash
        obj.created_at = key.created_at
        messages.warning(
            request,
            f"The API key {key.name!r}: {plaintext}  -- copy it now; it is not shown again.",
        )

    @admin.action(description="Revoke the selected API keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = 0
        for key in queryset:
            if key.revoked_at is None:
                revoke_api_key(key.tenant, key.pk)
                count += 1
        self.message_user(request, f"{count} API key(s) revoked.")
