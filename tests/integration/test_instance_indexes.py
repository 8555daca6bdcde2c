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
from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from tests.integration.test_rls import connect_as, table_owner
from workflows.models import (
    TERMINAL_STATUSES,
    RunStatus,
    Tenant,
    WorkflowDefinition,
    WorkflowInstance,
)
from workflows.retention import BATCH, FINISHED_STATUSES, PurgeReport, _Purge
from workflows.store.sql import postgresql as workflows_sql
from workflows.tenancy import of_tenant, tenant_context

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


def reads(
    planner: psycopg.Connection[Any], index: str, sql: str, params: Any = (), alias: str = ""
) -> bool:
    """Whether the plan of ``sql`` reads ``index`` when it is the run table's only index
    besides the unique ones (the others are dropped in a savepoint, then restored): whether
    the query's WHERE clause implies the index's condition, whatever the planner would
    choose among indexes of equal cost on an empty table. With ``alias``, only a read of
    the table under that name counts (one statement may read the table several times)."""
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
    named = rf" on \S+ {alias}\b" if alias else r"\b"
    return re.search(rf"Index (Only )?Scan (using|on) {index}{named}", plan) is not None


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
        "instance_tenant_due_order": "WHERE ((status)::text = 'ready'::text)",
        "instance_due": (
            "WHERE ((status)::text = ANY ((ARRAY['ready'::character varying, "
            "'running'::character varying])::text[]))"
        ),
    }
    for name, condition in conditions.items():
        assert defined[name].endswith(condition), defined[name]
    # workflow_id has one index, not a second for LIKE patterns; parent_id has only its own.
    on_workflow_id = [n for n, d in defined.items() if "(workflow_id" in d]
    assert on_workflow_id == ["instance_workflow_id"], on_workflow_id
    on_parent = sorted(n for n, d in defined.items() if "(parent_id)" in d)
    assert on_parent == ["instance_parent"], on_parent


