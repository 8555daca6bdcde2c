"""The migrations carry frozen copies of the SQL they install; the live definitions are in
``workflows/store/sql/postgresql.py`` and ``schedules/sql/postgresql.py``. These tests catch
the two drifting apart: replaying the live definitions over what a fresh migrate installed
must leave every function of the ``cleat`` schema exactly as it was (``pg_get_functiondef``:
arguments, result, volatility, SECURITY DEFINER, search_path and body). A change to a live
definition therefore fails here until a new migration installs it.

The owner's connection is one transaction, rolled back: the test database is left as it was.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from schedules.sql import postgresql as schedules_sql
from tests.integration.test_rls import connect_as, table_owner
from workflows.rls import app_role
from workflows.store.sql import postgresql as workflows_sql

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]


def live_definitions() -> list[str]:
    return [
        workflows_sql.CURRENT_TENANT_FUNCTION,
        workflows_sql.definer_functions_sql(app_role()),
        workflows_sql.CLAIM_INVOCATIONS_FUNCTION,
        workflows_sql.ready_backlog_function_sql(app_role()),
        workflows_sql.missed_wakes_sql(app_role()),
        workflows_sql.append_events_function_sql(app_role()),
        workflows_sql.finalize_done_function_sql(app_role()),
        workflows_sql.wakeup_arrived_function_sql(app_role()),
        workflows_sql.finalize_wait_function_sql(app_role()),
        workflows_sql.next_signal_function_sql(app_role()),
        workflows_sql.load_functions_sql(app_role()),
        workflows_sql.load_claimed_functions_sql(app_role()),
        workflows_sql.run_interrupts_function_sql(app_role()),
        workflows_sql.READY_INSERT_WAKES,
        *schedules_sql.DEFINER_FUNCTIONS.values(),
    ]


def cleat_functions(conn: psycopg.Connection[Any]) -> dict[str, str]:
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid) FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'cleat'"
    ).fetchall()
    return dict(rows)


def replayed(statements: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The cleat functions as migrated, and after running ``statements`` over them."""
    with connect_as(table_owner()) as owner:
        try:
            installed = cleat_functions(owner)
            for statement in statements:
                owner.execute(statement)
            return installed, cleat_functions(owner)
        finally:
            owner.rollback()


def test_the_functions_a_fresh_migrate_installs_match_the_live_definitions() -> None:
    installed, after = replayed(live_definitions())
    assert (
        "cleat.claim_instances(text,text[],integer,timestamp with time zone,uuid,integer,uuid)"
        in installed
    )
    assert "cleat.due_schedules(timestamp with time zone,integer,uuid)" in installed
    changed = sorted(name for name in after if installed.get(name) != after[name])
    assert not changed, (
        "the live SQL of these functions differs from what the migrations install: "
        f"add a migration with a frozen copy of the new definition: {changed}"
    )


def test_a_live_definition_that_moved_on_is_caught() -> None:
    """The check itself: a body changed in the live SQL (one more condition in the claim)
    shows up as a difference."""
    moved_on = workflows_sql.definer_functions_sql(app_role()).replace(
        "WHERE d.tenant_id = r.tenant_id AND d.status = 'ready'",
        "WHERE d.tenant_id = r.tenant_id AND d.status = 'ready' AND d.priority > -1000000",
    )
    assert moved_on != workflows_sql.definer_functions_sql(app_role())
    installed, after = replayed([moved_on])
    changed = [name for name in after if installed.get(name) != after[name]]
    assert changed == [
        "cleat.claim_instances(text,text[],integer,timestamp with time zone,uuid,integer,uuid)"
    ]
