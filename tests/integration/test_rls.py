"""PostgreSQL row-level security, exercised as the application role.

The suite is connected as ``cleat_app`` (tests/conftest.py): no superuser, no BYPASSRLS, not
the tables' owner. These tests show that the database itself -- not just the store's
explicit filters -- keeps tenants apart: every tenant-scoped table hides the other tenant's
rows and refuses writes into it, a query without a tenant fails instead of returning
everything, the cross-tenant claim goes through the definer functions only, and
``bypass_reasons`` / ``check_rls`` name every way a connection escapes the policies.
Anything these tests change in the schema is rolled back and checked to be back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import DataError, ProgrammingError, connection, transaction
from django.utils import timezone

from engine.events import SleepEvent, encode
from engine.status import AbiStatus
from engine.storage import RunRef
from schedules.models import Schedule
from schedules.rls import SCHEDULE_TABLES
from tests.fixtures.wat import Wat
from workflows import definitions
from workflows import services as svc
from workflows.models import (
    ApiKey,
    AuditLog,
    ConcurrencyKey,
    Invocation,
    Promise,
    RetentionPolicy,
    RoutingRule,
    RunStatus,
    Signal,
    TaskCall,
    Tenant,
    TenantScoped,
    UpdateRequest,
    VersionTag,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
    WorkflowState,
)
from workflows.rls import (
    DISPATCHER_ROLE,
    WORKFLOW_TABLES,
    app_role,
    bypass_reasons,
    format_reasons,
)
from workflows.store.lifecycle import (
    claim_ready_instances,
    heartbeat_worker,
    next_due_at,
    reap_expired_leases,
)
from workflows.store.sql.postgresql import DEFINER_FUNCTIONS, MISSED_WAKES_SIGNATURE
from workflows.store.storage import DjangoStorage
from workflows.tenancy import tenant_context

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

TABLES = (*WORKFLOW_TABLES, *SCHEDULE_TABLES)
NOT_SET = "cleat.tenant_id is not set"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _as_the_application_role(transactional_db: Any) -> None:
    """These tests mean nothing on another database or as another role: say so loudly."""
    assert connection.vendor == "postgresql", "postgres_only test run against " + connection.vendor
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        assert cursor.fetchone()[0] == app_role()


class RawConnection:
    """A psycopg connection as much of a Django connection as ``bypass_reasons`` uses."""

    vendor = "postgresql"

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def cursor(self) -> psycopg.ClientCursor[Any]:
        return self.conn.cursor()


def table_owner() -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = %s",
            ["workflows_workflowinstance"],
        )
        return str(cursor.fetchone()[0])


def connect_as(user: str) -> psycopg.Connection[Any]:
    """A second connection to the test database (trust authentication) as ``user``; not
    in autocommit, so everything it does is one transaction until commit or rollback."""
    params = connection.settings_dict
    return psycopg.connect(
        dbname=params["NAME"],
        host=params["HOST"] or "127.0.0.1",
        port=params["PORT"] or 5432,
        user=user,
        cursor_factory=psycopg.ClientCursor,
    )


@pytest.fixture
def owner() -> Iterator[psycopg.Connection[Any]]:
    conn = connect_as(table_owner())
    yield conn
    conn.rollback()
    conn.close()


def database_url(user: str) -> str:
    params = connection.settings_dict
    host, port = params["HOST"] or "127.0.0.1", params["PORT"] or 5432
    return f"postgres://{user}@{host}:{port}/{params['NAME']}"


def manage(*args: str, user: str) -> subprocess.CompletedProcess[str]:
    """``manage.py ARGS`` in a fresh process on the production settings, connected to the
    test database as ``user``."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    env.update(DEBUG="1", DATABASE_URL=database_url(user))
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def count(table: str, tenant: Tenant | None = None) -> int:
    with connection.cursor() as cursor:
        if tenant is None:
            cursor.execute(f"SELECT count(*) FROM {table}")
        else:
            cursor.execute(f"SELECT count(*) FROM {table} WHERE tenant_id = %s", [tenant.id])
        return int(cursor.fetchone()[0])


def note_wasm(text: str) -> bytes:
    w = Wat()
    w.run(f"(call $note {w.s(text)}) (call $finish)")
    return w.wasm()


