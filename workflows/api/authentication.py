"""Who is calling, for which tenant, with which role.

Clients present an API key as ``Authorization: Bearer <key>``; the key belongs to one tenant
and carries a role. Staff users logged in to the admin can use the browsable API with their
session, in the tenant the console gives them (see
:class:`StaffSessionAuthentication`). Either way ``request.auth`` is
an :class:`ApiIdentity`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import (
    BaseAuthentication,
    SessionAuthentication,
    get_authorization_header,
)
from rest_framework.request import Request

from workflows.api.keys import record_use, resolve_api_key, role_of_user
from workflows.middleware import console_tenant
from workflows.models import Tenant


@dataclass(frozen=True)
class ApiIdentity:
    tenant: Tenant
    role: str
    operator: str  # who the audit log names: "api-key:<name>" or "user:<username>"
    key_id: int | None = None


class ApiKeyUser:
    """``request.user`` for a request authenticated with an API key."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False

    def __init__(self, identity: ApiIdentity) -> None:
        self.identity = identity
        self.pk = None
        self.username = identity.operator

    def __str__(self) -> str:
        return self.username


def identity_of(request: Request) -> ApiIdentity:
    identity = request.auth
    if not isinstance(identity, ApiIdentity):
        raise exceptions.NotAuthenticated()
    return identity


def _active_tenant(tenant_id: uuid.UUID | str) -> Tenant | None:
    try:
        tenant = Tenant.objects.filter(id=uuid.UUID(str(tenant_id))).first()
    except ValueError:
        return None
    return tenant if tenant is not None and tenant.is_active else None


class ApiKeyAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ApiKeyUser, ApiIdentity] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header: use 'Bearer <API key>'."
            )
        try:
            plaintext = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid API key.") from None
        key = resolve_api_key(plaintext)
        if key is None:
            raise exceptions.AuthenticationFailed("Invalid API key.")
        if not key.is_active:
            raise exceptions.AuthenticationFailed("This API key has been revoked.")
        tenant = _active_tenant(key.tenant_id)
        if tenant is None:
            raise exceptions.AuthenticationFailed("The API key's tenant is deactivated.")
        record_use(key, timezone.now())
        identity = ApiIdentity(tenant, key.role, f"api-key:{key.name}", key.id)
        return ApiKeyUser(identity), identity

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="cleat"'


class StaffSessionAuthentication(SessionAuthentication):
    """The admin's session, for staff users only (CSRF-checked like any session), in the
    console's tenant (``workflows.middleware.console_tenant``: a superuser's chosen tenant,
    a bound staff user's own), with the strongest role the user's console permissions give
    (``workflows.api.keys.role_of_user``: superusers ``admin``)."""

    def authenticate(self, request: Request) -> tuple[Any, ApiIdentity] | None:
        found = super().authenticate(request)
        if found is None:
            return None
        user, _ = found
        if not user.is_staff:
            return None
        tenant = console_tenant(request._request)
        if tenant is None or not tenant.is_active or tenant._state.adding:
            raise exceptions.AuthenticationFailed(
                "This staff account is not bound to an active tenant."
            )
        role = role_of_user(user)
        if role is None:
            raise exceptions.PermissionDenied(
                "This staff account may not view workflow runs, so it may not use the API."
            )
        return user, ApiIdentity(tenant, role, f"user:{user.get_username()}")
