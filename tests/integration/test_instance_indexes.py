"""The run table's partial indexes (migration 0031). A run's start, claims and finalize each
write a new row version into every index whose condition it meets, so the indexes only some
runs need have a condition -- and an index is only worth its condition if the queries it
serves still read it: a condition their WHERE clause does not imply makes PostgreSQL pass
the index over, silently, and scan the table instead. Each test here plans one of those
queries with sequential scans priced out (``enable_seqscan = off``: on a small test table
the planner would rather scan) and the table's other indexes dropped for the moment, and
asks whether the plan reads the index: it can only if the query implies its condition.

The plans are made as the tables' owner (who may drop the indexes, in a savepoint rolled
back). PostgreSQL only: SQLite plans by its own rules, and MariaDB has no partial indexes (Django
makes them whole there).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from tests.integration.test_rls import connect_as, table_owner
from workflows.models import TERMINAL_STATUSES, RunStatus, Tenant, WorkflowInstance
from workflows.retention import BATCH, FINISHED_STATUSES, PurgeReport, _Purge
from workflows.store.sql import postgresql as workflows_sql
from workflows.tenancy import of_tenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]


@pytest.fixture
def planner() -> Iterator[psycopg.Connection[Any]]:
    """The tables' owner's connection, whose planner does not scan tables (rolled back)."""
    with connect_as(table_owner()) as owner:
        owner.execute("SET enable_seqscan = off")
        try:
            yield owner
        finally:
            owner.rollback()


def reads(planner: psycopg.Connection[Any], index: str, sql: str, params: Any = ()) -> bool:
    """Whether the plan of ``sql`` reads ``index`` when it is the run table's only index
    besides the unique ones (the others are dropped in a savepoint, then restored): whether
    the query's WHERE clause implies the index's condition, whatever the planner would
    choose among indexes of equal cost on an empty table."""
    others = planner.execute(
        "SELECT i.indexrelid::regclass::text FROM pg_index AS i "
        "WHERE i.indrelid = %s::regclass AND NOT i.indisunique "
        "AND i.indexrelid::regclass::text <> %s",
        (WorkflowInstance._meta.db_table, index),
    ).fetchall()
    planner.execute("SAVEPOINT plan")
    try:
        for (name,) in others:
            planner.execute(f'DROP INDEX "{name}"')
        rows = planner.execute(f"EXPLAIN (COSTS OFF) {sql}", params).fetchall()
    finally:
        planner.execute("ROLLBACK TO SAVEPOINT plan")
    plan = "\n".join(row[0] for row in rows)
    return re.search(rf"Index (Only )?Scan (using|on) {index}\b", plan) is not None


def queryset_reads(planner: psycopg.Connection[Any], index: str, queryset: QuerySet[Any]) -> bool:
    sql, params = queryset.query.sql_with_params()
    return reads(planner, index, sql, params)


def test_the_conditions_are_in_the_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s",
            [WorkflowInstance._meta.db_table],
        )
        defined = dict(cursor.fetchall())
    conditions = {
        "instance_owner": "WHERE (assigned_to IS NOT NULL)",
        "instance_retention": "WHERE (completed_at IS NOT NULL)",
        "instance_purge_batch": "WHERE (purge_batch IS NOT NULL)",
        "instance_parent": "WHERE (parent_id IS NOT NULL)",
        "instance_child_ended": "WHERE (parent_id IS NOT NULL)",
        "instance_cancel_asked": "WHERE cancel_requested",
    }
    for name, condition in conditions.items():
        assert defined[name].endswith(condition), defined[name]
    # workflow_id has one index, not a second for LIKE patterns; parent_id has only its own.
    on_workflow_id = [n for n, d in defined.items() if "(workflow_id" in d]
    assert on_workflow_id == ["instance_workflow_id"], on_workflow_id
    on_parent = sorted(n for n, d in defined.items() if "(parent_id)" in d)
    assert on_parent == ["instance_parent"], on_parent


def test_a_runs_open_children_are_read_by_instance_parent(
    planner: psycopg.Connection[Any],
) -> None:
    # The finalize's and the retention's test for a child that has not ended.
    children = WorkflowInstance.objects.filter(parent_id=uuid.uuid4()).exclude(
        status__in=TERMINAL_STATUSES
    )
    assert queryset_reads(planner, "instance_parent", children)


def test_a_workers_runs_are_read_by_instance_owner(planner: psycopg.Connection[Any]) -> None:
    # A worker's heartbeat (cleat.heartbeat_worker's statement, and this filter where the
    # store has no such function: store.lifecycle.heartbeat_worker), the console's worker page.
    owned = WorkflowInstance.objects.filter(assigned_to="worker-1", status=RunStatus.RUNNING)
    assert queryset_reads(planner, "instance_owner", owned)


def test_the_retention_purge_reads_its_indexes(
    planner: psycopg.Connection[Any], tenant: Tenant
) -> None:
    # The purge's own query of the runs it may delete (finished runs past a 30-day cutoff),
    # and of a batch it marked.
    purge = _Purge(tenant, timezone.now(), {"finished": 30}, True, BATCH, PurgeReport(True), None)
    ended = purge._eligible_runs("finished", FINISHED_STATUSES)
    assert ended is not None
    assert queryset_reads(planner, "instance_retention", ended)
    batch = of_tenant(WorkflowInstance, tenant.id).filter(purge_batch="b-1")
    assert queryset_reads(planner, "instance_purge_batch", batch)


def test_the_wake_sweep_reads_ended_children_and_cancellations_by_their_indexes(
    planner: psycopg.Connection[Any],
) -> None:
    # The sweep's own statement, as cleat.missed_wakes runs it (EXECUTE ... USING).
    sweep = re.search(r"\$sweep\$(.*)\$sweep\$", workflows_sql.MISSED_WAKES_FUNCTION, re.S)
    assert sweep is not None
    since = timezone.now() - timedelta(seconds=5)
    planner.execute(f"PREPARE sweep(timestamptz, timestamptz) AS {sweep.group(1)}")
    due = (since, timezone.now())
    assert reads(planner, "instance_child_ended", "EXECUTE sweep(%s, %s)", due)
    assert reads(planner, "instance_cancel_asked", "EXECUTE sweep(%s, %s)", due)


def test_a_run_is_found_by_its_workflow_id(planner: psycopg.Connection[Any]) -> None:
    found = WorkflowInstance.objects.filter(workflow_id="order-1")
    assert queryset_reads(planner, "instance_workflow_id", found)