def seed(tenant: Tenant) -> set[str]:
    """One row in every tenant-scoped table, written in ``tenant``'s context; returns the
    tables written."""
    created: list[Any] = []
    key = tenant.name
    with tenant_context(tenant.id):
        definition = WorkflowDefinition.objects.create(
            tenant=tenant, name="seeded", version=1, wasm=b"\0asm", sha256="0" * 64
        )
        run = WorkflowInstance.objects.create(
            tenant=tenant,
            workflow_id=f"seeded-{key}",
            definition=definition,
            definition_name="seeded",
            definition_version=1,
        )
        stored = encode(SleepEvent(step=0, ts=1, duration_ms=5, wake_at_ms=6))
        created += [
            definition,
            run,
            ApiKey.issue(tenant, f"key-{key}")[0],
            VersionTag.objects.create(tenant=tenant, name="seeded", tag="stable", version=1),
            RoutingRule.objects.create(tenant=tenant, name="seeded", version=1, weight=1.0),
            WorkflowEvent.objects.create(
                tenant=tenant,
                instance=run,
                step=0,
                type_code=stored.type_code,
                payload=stored.payload,
                timestamp_ms=stored.ts,
                checksum=stored.checksum,
            ),
            Signal.objects.create(tenant=tenant, instance=run, name="go"),
            Promise.objects.create(id=f"p-{key}", tenant=tenant, instance=run, name="p"),
            UpdateRequest.objects.create(tenant=tenant, instance=run, name="u"),
            ConcurrencyKey.objects.create(tenant=tenant, key=f"lock-{key}", holder="x"),
            WorkflowState.objects.create(tenant=tenant, scope=f"obj:t:{key}", key="k", value="1"),
            Invocation.objects.create(
                id=f"i-{key}",
                tenant=tenant,
                instance=run,
                service="s",
                operation="o",
                request="{}",
                idempotency_key="k",
                deliver_at=timezone.now(),
            ),
            AuditLog.objects.create(tenant=tenant, instance=run, action="seed", operator="t"),
            RetentionPolicy.objects.create(tenant=tenant, finished_days="7"),
            TaskCall.objects.create(
                id=uuid.uuid4(),
                tenant=tenant,
                instance=run,
                step=0,
                service="billing",
                operation="charge",
                idempotency_key="k",
                token="t",
            ),
            Schedule.objects.create(
                tenant=tenant, name=f"sched-{key}", workflow_name="seeded", cron="0 * * * *"
            ),
        ]
    return {type(row)._meta.db_table for row in created}


