"""API keys in the admin, for the console's tenant (``request.cleat_tenant``; a superuser
switches tenant in the console): create one (the key is shown once, in the message after
saving), list them, revoke them. Keys are created by ``workflows.api.keys`` like the
``create_api_key`` command does; only their hash is stored. A key is never deleted, only
revoked, so the audit log can still name it.

Creating a key needs ``add_apikey`` *and* the permissions of the key's role
(``workflows.api.keys.ROLE_PERMISSIONS``): a key can do no more than its creator could."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from workflows.api.keys import (
    RoleNotHeld,
    issue_api_key,
    require_role_held,
    revoke_api_key,
    roles_of_user,
)
from workflows.console.scoping import TenantScopedAdmin
from workflows.console.scoping import request_tenant as _tenant
from workflows.models import ApiKey, Role


class ApiKeyCreationForm(forms.ModelForm):
    issuer: Any = None  # the console user creating the key (set per request by the admin)

    class Meta:
        model = ApiKey
        fields = ["name", "role", "may_signal"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        held = roles_of_user(self.issuer)
        self.fields["role"].help_text = (
            f"You may create keys with the role{'s' if len(held) != 1 else ''} "
            f"{', '.join(held) or '(none)'}: a key's role needs its permissions."
        )

    def clean_role(self) -> str:
        role = str(self.cleaned_data.get("role") or Role.OPERATOR)
        try:
            require_role_held(self.issuer, role)
        except RoleNotHeld as exc:
            raise forms.ValidationError(exc.message, code="permission_denied") from None
        return role


@admin.register(ApiKey)
class ApiKeyAdmin(TenantScopedAdmin):
    list_display = (
        "name",
        "prefix",
        "role",
        "may_signal",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = ("role",)
    search_fields = ("name", "prefix")
    actions = ["revoke"]

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = type(
                "ApiKeyCreationFormForIssuer", (ApiKeyCreationForm,), {"issuer": request.user}
            )
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return ["name", "role", "may_signal"]
        return [
            "name",
            "role",
            "may_signal",
            "prefix",
            "created_at",
            "last_used_at",
            "revoked_at",
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return []
        return ["role", "prefix", "created_at", "last_used_at", "revoked_at"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            obj.save(update_fields=["name"])
            return
        key, plaintext = issue_api_key(
            _tenant(request),
            form.cleaned_data["name"],
            form.cleaned_data.get("role") or Role.OPERATOR,
            issuer=request.user,
        )
        obj.pk, obj.tenant = key.pk, key.tenant
        obj.prefix, obj.key_hash, obj.created_at = key.prefix, key.key_hash, key.created_at
        messages.warning(
            request,
            f"API key {key.name!r} for tenant {key.tenant.name}: {plaintext} "
            "-- copy it now; it is not shown again.",
        )

    @admin.action(description="Revoke the selected API keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        tenant = _tenant(request)
        revoked = 0
        for key in queryset.filter(revoked_at__isnull=True):
            revoke_api_key(tenant, key.pk)
            revoked += 1
        self.message_user(request, f"{revoked} API key(s) revoked.")
