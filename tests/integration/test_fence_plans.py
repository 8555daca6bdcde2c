"""The functions that check a run's fence find each run by its primary key (migration 0036),
whatever the statistics say about running runs.

Running runs are rare in the statistics: most runs have ended, and a table analyzed while its
runs waited holds none. With the fence's owner and status compared by a bare ``=``, the plans
the functions keep could then read the runs through ``instance_due`` (every running run) or
``instance_owner`` (every run of the worker) and compare each with every run of the call:
work that grows with the running runs of every worker. Here the table is analyzed while every
run waits, two workers then claim runs, and each function is called for one worker's runs, as
the tables' owner, with the plan a connection would keep (a generic one) and with one made
for the call's values (a custom one). The indexes each call scanned are the transaction's own
counts (``pg_stat_get_xact_numscans``): the primary key's, and not the two indexes of running
runs.

PostgreSQL only: the functions are PostgreSQL's (other databases fence through the ORM, by
the run's key).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import wasmtime
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from bench.engine_bench import STEPS_WAT
from engine.storage import RunRef
from tests.integration.test_rls import connect_as, table_owner
from workflows.store.lifecycle import Claim, claim_ready_instances
from workflows.store.sql.postgresql import CLAIMED_SETTING
from workflows.tenancy import TENANT_SETTING, tenant_context

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

WORKER = "fence-plan-a"
RUNS_INDEXES = ("instance_due", "instance_owner", "instance_listing")
KEY = "workflows_workflowinstance_pkey"


@pytest.fixture(params=["force_generic_plan", "force_custom_plan"])
def planned(request: Any, tenant: Any) -> Iterator[tuple[Any, list[Claim]]]:
    """A cursor of the tables' owner, in a transaction rolled back at the end, whose
    statistics were taken while every run waited and whose plans are made the way
    ``request.param`` says; and the runs one of two workers then claimed.

    The statistics are the transaction's own (``ANALYZE`` in it, rolled back with it), so
    the tests that plan after these see the table as they would have."""
    from workflows.definitions import deploy_definition
    from workflows.services import start_workflow

    deploy_definition(tenant, "steps", wasmtime.wat2wasm(STEPS_WAT))
    for _ in range(60):
        start_workflow(tenant, "steps", 1)
    with connect_as(table_owner()) as owner:
        try:
            owner.execute("ANALYZE workflows_workflowinstance")
            mine = claim_ready_instances(WORKER, ["default"], 20, timezone.now())
            claim_ready_instances("fence-plan-b", ["default"], 20, timezone.now())
            assert len(mine) == 20
            cursor = owner.cursor()
            cursor.execute("SELECT set_config('plan_cache_mode', %s, true)", [request.param])
            cursor.execute("SELECT set_config(%s, %s, true)", [TENANT_SETTING, str(tenant.id)])
            # The table is small here: scanning it would be the planner's choice. On a table
            # of production size an index is, so the choice tested is between the indexes.
            cursor.execute("SET LOCAL enable_seqscan = off")
            yield cursor, mine
        finally:
            owner.rollback()


def _scans(cursor: Any) -> dict[str, int]:
    """Index scans made by this transaction so far, by index."""
    names = (KEY, *RUNS_INDEXES)
    cursor.execute(
        "SELECT relname, pg_stat_get_xact_numscans(oid) FROM pg_class WHERE relname = ANY(%s)",
        [list(names)],
    )
    return dict(cursor.fetchall())


def _runs_json(claims: list[Claim], **fields: Any) -> str:
    now = timezone.now().isoformat()
    return json.dumps(
        [
            {
                "id": str(c.id),
                "tenant": str(c.tenant_id),
                "worker": WORKER,
                "generation": c.generation,
                "first": 0,
                "next": 0,
                "now": now,
                **fields,
            }
            for c in claims
        ]
    )


def _read_by_key(cursor: Any, calls: int) -> None:
    scans = _scans(cursor)
    assert {name: scans[name] for name in RUNS_INDEXES} == dict.fromkeys(RUNS_INDEXES, 0)
    assert scans[KEY] >= calls


def test_the_one_run_loads_read_the_run_by_its_key(planned: tuple[Any, list[Claim]]) -> None:
    cursor, claims = planned
    args = "p_tenant => %s, p_id => %s, p_generation => %s, p_worker => %s"
    found = 0
    for c in claims:
        params = [str(c.tenant_id), str(c.id), c.generation, WORKER]
        cursor.execute(f"SELECT count(*) FROM cleat.load_instance({args})", params)
        found += cursor.fetchone()[0]
        cursor.execute(f"SELECT count(*) FROM cleat.load_history({args})", params)
    assert found == len(claims)
    _read_by_key(cursor, 2 * len(claims))


def test_the_claims_loads_read_the_runs_by_their_key(planned: tuple[Any, list[Claim]]) -> None:
    cursor, claims = planned
    listed = [
        {"id": str(c.id), "tenant": str(c.tenant_id), "generation": c.generation} for c in claims
    ]
    cursor.execute("SELECT set_config(%s, %s, true)", [CLAIMED_SETTING, json.dumps(listed)])
    cursor.execute("SELECT count(*) FROM cleat.load_claimed_instances(%s)", [WORKER])
    assert cursor.fetchone()[0] == len(claims)
    cursor.execute("SELECT count(*) FROM cleat.load_claimed_histories(%s)", [WORKER])
    _read_by_key(cursor, len(claims))


def test_the_append_finds_the_runs_by_their_key(planned: tuple[Any, list[Claim]]) -> None:
    cursor, claims = planned
    cursor.execute("SELECT count(*) FROM cleat.append_events(%s, '[]')", [_runs_json(claims)])
    assert cursor.fetchone()[0] == len(claims)
    _read_by_key(cursor, 1)


def test_the_finalize_finds_the_runs_by_their_key(planned: tuple[Any, list[Claim]]) -> None:
    cursor, claims = planned
    now = timezone.now().isoformat()
    runs = _runs_json(
        claims,
        first=None,
        next=None,
        status="done",
        updated_at=now,
        result="true",
        query_state="{}",
        lock_holder=None,
        updates_result=None,
    )
    cursor.execute("SELECT count(*) FROM cleat.finalize_done(%s, '[]')", [runs])
    assert cursor.fetchone()[0] == len(claims)
    _read_by_key(cursor, 1)


def _statements_of(action: Any) -> list[str]:
    """The statements on the run table that ``action()`` sends through the ORM (as the app
    role, in a transaction rolled back), as sent."""
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        action()
        transaction.set_rollback(True)
    return [q["sql"] for q in captured.captured_queries if "workflows_workflowinstance" in q["sql"]]


def _orm_fence_statements(claim: Claim) -> list[str]:
    """What the ORM's fenced operations send for one claimed run: the fenced lock (its event
    count, and the whole row), the heartbeat, the release and the load's general path."""
    from workflows.store import lifecycle
    from workflows.store.storage import DjangoStorage, lock_fenced, lock_fenced_instance

    ref = RunRef(str(claim.tenant_id), "", str(claim.id), WORKER, claim.generation)

    def fenced() -> None:
        with tenant_context(claim.tenant_id):
            lock_fenced(ref)
            lock_fenced_instance(ref)

    def general_load() -> None:  # inside a transaction: not the one-message load
        assert lifecycle.load_run(Claim(claim.id, claim.tenant_id, claim.generation), WORKER)

    statements = [
        *_statements_of(fenced),
        *_statements_of(lambda: DjangoStorage(claim.tenant_id).heartbeat(ref)),
        *_statements_of(lambda: lifecycle.release(ref)),
        *_statements_of(general_load),
    ]
    assert len(statements) == 5, statements
    return statements


