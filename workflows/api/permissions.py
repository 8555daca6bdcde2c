"""Roles: ``read_only`` keys may read (GET/HEAD/OPTIONS); ``operator`` keys also run the
actions on runs and promises (start, signal, cancel, terminate, pause, resume, retry, update,
resolve, reject) and list the fleet's workers (``GET workers`` names hosts and processes,
which a ``read_only`` key has no need to see); ``admin`` keys also manage definitions and use
the force operations (force-complete, force-fail, re-replay). A view names the role an
action needs in ``action_roles``; anything unnamed needs ``read_only`` when safe and
``operator`` otherwise.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from workflows.api.authentication import ApiIdentity
from workflows.models import Role

RANK = {Role.READ_ONLY: 0, Role.OPERATOR: 1, Role.ADMIN: 2}


def required_role(request: Request, view: Any) -> str:
    named = getattr(view, "action_roles", {}).get(getattr(view, "action", None))
    if named:
        return str(named)
    return Role.READ_ONLY if request.method in SAFE_METHODS else Role.OPERATOR


class HasRole(BasePermission):
    message = "This API key's role does not allow this."

    def has_permission(self, request: Request, view: Any) -> bool:
        identity = request.auth
        if not isinstance(identity, ApiIdentity):
            return False
        needed = required_role(request, view)
        if RANK.get(identity.role, -1) >= RANK[needed]:
            return True
        self.message = (
            f"This needs the {needed} role; the credentials used have the {identity.role} role."
        )
        return False
