"""Suite-wide fixtures: the database user switch on PostgreSQL, and tenants."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    """On PostgreSQL, migrate as the owner (done by pytest-django), then run every test as the
    application role, so the row-level security policies apply to the suite itself."""
    from django.db import connection

    from workflows.rls import app_role

    if connection.vendor != "postgresql":
        yield
        return
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            # Flushing between transactional tests truncates tables; only tests need that.
            cursor.execute(f"GRANT TRUNCATE ON ALL TABLES IN SCHEMA public TO {app_role()}")
        connection.close()
        owner = connection.settings_dict["USER"]
        connection.settings_dict["USER"] = app_role()
    yield
    with django_db_blocker.unblock():
        connection.close()
        connection.settings_dict["USER"] = owner


@pytest.fixture
def tenant(transactional_db: Any) -> Any:
    """The default tenant (a flush between transactional tests removes the migration's row)."""
    from workflows.models import DEFAULT_TENANT_ID, Tenant

    found, _ = Tenant.objects.get_or_create(id=DEFAULT_TENANT_ID, defaults={"name": "default"})
    return found


@pytest.fixture
def other_tenant(transactional_db: Any) -> Any:
    from workflows.models import Tenant

    found, _ = Tenant.objects.get_or_create(name="other")
    return found


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Deselect (not skip) PostgreSQL-only tests when the suite runs on another database:
    they exercise PostgreSQL itself (RLS, definer functions, NOTIFY), and the PostgreSQL
    pass of ``dev.py test`` runs them; and ``server_db`` tests on SQLite."""
    import os

    database = os.environ.get("CLEAT_TEST_DB", "sqlite")
    if database == "postgres":
        return
    # Tests marked server_db (real worker processes racing on a database server) run in the
    # PostgreSQL and MariaDB passes; the SQLite pass (one writer) leaves them out.
    markers = ("postgres_only",) if database != "sqlite" else ("postgres_only", "server_db")
    kept = [i for i in items if not any(i.get_closest_marker(m) for m in markers)]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
