"""An event's tenant is not a foreign key constraint (migration 0034): writing a run's events
must not lock its tenant's row. With the constraint, every transaction that wrote an event
locked that one row (``FOR KEY SHARE`` on PostgreSQL, a shared lock on MariaDB): every
worker process's appends and finalizes of the tenant, and on PostgreSQL two at once made a
MultiXact of the lock. The event's foreign key to its run stays: the purge's plain DELETE of
runs relies on it (workflows/retention.py).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction

from engine.events import DurableLogEvent
from tests.integration.test_group_commit import _claimed_runs

pytestmark = pytest.mark.django_db(transaction=True)

EVENTS = "workflows_workflowevent"


def _constraints(table: str) -> dict[str, Any]:
    """The table's constraints and indexes in the database, as Django's introspection reads
    them."""
    with connection.cursor() as cursor:
        return connection.introspection.get_constraints(cursor, table)


def _foreign_keys(table: str) -> dict[str, tuple[str, str]]:
    """The table's foreign key constraints in the database: column -> (table, column)."""
    return {
        info["columns"][0]: info["foreign_key"]
        for info in _constraints(table).values()
        if info["foreign_key"]
    }


def test_an_event_refers_to_its_run_in_the_database_and_not_to_its_tenant() -> None:
    keys = _foreign_keys(EVENTS)
    assert keys.get("instance_id") == ("workflows_workflowinstance", "id")
    assert "tenant_id" not in keys
    # The run keeps its own constraint to its tenant.
    assert _foreign_keys("workflows_workflowinstance").get("tenant_id") == (
        "workflows_tenant",
        "id",
    )


def test_no_index_is_left_on_the_events_tenant() -> None:
    """MariaDB's InnoDB made one for the constraint; the migration drops it with the
    constraint (no read of events goes by tenant alone)."""
    assert [
        name
        for name, info in _constraints(EVENTS).items()
        if info["index"] and info["columns"] == ["tenant_id"]
    ] == []


def _lock_tenant_elsewhere(tenant_id: Any) -> str:
    """On another connection: lock the tenant's row for update without waiting. "locked"
    when it could, else the database's refusal."""
    outcome: list[str] = []

    def attempt() -> None:
        try:
            if connection.vendor == "postgresql":
                from tests.integration.test_rls import connect_as, table_owner

                with connect_as(table_owner()) as owner:  # the app role may not UPDATE tenants
                    owner.execute(
                        "SELECT id FROM workflows_tenant WHERE id = %s FOR UPDATE NOWAIT",
                        [tenant_id],
                    )
                    owner.rollback()
            else:
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT id FROM workflows_tenant WHERE id = %s FOR UPDATE NOWAIT",
                        [tenant_id.hex],
                    )
            outcome.append("locked")
        except Exception as exc:  # the refusal is the answer
            outcome.append(f"{type(exc).__name__}: {exc}")
        finally:
            connections.close_all()

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join(30)
    return outcome[0]


@pytest.mark.server_db  # SQLite has no row locks
def test_appending_a_runs_events_leaves_its_tenants_row_unlocked(tenant: Any) -> None:
    from workflows.store.storage import DjangoStorage

    [ref] = _claimed_runs(tenant, 1, "lock-test")
    event = DurableLogEvent(step=0, ts=1, message="one")
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # The constraints are deferred to the commit: check them at each write, where a
            # constraint to the tenant would lock its row (MariaDB checks at once).
            with connection.cursor() as cursor:
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        DjangoStorage(tenant.id).append_events(ref, [event])
        assert _lock_tenant_elsewhere(tenant.id) == "locked"
    # ...and the event was written, in the transaction that just committed.
    from workflows.models import WorkflowEvent
    from workflows.tenancy import tenant_context

    with tenant_context(tenant.id):
        stored = WorkflowEvent.objects.get(instance_id=ref.run_id, step=0)
    assert stored.tenant_id == tenant.id


@pytest.mark.server_db
def test_writing_an_event_for_a_run_that_does_not_exist_is_refused(tenant: Any) -> None:
    """The constraint that stays: an event's run must exist."""
    import uuid

    from workflows.models import WorkflowEvent
    from workflows.tenancy import tenant_context

    with pytest.raises(DatabaseError), tenant_context(tenant.id), transaction.atomic():
        WorkflowEvent.objects.create(
            tenant_id=tenant.id,
            instance_id=uuid.uuid4(),
            step=0,
            type_code=1,
            payload="{}",
            timestamp_ms=1,
        )
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