def test_every_tenant_scoped_model_is_under_rls() -> None:
    """The tables the migrations put policies on are exactly the tenant-scoped models'
    tables, and each has row-level security enabled and forced with one policy."""
    scoped = {m._meta.db_table for m in apps.get_models() if issubclass(m, TenantScoped)}
    assert scoped == set(TABLES)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
                   (SELECT count(*) FROM pg_policies p WHERE p.tablename = c.relname)
              FROM pg_class c
             WHERE c.relname = ANY(%s) AND c.relnamespace = current_schema()::regnamespace
            """,
            [list(TABLES)],
        )
        rows = {name: rest for name, *rest in cursor.fetchall()}
    assert rows == {table: [True, True, 1] for table in TABLES}


def test_a_tenant_sees_none_of_anothers_rows_in_any_table(tenant: Tenant, other_tenant: Tenant):
    """One row per table for each tenant. In A's context every table counts A's row only --
    with no WHERE clause at all, so it is the policy that filters -- and none of B's; in B's
    context the reverse."""
    assert seed(other_tenant) == set(TABLES)
    assert seed(tenant) == set(TABLES)
    for me, them in ((tenant, other_tenant), (other_tenant, tenant)):
        with tenant_context(me.id):
            for table in TABLES:
                assert count(table) == 1, table
                assert count(table, me) == 1, table
                assert count(table, them) == 0, table
            assert WorkflowInstance.objects.count() == 1
            assert {s.tenant_id for s in Signal.objects.all()} == {me.id}


def test_a_query_without_a_tenant_raises(tenant: Tenant, subtests: pytest.Subtests) -> None:
    """Fail-closed, on every table: outside a tenant context the policy raises (it does not
    return every tenant's rows, nor silently none), for reads and writes alike."""
    assert seed(tenant) == set(TABLES)
    for table in TABLES:
        with subtests.test(table):
            with pytest.raises(ProgrammingError, match=NOT_SET):
                count(table)
            with pytest.raises(ProgrammingError, match=NOT_SET), connection.cursor() as cursor:
                cursor.execute(f"UPDATE {table} SET tenant_id = tenant_id")
            with pytest.raises(ProgrammingError, match=NOT_SET), connection.cursor() as cursor:
                cursor.execute(f"DELETE FROM {table}")
            with tenant_context(tenant.id):
                assert count(table) == 1


def test_the_tenant_setting_does_not_outlive_its_context(tenant: Tenant, other_tenant: Tenant):
    """The context is transaction-local: after it ends (or inside a nested one that ended)
    the connection is back to the enclosing tenant, or to none; an empty or malformed
    setting is refused too."""
    seed(tenant)
    seed(other_tenant)
    with pytest.raises(ProgrammingError, match=NOT_SET):
        WorkflowInstance.objects.count()
    with tenant_context(tenant.id):
        mine = WorkflowInstance.objects.get().id
        with tenant_context(other_tenant.id):
            assert WorkflowInstance.objects.get().tenant_id == other_tenant.id
        assert WorkflowInstance.objects.get().id == mine
    with pytest.raises(ProgrammingError, match=NOT_SET):
        WorkflowInstance.objects.count()
    for value, error, problem in (
        ("", ProgrammingError, NOT_SET),
        ("not-a-uuid", DataError, "invalid input syntax for type uuid"),
    ):
        with pytest.raises(error, match=problem), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('cleat.tenant_id', %s, true)", [value])
            WorkflowInstance.objects.count()


def test_writing_another_tenants_id_is_refused(
    tenant: Tenant, other_tenant: Tenant, subtests: pytest.Subtests
) -> None:
    """WITH CHECK, on every table: in A's context a row cannot be moved to B; B's rows can
    be neither updated nor deleted (they are invisible: zero rows affected)."""
    seed(tenant)
    seed(other_tenant)
    for table in TABLES:
        with subtests.test(table), tenant_context(tenant.id):
            with (
                pytest.raises(ProgrammingError, match="violates row-level security policy"),
                transaction.atomic(),
                connection.cursor() as cursor,
            ):
                cursor.execute(f"UPDATE {table} SET tenant_id = %s", [other_tenant.id])
            with connection.cursor() as cursor:
                cursor.execute(f"DELETE FROM {table} WHERE tenant_id = %s", [other_tenant.id])
                assert cursor.rowcount == 0
                cursor.execute(
                    f"UPDATE {table} SET tenant_id = tenant_id WHERE tenant_id = %s",
                    [other_tenant.id],
                )
                assert cursor.rowcount == 0
    for me in (tenant, other_tenant):
        with tenant_context(me.id):
            assert {table: count(table, me) for table in TABLES} == dict.fromkeys(TABLES, 1)


def test_inserting_a_row_for_another_tenant_is_refused(tenant: Tenant, other_tenant: Tenant):
    with tenant_context(tenant.id):
        with (
            pytest.raises(ProgrammingError, match="violates row-level security policy"),
            transaction.atomic(),
        ):
            WorkflowState.objects.create(tenant=other_tenant, scope="obj:x:y", key="k", value="1")
        WorkflowState.objects.create(tenant=tenant, scope="obj:x:y", key="k", value="1")
    with tenant_context(other_tenant.id):
        assert not WorkflowState.objects.exists()
    with tenant_context(tenant.id):
        assert WorkflowState.objects.get().tenant_id == tenant.id


def test_the_store_and_services_of_one_tenant_reach_nothing_of_another(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    """Through the real code paths as the application role: B's run is NotFound for A's
    services, A's storage reads nothing of it, and even an unfiltered ORM query in A's
    context does not find it."""
    definitions.deploy_definition(other_tenant, "job", note_wasm("b"))
    b_run, _ = svc.start_workflow(other_tenant, "job")
    svc.signal_workflow(other_tenant, str(b_run.id), "go", {"n": 1})
    with tenant_context(tenant.id):
        with pytest.raises(svc.NotFound):
            svc.get_instance(tenant, str(b_run.id))
        assert not WorkflowInstance.objects.filter(id=b_run.id).exists()
        assert not Signal.objects.filter(instance_id=b_run.id).exists()
    with pytest.raises(svc.NotFound):
        svc.signal_workflow(tenant, str(b_run.id), "go", {"n": 2})
    with pytest.raises(svc.NotFound):
        svc.query_state(tenant, str(b_run.id))
    ref = RunRef(str(tenant.id), str(b_run.id), str(b_run.id), "w", 0)
    storage = DjangoStorage(tenant.id)
    assert storage.next_signal(ref, ["go"], ()) is None
    [hidden] = storage.child_outcomes(ref, [str(b_run.id)])
    assert hidden is not None and hidden.status == AbiStatus.NOT_FOUND
    with tenant_context(other_tenant.id):
        assert Signal.objects.filter(instance_id=b_run.id).count() == 1
        assert svc.get_instance(other_tenant, str(b_run.id)).status == RunStatus.READY


# --- bypass detection --------------------------------------------------------------------------


def test_the_application_role_has_no_bypass() -> None:
    assert bypass_reasons(connection) == []
    out = StringIO()
    call_command("check_rls", stdout=out)
    assert "row-level security is enforced" in out.getvalue()


def test_a_superuser_connection_is_named_as_bypassing() -> None:
    conn = connect_as("postgres")
    try:
        reasons = bypass_reasons(RawConnection(conn))
    finally:
        conn.close()
    assert {r.kind for r in reasons} == {"superuser", "bypassrls"}
    message = format_reasons(reasons)
    assert "'postgres' is a superuser" in message and "BYPASSRLS" in message
    assert app_role() in message


def test_check_rls_command_fails_for_a_superuser_and_passes_for_the_app_role() -> None:
    bad = manage("check_rls", user="postgres")
    assert bad.returncode != 0
    assert "[superuser]" in bad.stderr and "[bypassrls]" in bad.stderr
    assert "Traceback" not in bad.stderr
    good = manage("check_rls", user=app_role())
    assert good.returncode == 0, good.stderr
    assert "row-level security is enforced" in good.stdout


def rls_flags(conn: psycopg.Connection[Any]) -> dict[str, tuple[bool, bool, int]]:
    rows = conn.execute(
        """
        SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
               (SELECT count(*) FROM pg_policies p WHERE p.tablename = c.relname)
          FROM pg_class c
         WHERE c.relname = ANY(%s) AND c.relnamespace = current_schema()::regnamespace
        """,
        [list(TABLES)],
    ).fetchall()
    return {name: (enabled, forced, int(policies)) for name, enabled, forced, policies in rows}


def test_weakened_tables_are_named_and_the_schema_is_left_intact(owner: Any) -> None:
    """As the tables' owner, inside one transaction that is rolled back: RLS not forced on
    one table, disabled on another, the policy dropped on a third -- each is named with
    its table, and nothing else is. Afterwards every table is as the migrations left it."""
    intact = {table: (True, True, 1) for table in TABLES}
    assert rls_flags(owner) == intact
    owner.rollback()
    user = owner.execute("SELECT current_user").fetchone()[0]
    try:
        owner.execute("SET LOCAL lock_timeout = '10s'")
        owner.execute("ALTER TABLE workflows_signal NO FORCE ROW LEVEL SECURITY")
        owner.execute("ALTER TABLE workflows_promise DISABLE ROW LEVEL SECURITY")
        owner.execute("DROP POLICY tenant_isolation ON workflows_auditlog")
        reasons = bypass_reasons(RawConnection(owner))
    finally:
        owner.rollback()
    table_reasons = {
        (r.kind, r.detail) for r in reasons if r.kind not in ("superuser", "bypassrls")
    }
    assert table_reasons == {
        (
            "owner_not_forced",
            f"{user!r} owns workflows_signal and RLS is not forced on it "
            "(FORCE ROW LEVEL SECURITY)",
        ),
        ("rls_disabled", "row-level security is off on workflows_promise"),
        ("no_policies", "workflows_auditlog has no policies"),
    }
    assert rls_flags(owner) == intact
    owner.rollback()
    assert bypass_reasons(connection) == []


def test_a_missing_table_is_named(owner: Any) -> None:
    reasons = bypass_reasons(RawConnection(owner), tables=("workflows_nosuchtable",))
    assert ("rls_disabled", "table workflows_nosuchtable does not exist (migrate?)") in {
        (r.kind, r.detail) for r in reasons
    }


# --- the cross-tenant definer functions ---------------------------------------------------


def test_the_claim_crosses_tenants_and_nothing_else_does(tenant: Tenant, other_tenant: Tenant):
    """Outside any tenant context the application role claims, heartbeats, reaps and
    finds the next due run across both tenants -- through the definer functions -- yet a
    plain query still raises and A's context still shows only A's runs."""
    for t, runs in ((tenant, 2), (other_tenant, 1)):
        definitions.deploy_definition(t, "job", note_wasm(t.name))
        for _ in range(runs):
            svc.start_workflow(t, "job")
    now = timezone.now() + timedelta(seconds=1)

    assert next_due_at(["default"]) is not None
    claims = claim_ready_instances("w", ["default"], 10, now)
    assert sorted(str(c.tenant_id) for c in claims) == sorted(
        [str(tenant.id)] * 2 + [str(other_tenant.id)]
    )
    with pytest.raises(ProgrammingError, match=NOT_SET):
        WorkflowInstance.objects.filter(status=RunStatus.RUNNING).count()
    with tenant_context(tenant.id):
        assert WorkflowInstance.objects.filter(status=RunStatus.RUNNING).count() == 2
    with tenant_context(other_tenant.id):
        assert WorkflowInstance.objects.filter(status=RunStatus.RUNNING).count() == 1

    assert heartbeat_worker("w", now) == 3
    assert reap_expired_leases(timedelta(0), now + timedelta(seconds=1)) == 3
    later = now + timedelta(seconds=2)
    only_a = claim_ready_instances("w2", ["default"], 10, later, tenant.id)
    assert {c.tenant_id for c in only_a} == {tenant.id} and len(only_a) == 2
    rest = claim_ready_instances("w3", ["default"], 10, later)
    assert [c.tenant_id for c in rest] == [other_tenant.id]


def test_the_definer_role_is_narrow_and_out_of_the_app_roles_reach() -> None:
    """Every function the dispatcher role owns (the claim among them) is a definer function
    only the application role may run (not PUBLIC); the dispatcher cannot log in, the
    application role cannot become it, and on tenant-scoped tables it may at most read and
    update (no insert, delete or truncate)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT p.oid::regprocedure::text, p.prosecdef,
                   (SELECT count(*) FROM aclexplode(p.proacl) a WHERE a.grantee = 0),
                   has_function_privilege(current_user, p.oid, 'EXECUTE')
              FROM pg_proc p WHERE p.proowner = %s::regrole
            """,
            [DISPATCHER_ROLE],
        )
        owned = {name: rest for name, *rest in cursor.fetchall()}
        expected = set()
        for function in (*DEFINER_FUNCTIONS, MISSED_WAKES_SIGNATURE):
            cursor.execute("SELECT %s::regprocedure::text", [function])
            expected.add(cursor.fetchone()[0])
        assert expected <= set(owned)
        assert all(rest == [True, 0, True] for rest in owned.values()), owned
        cursor.execute(
            "SELECT rolcanlogin, pg_has_role(current_user, oid, 'MEMBER') FROM pg_roles "
            "WHERE rolname = %s",
            [DISPATCHER_ROLE],
        )
        assert cursor.fetchone() == (False, False)
        for table in TABLES:
            cursor.execute(
                "SELECT has_table_privilege(%s, %s, 'INSERT, DELETE, TRUNCATE')",
                [DISPATCHER_ROLE, table],
            )
            assert cursor.fetchone()[0] is False, table
    with pytest.raises(ProgrammingError, match="permission denied"), connection.cursor() as c:
        c.execute(f"SET ROLE {DISPATCHER_ROLE}")


def test_the_application_role_cannot_weaken_rls() -> None:
    """Not the owner: it cannot turn RLS off or drop a policy (so a compromised app
    connection cannot undo the isolation)."""
    for statement in (
        "ALTER TABLE workflows_workflowinstance NO FORCE ROW LEVEL SECURITY",
        "ALTER TABLE workflows_workflowinstance DISABLE ROW LEVEL SECURITY",
        "DROP POLICY tenant_isolation ON workflows_workflowinstance",
    ):
        with (
            pytest.raises(ProgrammingError, match="must be owner"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(statement)