def _unique_keys() -> dict[str, str]:
    """The definitions of the run table's unique indexes on a key most runs leave empty
    (migration 0035), by the column they end with."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexdef LIKE %s",
            [WorkflowInstance._meta.db_table, "CREATE UNIQUE INDEX %"],
        )
        found = [row[0] for row in cursor.fetchall()]
    return {
        column: next(d for d in found if re.search(rf"\b{column}\)", d))
        for column in ("start_idempotency_key", "continued_from_id")
    }


def test_the_unique_keys_hold_only_the_runs_that_have_one() -> None:
    # A run started without an idempotency key, or not continued from another, is written to
    # neither index (migration 0035): each is unique where its key is set.
    keys = _unique_keys()
    assert keys["start_idempotency_key"].startswith(
        "CREATE UNIQUE INDEX instance_start_idempotency_key "
    ), keys
    assert keys["start_idempotency_key"].endswith(
        "(tenant_id, start_idempotency_key) WHERE (start_idempotency_key IS NOT NULL)"
    ), keys
    assert keys["continued_from_id"].endswith(
        "(continued_from_id) WHERE (continued_from_id IS NOT NULL)"
    ), keys


def _unique_index(column: str) -> str:
    name = re.search(r"CREATE UNIQUE INDEX (\S+) ", _unique_keys()[column])
    assert name is not None
    return name.group(1)


def test_a_key_is_looked_up_by_its_unique_index(
    planner: psycopg.Connection[Any], tenant: Tenant
) -> None:
    # The start's idempotency (workflows/services.py), the continue-as-new chain
    # (continue_chain in workflows/models.py) and the retention purge's links, then the
    # foreign key's own check when a run that another continued from is deleted (a
    # parameter, as PostgreSQL plans it).
    started = of_tenant(WorkflowInstance, tenant.id).filter(start_idempotency_key="order-7")
    assert queryset_reads(planner, "instance_start_idempotency_key", started)
    index = _unique_index("continued_from_id")
    run_id = uuid.uuid4()
    assert queryset_reads(planner, index, WorkflowInstance.objects.filter(continued_from_id=run_id))
    marked = WorkflowInstance.objects.filter(continued_from_id__in=[run_id, uuid.uuid4()])
    assert queryset_reads(planner, index, marked)
    planner.execute("SET plan_cache_mode = force_generic_plan")
    planner.execute(
        "PREPARE link(uuid) AS SELECT 1 FROM workflows_workflowinstance "
        "WHERE continued_from_id = $1 FOR KEY SHARE"
    )
    assert reads(planner, index, "EXECUTE link(%s)", (run_id,))


def test_the_unique_keys_still_refuse_a_duplicate(tenant: Tenant) -> None:
    with tenant_context(tenant.id):
        definition = WorkflowDefinition.objects.create(
            tenant=tenant, name="keys", version=1, wasm=b"\0asm", sha256="0" * 64
        )

        def run(**fields: Any) -> WorkflowInstance:
            return WorkflowInstance.objects.create(
                tenant=tenant,
                workflow_id=f"keys-{uuid.uuid4()}",
                definition=definition,
                definition_name="keys",
                definition_version=1,
                **fields,
            )

        first = run(start_idempotency_key="order-7")
        # Runs without either key never collide.
        plain = [run(), run()]
        run(continued_from=first)
        with pytest.raises(IntegrityError), transaction.atomic():
            run(start_idempotency_key="order-7")
        with pytest.raises(IntegrityError), transaction.atomic():
            run(continued_from=first)
        assert WorkflowInstance.objects.filter(id__in=[r.id for r in plain]).count() == 2
        assert WorkflowInstance.objects.filter(definition=definition).count() == 4


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
    # Its ready runs (the waiting ones whose wake-up arrived) imply either due index's
    # condition (migration 0033).
    assert reads(planner, "instance_due", "EXECUTE sweep(%s, %s)", due)
    assert reads(planner, "instance_tenant_due_order", "EXECUTE sweep(%s, %s)", due)


def test_a_run_is_found_by_its_workflow_id(planner: psycopg.Connection[Any]) -> None:
    found = WorkflowInstance.objects.filter(workflow_id="order-1")
    assert queryset_reads(planner, "instance_workflow_id", found)


def _function_statement(sql: str, name: str, params: dict[str, str]) -> str:
    """The statement of ``sql``'s function ``name`` between its ``$$`` markers, each of
    ``params`` (its parameters, in order, with their types) a placeholder of a prepared
    statement: what the function plans at a call."""
    body = re.search(rf"FUNCTION cleat\.{name}\(.*?\$\$(.*?)\$\$", sql, re.S)
    assert body is not None, name
    return _placeholders(body.group(1), params)


def _placeholders(statement: str, params: dict[str, str]) -> str:
    """``statement`` with each of ``params`` (in order) a placeholder ($1, $2, ...)."""
    for i, param in enumerate(params, start=1):
        statement = re.sub(rf"\b{param}\b", f"${i}", statement)
    return statement


def test_the_claim_reads_ready_runs_by_instance_tenant_due_order(
    planner: psycopg.Connection[Any],
) -> None:
    # The worker's claim as cleat.claim_instances plans it (its statement, the parameters
    # as placeholders): the test for due runs (w) and each queue's candidates (d), both of
    # ready runs.
    params = {
        "p_worker": "text",
        "p_queues": "text[]",
        "p_limit": "integer",
        "p_now": "timestamptz",
        "p_default_cap": "integer",
    }
    statement = _placeholders(workflows_sql._CLAIM_COMMON, params)
    planner.execute(f"PREPARE claim({', '.join(params.values())}) AS {statement}")
    args = ("w-1", ["default"], 10, timezone.now(), 100)
    claim = "EXECUTE claim(%s, %s, %s, %s, %s)"
    assert reads(planner, "instance_tenant_due_order", claim, args, alias="d")
    assert reads(planner, "instance_tenant_due_order", claim, args, alias="w")


def test_the_next_due_instant_reads_the_due_indexes(planner: psycopg.Connection[Any]) -> None:
    # cleat.next_due_at's two statements: the queues' next ready run of all tenants, then of
    # one tenant.
    function = workflows_sql.NEXT_DUE_AT_FUNCTION
    found = re.findall(r"RETURN \((SELECT min\(next_wake_at\).*?)\);", function, re.S)
    assert len(found) == 2, function
    every, one = (_placeholders(q, {"p_queues": "text[]", "p_tenant": "uuid"}) for q in found)
    planner.execute(f"PREPARE every_tenant(text[], uuid) AS {every}")
    planner.execute(f"PREPARE one_tenant(text[], uuid) AS {one}")
    args = (["default"], uuid.uuid4())
    assert reads(planner, "instance_due", "EXECUTE every_tenant(%s, %s)", args)
    assert reads(planner, "instance_tenant_due_order", "EXECUTE one_tenant(%s, %s)", args)


def test_the_reaper_reads_running_runs_by_instance_due(planner: psycopg.Connection[Any]) -> None:
    # cleat.reap_expired_leases' statement: the running runs of every tenant whose lease
    # expired.
    reap = _function_statement(
        workflows_sql.definer_functions_sql("cleat_app"),
        "reap_expired_leases",
        {"p_cutoff": "timestamptz", "p_now": "timestamptz"},
    )
    planner.execute(f"PREPARE reap(timestamptz, timestamptz) AS {reap}")
    now = timezone.now()
    assert reads(planner, "instance_due", "EXECUTE reap(%s, %s)", (now - timedelta(60), now))