def test_the_orms_fenced_statements_find_the_run_by_its_key(
    planned: tuple[Any, list[Claim]],
) -> None:
    """The ORM's fence (``storage.held_by``), where the database is not asked through the
    functions: each statement the fenced operations send, planned as the owner with the
    statistics taken while every run waited."""
    cursor, claims = planned
    statements = _orm_fence_statements(claims[0])
    cursor.execute("SAVEPOINT orm")
    for sql in statements:
        cursor.execute(sql.replace("%", "%%"))
    _read_by_key(cursor, len(statements))
    cursor.execute("ROLLBACK TO SAVEPOINT orm")


def test_the_fenced_lock_reads_the_row_as_the_orm_does(tenant: Any) -> None:
    """PostgreSQL's fenced lock is a statement written once (``lock_fenced_instance`` in
    sql/postgresql.py), not the ORM's query: it reads the same values, leaves the checkpoint
    deferred (the finalize's save writes what was loaded), and refuses a fence that moved."""
    from engine.errors import FenceLost
    from workflows.definitions import deploy_definition
    from workflows.models import WorkflowInstance
    from workflows.services import start_workflow
    from workflows.store.columns import LOCKED_COLUMNS
    from workflows.store.storage import lock_fenced_instance

    deploy_definition(tenant, "steps", wasmtime.wat2wasm(STEPS_WAT))
    start_workflow(tenant, "steps", 1)
    [claim] = claim_ready_instances(WORKER, ["default"], 1, timezone.now())
    ref = RunRef(str(claim.tenant_id), "", str(claim.id), WORKER, claim.generation)
    with tenant_context(claim.tenant_id):
        locked = lock_fenced_instance(ref)
        read = WorkflowInstance.objects.get(id=claim.id)
        for moved in (
            RunRef(ref.tenant_id, "", ref.run_id, "another-worker", ref.generation),
            RunRef(ref.tenant_id, "", ref.run_id, WORKER, ref.generation + 1),
        ):
            with pytest.raises(FenceLost):
                lock_fenced_instance(moved)
    assert locked.get_deferred_fields() == {"compaction_state"}
    assert {f.attname: getattr(locked, f.attname) for f in LOCKED_COLUMNS.fields} == {
        f.attname: getattr(read, f.attname) for f in LOCKED_COLUMNS.fields
    }
    assert locked.status == "running" and locked.assigned_to == WORKER
