"""The tenant context: which tenant the current database work belongs to.

On PostgreSQL the context is a transaction-local setting (``cleat.tenant_id``) that the
row-level security policies read; the policies are fail-closed, so a query on a tenant-scoped
table outside a context raises instead of returning everything. On the other backends
(MariaDB, SQLite) there is no row-level security: the code scopes every query by tenant
itself, with :func:`of_tenant` (the console's admins through ``workflows.console.scoping``).
Use the context around every unit of tenant work::

    with tenant_context(tenant_id):
        ...  # one transaction, every query sees only this tenant's rows
        runs = of_tenant(WorkflowInstance, tenant_id)  # and the filter, for MariaDB/SQLite
"""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.core.exceptions import FieldDoesNotExist
from django.db import connections, models, transaction

from workflows.store.sql import queries

TENANT_SETTING = "cleat.tenant_id"

_Row = TypeVar("_Row", bound=models.Model)

_current: contextvars.ContextVar[uuid.UUID | None] = contextvars.ContextVar(
    "cleat_tenant", default=None
)


class NoTenant(RuntimeError):
    """Tenant-scoped work was attempted outside a tenant context."""


def current_tenant() -> uuid.UUID:
    tenant = _current.get()
    if tenant is None:
        raise NoTenant("no tenant context: wrap tenant work in workflows.tenancy.tenant_context()")
    return tenant


def current_tenant_or_none() -> uuid.UUID | None:
    return _current.get()


def _set_database_tenant(using: str, tenant: uuid.UUID | None) -> None:
    conn = connections[using]
    sql = queries(conn)
    if "set_session_tenant" in sql:  # SQL Server security policy (untested here)
        with conn.cursor() as cursor:
            cursor.execute(sql["set_session_tenant"], [str(tenant) if tenant else None])
        return
    if "set_tenant" in sql:
        with conn.cursor() as cursor:
            cursor.execute(sql["set_tenant"], [TENANT_SETTING, str(tenant) if tenant else ""])


@contextmanager
def tenant_context(tenant_id: uuid.UUID | str, using: str = "default") -> Iterator[uuid.UUID]:
    """Run the block in one transaction scoped to ``tenant_id``; nests (inner contexts
    restore the outer tenant when they end)."""
    tenant = tenant_id if isinstance(tenant_id, uuid.UUID) else uuid.UUID(str(tenant_id))
    previous = _current.get()
    with transaction.atomic(using=using):
        _set_database_tenant(using, tenant)
        token = _current.set(tenant)
        try:
            yield tenant
        finally:
            _current.reset(token)
        # A savepoint that is released keeps the inner setting; one rolled back (the block
        # raised) reverts it by itself.
        if previous is not None and previous != tenant:
            _set_database_tenant(using, previous)


def of_tenant(
    rows: type[_Row] | models.QuerySet[_Row], tenant: uuid.UUID | str | Any
) -> models.QuerySet[_Row]:
    """``rows`` (a tenant-scoped model or a queryset of one) limited to ``tenant``'s (a
    tenant, or its id).

    Row-level security enforces the same on PostgreSQL; on MariaDB and SQLite this filter is
    the only fence, so every read that a tenant's user can reach goes through it. A model
    without a ``tenant`` column is refused: scoping it would silently mean nothing.
    """
    queryset = rows if isinstance(rows, models.QuerySet) else rows._default_manager.all()
    try:
        queryset.model._meta.get_field("tenant")
    except FieldDoesNotExist:
        raise TypeError(f"{queryset.model.__name__} has no tenant column to scope by") from None
    tenant_id = tenant if isinstance(tenant, uuid.UUID | str) else tenant.id
    return queryset.filter(tenant_id=tenant_id)
