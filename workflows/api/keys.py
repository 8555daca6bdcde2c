"""API keys: issue (the plaintext is returned once), revoke, and resolve a presented key to
its tenant and role; and which API role a console user holds (:func:`role_of_user`).

A key's role must not exceed its issuer's: a staff user who may create keys but not deploy
would otherwise mint an ``admin`` key and deploy through the API. :data:`ROLE_PERMISSIONS`
maps each role to the console permissions that grant the same powers; a user holds a role
when they have all of its permissions (superusers hold every role). The same mapping gives
a staff user's role in the browsable API, so the two cannot drift apart.

Only the SHA-256 of a key is stored. Resolving happens before the request's tenant is known:
on PostgreSQL ``workflows_apikey`` is row-level secured, so the lookup goes through the
``cleat.resolve_api_key`` definer function (``migrations/0001_resolve_api_key.py``); the other
backends have no RLS and read the row directly, by its unique hash.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from workflows.models import ApiKey, Role, Tenant, hash_api_key
from workflows.services import InvalidInput, NotFound, ServiceError
from workflows.tenancy import tenant_context

# last_used_at is a hint for operators, not an audit trail: writing it on every request would
# turn every read into a write (and on SQLite take the database's one write lock).
LAST_USED_PRECISION = timedelta(minutes=1)
KEY_PREFIX = "clt_"

# What each API role may do (workflows/api/permissions.py), as console permissions:
# read_only reads runs; operator acts on them (the console's "operate" permission, which
# also covers its force operations); admin also deploys and manages definitions, purging
# (deletion) included. A role here lists all it needs: holding it means holding them all.
ROLE_PERMISSIONS: Mapping[str, tuple[str, ...]] = {
    Role.READ_ONLY: ("workflows.view_workflowinstance",),
    Role.OPERATOR: ("workflows.view_workflowinstance", "workflows.change_workflowinstance"),
    Role.ADMIN: (
        "workflows.view_workflowinstance",
        "workflows.change_workflowinstance",
        "workflows.add_workflowdefinition",
        "workflows.change_workflowdefinition",
        "workflows.delete_workflowdefinition",
    ),
}
_STRONGEST_FIRST = (Role.ADMIN, Role.OPERATOR, Role.READ_ONLY)
_VIEW_RUNS = "workflows.view_workflowinstance"
_OPERATE_RUNS = "workflows.change_workflowinstance"


class RoleNotHeld(ServiceError):
    """The issuer may not create a key of this role."""

    code = "permission_denied"
    http_status = 403


def _holds(user: Any, permission: str) -> bool:
    if permission == _VIEW_RUNS:
        # Django's admin lets "change" imply "view"; so does this mapping.
        return bool(user.has_perm(_VIEW_RUNS) or user.has_perm(_OPERATE_RUNS))
    return bool(user.has_perm(permission))


def roles_of_user(user: Any) -> list[str]:
    """The API roles ``user`` (a console user) holds, strongest first; none for an inactive
    user."""
    if not getattr(user, "is_active", False):
        return []
    if user.is_superuser:
        return list(_STRONGEST_FIRST)
    return [
        role
        for role in _STRONGEST_FIRST
        if all(_holds(user, permission) for permission in ROLE_PERMISSIONS[role])
    ]


def role_of_user(user: Any) -> str | None:
    """The strongest API role ``user`` holds, or None."""
    held = roles_of_user(user)
    return held[0] if held else None


def require_role_held(issuer: Any, role: str) -> None:
    """RoleNotHeld (naming ``role``) unless ``issuer`` holds ``role``."""
    if role in roles_of_user(issuer):
        return
    needed = ", ".join(ROLE_PERMISSIONS.get(role, ()))
    raise RoleNotHeld(
        f"creating a key with the {role} role needs that role's permissions ({needed}) "
        "or a superuser",
        "role",
    )


@dataclass(frozen=True)
class ResolvedKey:
    id: int
    tenant_id: uuid.UUID
    name: str
    role: str
    revoked_at: datetime | None
    last_used_at: datetime | None

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


def issue_api_key(
    tenant: Tenant, name: str, role: str = Role.OPERATOR, *, issuer: Any = None
) -> tuple[ApiKey, str]:
    """Create a key for ``tenant``; returns it with its plaintext (shown this once).

    ``issuer``: the console user creating it, who must hold ``role`` (RoleNotHeld naming
    ``role`` otherwise). None for the ``create_api_key`` command: whoever runs it has the
    server's shell and database already.
    """
    name = name.strip()
    if not name or len(name) > 128:
        raise InvalidInput("the key's name must be 1-128 characters", "name")
    if role not in Role.values:
        raise InvalidInput(f"role must be one of {', '.join(Role.values)}, not {role!r}", "role")
    if issuer is not None:
        require_role_held(issuer, role)
    with tenant_context(tenant.id):
        return ApiKey.issue(tenant, name, role)


def revoke_api_key(tenant: Tenant, key_id: int) -> ApiKey:
    """Revoke a key of ``tenant``: it authenticates nothing from now on."""
    with tenant_context(tenant.id):
        key = ApiKey.objects.filter(tenant_id=tenant.id, id=key_id).first()
        if key is None:
            raise NotFound(f"no API key {key_id}", "key")
        if key.revoked_at is None:
            key.revoked_at = timezone.now()
            key.save(update_fields=["revoked_at"])
    return key


def resolve_api_key(plaintext: str) -> ResolvedKey | None:
    """The key whose hash matches ``plaintext`` (revoked or not), or None."""
    if not plaintext.startswith(KEY_PREFIX) or len(plaintext) > 256:
        return None
    digest = hash_api_key(plaintext)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, tenant_id, name, role, revoked_at, last_used_at "
                "FROM cleat.resolve_api_key(%s)",
                [digest],
            )
            row = cursor.fetchone()
    else:
        row = (
            ApiKey.objects.filter(key_hash=digest)
            .values_list("id", "tenant_id", "name", "role", "revoked_at", "last_used_at")
            .first()
        )
    if row is None:
        return None
    key_id, tenant_id, name, role, revoked_at, last_used_at = row
    tenant = tenant_id if isinstance(tenant_id, uuid.UUID) else uuid.UUID(str(tenant_id))
    return ResolvedKey(key_id, tenant, name, role, revoked_at, last_used_at)


def record_use(key: ResolvedKey, now: datetime) -> None:
    """Note that ``key`` was used (at most once per ``LAST_USED_PRECISION``)."""
    if key.last_used_at is not None and now - key.last_used_at < LAST_USED_PRECISION:
        return
    with tenant_context(key.tenant_id):
        ApiKey.objects.filter(tenant_id=key.tenant_id, id=key.id).update(last_used_at=now)
