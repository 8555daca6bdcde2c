"""The policy rules a store applies before it lets a run do something: who may signal a run
(the reference's ``WithRequireSignalAuth`` / ``GetAllowedSignalCallers``) and the quotas
(``WithMaxQuota*``). Written once, as pure functions over plain values, and called by every
store (``engine/inmemory.py``, ``workflows/store/``) and by the services; each returns the
refusal's message (None: allowed) for the caller to turn into ``DENIED`` for a guest, 403 or
409 for an API client, and an audit row.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass

# --- signal authorization -------------------------------------------------------------------


def guest_signal_refusal(
    *,
    require_auth: bool,
    allowed_callers: Collection[str] | None,
    caller: str,
    target: str,
) -> str | None:
    """Why a run of definition ``caller`` may not signal a run of definition ``target``.

    With signal authorization off (``CLEAT_REQUIRE_SIGNAL_AUTH`` false, the default) every
    workflow may signal every run of its tenant, whatever the target declares. With it on,
    the target definition's ``allowed_signal_callers`` names the caller definitions that
    may; an empty (or undeclared) list means nobody: the check fails closed."""
    if not require_auth:
        return None
    allowed = list(allowed_callers or ())
    if caller in allowed:
        return None
    who = ", ".join(sorted(allowed)) if allowed else "none"
    return (
        f"signal authorization: workflow {caller!r} may not signal runs of {target!r} "
        f"(allowed callers: {who})"
    )


def external_signal_refusal(*, require_auth: bool, permitted: bool, who: str) -> str | None:
    """Why ``who`` (an API key, a console user) may not signal a run from outside. With
    signal authorization on, that takes the key's ``may_signal`` or the user's
    ``workflows.signal_workflowinstance`` permission."""
    if not require_auth or permitted:
        return None
    return f"signal authorization: {who} has no permission to signal runs"


def check_callers(callers: object) -> str | None:
    """Why a deploy's ``allowed_signal_callers`` is invalid (None when valid)."""
    if not isinstance(callers, list) or not all(isinstance(c, str) and c for c in callers):
        return "allowed_signal_callers must be a list of workflow names"
    return None


# --- quotas ---------------------------------------------------------------------------------


class Quota(enum.StrEnum):
    """What a quota counts (its name in settings, the tenant's override and a refusal)."""

    CHILDREN = "children"  # child runs one run may start
    LOCKS = "locks"  # locks and concurrency keys one run may hold at once
    SCHEDULES = "schedules"  # schedules one tenant may hold (they outlive their runs)


QUOTA_SCOPE = {
    Quota.CHILDREN: "per run",
    Quota.LOCKS: "per run",
    Quota.SCHEDULES: "per tenant",
}


@dataclass(frozen=True)
class Quotas:
    """The limits in force; 0 means unlimited (as the reference's ``WithMaxQuota*``)."""

    children: int = 0
    locks: int = 0
    schedules: int = 0

    def limit(self, quota: Quota) -> int:
        value: int = getattr(self, quota.value)
        return value

    def overridden(self, overrides: Mapping[str, int | None]) -> Quotas:
        """These limits with a tenant's overrides (None: the setting's)."""
        values = {q.value: self.limit(q) for q in Quota}
        for name, value in overrides.items():
            if value is not None:
                values[name] = int(value)
        return Quotas(**values)


def quota_refusal(quotas: Quotas, quota: Quota, used: int) -> str | None:
    """Why one more (a child, a lock, a schedule) would break ``quota`` when ``used`` are
    taken already; None when it fits or the quota is 0 (unlimited)."""
    limit = quotas.limit(quota)
    if limit <= 0 or used < limit:
        return None
    return f"quota {quota.value} exceeded: at most {limit} {QUOTA_SCOPE[quota]}"
