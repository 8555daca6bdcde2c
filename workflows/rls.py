"""PostgreSQL row-level security: why the policies, the roles and the cross-tenant definer
functions exist, each app's tenant-scoped tables, and the check that names every way a
connection escapes them. The statements themselves are in ``workflows/store/sql/`` (the
live definitions; the migrations that install them carry frozen copies).

Why each piece exists:

* Policies are **fail-closed**: ``cleat.current_tenant()`` raises when no tenant is set, so a
  query that forgot its tenant context errors loudly instead of returning every tenant's rows.
* RLS is **forced** on every tenant-scoped table, so even the tables' owner is subject to it.
* PostgreSQL exempts superusers and ``BYPASSRLS`` roles unconditionally; no ``FORCE`` reaches
  them. The application therefore connects as ``cleat_app`` (created here: no superuser, no
  BYPASSRLS). A deployment that connects as ``postgres`` has policies that are present,
  correct, tested -- and bypassed; :func:`bypass_reasons` says so.
* The worker's claim and lease upkeep must see every tenant's runnable rows. They go through
  ``SECURITY DEFINER`` functions owned by ``cleat_dispatcher``, a NOLOGIN role with
  BYPASSRLS: the exemption belongs to those few statements and nowhere else. Rows they return
  carry ``tenant_id`` and the caller re-scopes to it before touching anything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from workflows.store.sql import queries

# Tenant-scoped tables of this app. Each app declares its own (register_tables, in its
# AppConfig.ready, and its migrations secure them): this module lists no other app's.
# Not listed: the worker registry (workflows_workerprocess) is fleet-wide, with no tenant
# column and nothing of a tenant's in it; the application role is granted it (0014_workers).
WORKFLOW_TABLES = (
    "workflows_apikey",
    "workflows_workflowdefinition",
    "workflows_versiontag",
    "workflows_routingrule",
    "workflows_workflowinstance",
    "workflows_workflowevent",
    "workflows_signal",
    "workflows_promise",
    "workflows_updaterequest",
    "workflows_concurrencykey",
    "workflows_workflowstate",
    "workflows_invocation",
    "workflows_taskcall",
    "workflows_auditlog",
    "workflows_retentionpolicy",
)

_tenant_tables: dict[str, tuple[str, ...]] = {"workflows": WORKFLOW_TABLES}


def register_tables(app_label: str, tables: tuple[str, ...]) -> None:
    """Declare an app's tenant-scoped tables: :func:`bypass_reasons` (``check_rls``, the
    worker's start-up check) then checks them with the rest."""
    _tenant_tables[app_label] = tuple(tables)


def tenant_tables() -> tuple[str, ...]:
    """Every declared tenant-scoped table, app by app."""
    return tuple(table for tables in _tenant_tables.values() for table in tables)


def app_role() -> str:
    return str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))


DISPATCHER_ROLE = "cleat_dispatcher"


@dataclass(frozen=True)
class BypassReason:
    kind: str  # superuser, bypassrls, rls_disabled, owner_not_forced, no_policies
    detail: str


def bypass_reasons(connection: Any, tables: tuple[str, ...] | None = None) -> list[BypassReason]:
    """Every reason the given (PostgreSQL) connection would not be held to the policies.
    An empty list means RLS is enforced on it."""
    sql = queries(connection)
    if "table_security" not in sql:  # no row-level security on this database
        return []
    tables = tables or tenant_tables()
    reasons: list[BypassReason] = []
    with connection.cursor() as cursor:
        cursor.execute(sql["connection_role"])
        user, superuser, bypass = cursor.fetchone()
        if superuser:
            reasons.append(
                BypassReason("superuser", f"the connection's role {user!r} is a superuser")
            )
        if bypass:
            reasons.append(BypassReason("bypassrls", f"the role {user!r} has BYPASSRLS"))
        cursor.execute(sql["table_security"], [list(tables)])
        found = {row[0]: row for row in cursor.fetchall()}
    for table in tables:
        row = found.get(table)
        if row is None:
            reasons.append(BypassReason("rls_disabled", f"table {table} does not exist (migrate?)"))
            continue
        _, enabled, forced, owner, policies = row
        if not enabled:
            reasons.append(BypassReason("rls_disabled", f"row-level security is off on {table}"))
        if owner == user and not forced:
            reasons.append(
                BypassReason(
                    "owner_not_forced",
                    f"{user!r} owns {table} and RLS is not forced on it (FORCE ROW LEVEL SECURITY)",
                )
            )
        if not policies:
            reasons.append(BypassReason("no_policies", f"{table} has no policies"))
    return reasons


def format_reasons(reasons: list[BypassReason]) -> str:
    if not reasons:
        return ""
    lines = [f"  - [{r.kind}] {r.detail}" for r in reasons]
    return (
        "Row-level security is NOT enforced on this connection:\n"
        + "\n".join(lines)
        + f"\nConnect as the application role ({app_role()}) created by the migrations, "
        "and run `manage.py migrate` as the tables' owner."
    )
