"""The policy settings a store and the services apply, read live from the ``CLEAT_*``
settings and the tenant's overrides; the rules themselves are ``engine/policies.py``."""

from __future__ import annotations

import uuid

from django.conf import settings

from engine.policies import Quotas
from workflows.models import Tenant


def require_signal_auth() -> bool:
    return bool(getattr(settings, "CLEAT_REQUIRE_SIGNAL_AUTH", False))


def default_quotas() -> Quotas:
    return Quotas(
        children=int(getattr(settings, "CLEAT_MAX_CHILDREN_PER_RUN", 0)),
        locks=int(getattr(settings, "CLEAT_MAX_LOCKS_PER_RUN", 0)),
        schedules=int(getattr(settings, "CLEAT_MAX_SCHEDULES_PER_TENANT", 100)),
    )


def quotas_for(tenant_id: uuid.UUID | str) -> Quotas:
    """The settings' quotas with the tenant's overrides (an empty override: the setting)."""
    row = (
        Tenant.objects.filter(id=tenant_id)
        .values("max_children_per_run", "max_locks_per_run", "schedule_quota")
        .first()
        or {}
    )
    return default_quotas().overridden(
        {
            "children": row.get("max_children_per_run"),
            "locks": row.get("max_locks_per_run"),
            "schedules": row.get("schedule_quota"),
        }
    )
