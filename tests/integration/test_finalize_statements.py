"""The general finalize's statements written once: the locked row's save
(``store.columns.RowColumns.save``, the UPDATE whose text is built once instead of compiled by
the ORM at each finalize) and the readiness rule read by one function on PostgreSQL
(``store.wake.wakeup_arrived``, ``cleat.wakeup_arrived`` in ``sql/postgresql.py``).
Each is checked against what the ORM does. Runs on every database the suite is pointed at
(SQLite by default; PostgreSQL as the RLS-bound application role; MariaDB)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection
from django.db.models.signals import post_save
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from engine.status import AbiStatus
from engine.storage import RunRef
from tests.fixtures.wat import Wat
from workflows import services
from workflows.models import (
    Promise,
    RunStatus,
    Signal,
    TaskCall,
    Tenant,
    UpdateRequest,
    WorkflowInstance,
)
from workflows.store import wake
from workflows.store.columns import INSTANCE_COLUMNS, LOCKED_COLUMNS, create_run
from workflows.store.sql import queries
from workflows.store.storage import DjangoStorage
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def start(tenant: Tenant) -> Iterator[Callable[[], str]]:
    """Starts a run of a deployed definition (ready, not run): its id."""
    env = DatabaseWorkflowEnvironment(tenant)
    w = Wat()
    w.run("(call $finish)")
    env.deploy("leaf", w.wasm())

    def started() -> str:
        return str(services.start_workflow(tenant, "leaf", {"n": 1})[0].id)

    yield started
    env.close()


def _locked(run_id: str) -> WorkflowInstance:
    """The run as the general finalize's fenced lock loads it: all but the checkpoint, made
    from its raw row by ``LOCKED_COLUMNS.instance`` (as on PostgreSQL)."""
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in LOCKED_COLUMNS.fields)
    table = quote(WorkflowInstance._meta.db_table)
    pk = WorkflowInstance._meta.pk
    assert pk is not None
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns} FROM {table} WHERE {quote(pk.column)} = %s",
            [pk.get_db_prep_value(uuid.UUID(run_id), connection)],
        )
        row = cursor.fetchone()
    return LOCKED_COLUMNS.instance(row)


def _ormlocked(run_id: str) -> WorkflowInstance:
    """The run as the ORM's fenced lock loads it (the other databases)."""
    return WorkflowInstance.objects.defer("compaction_state").get(id=run_id)


def _row(run_id: str) -> dict[str, Any]:
    values = WorkflowInstance.objects.filter(id=run_id).values().get()
    return {k: v for k, v in values.items() if k not in ("id", "updated_at", "workflow_id")}


def _transition(instance: WorkflowInstance, now: Any) -> None:
    """What a finalize changes on a run that goes to sleep, and more: a sealed result, JSON,
    times, the owner cleared."""
    instance.status = RunStatus.READY
    instance.waiting_on = {"kind": "signal", "signals": ["go", "ünï"], "wake_at_ms": None}
    instance.query_state = {"progress": [1, 2, 3]}
    instance.result = '{"partial": "välue"}'
    instance.error, instance.error_code = "boom", "E_TEST"
    instance.next_wake_at = now + timedelta(hours=1)
    instance.heartbeat_at = now
    instance.event_count = 7
    instance.attempt = 3
    instance.assigned_to = None


def test_the_locked_save_writes_what_the_orms_save_writes(
    tenant: Tenant, start: Callable[[], str]
) -> None:
    """Two runs, the same changes: one saved by the statement built once, the other by the
    ORM's save(). The rows then hold the same values in every column (but each run's own
    id, workflow id and save time), the checkpoint untouched, and the statement was one
    UPDATE."""
    fast, orm = start(), start()
    now = timezone.now()
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id__in=[fast, orm]).update(
            compaction_state={"checkpoint": "kept"}, created_at=now
        )
        one, other = _locked(fast), _locked(orm)
        _transition(one, now)
        _transition(other, now)
        before = timezone.now()
        with CaptureQueriesContext(connection) as captured:
            LOCKED_COLUMNS.save(one)
        other.save()
        assert len(captured.captured_queries) == 1
        statement = captured.captured_queries[0]["sql"]
        assert statement.lstrip().upper().startswith("UPDATE")
        assert "compaction_state" not in statement
        # only what changed since the load: not the input, the name, the status (ready, as
        # it was)...
        for unchanged in ("input", "definition_name", "status", "task_queue"):
            assert f"{connection.ops.quote_name(unchanged)} =" not in statement, unchanged
        for changed in ("waiting_on", "result", "attempt", "next_wake_at", "updated_at"):
            assert f"{connection.ops.quote_name(changed)} =" in statement, changed
        assert _row(fast) == _row(orm)
        saved = WorkflowInstance.objects.get(id=fast)
        # auto_now written as the ORM writes it; the sealed result read back as written
        assert saved.updated_at >= before and one.updated_at == saved.updated_at
        assert saved.result == '{"partial": "välue"}'
        assert saved.waiting_on == one.waiting_on
        assert WorkflowInstance.stored_checkpoint(tenant.id, fast) == {"checkpoint": "kept"}


def test_the_locked_save_writes_each_change_since_the_last_save(
    tenant: Tenant, start: Callable[[], str]
) -> None:
    """After a save, what changes next is measured from the saved values: a JSON value
    changed in place is written, a value set back to what is stored is not; an instance the
    ORM loaded (the fenced lock on the other databases) has all its loaded columns written."""
    run = start()
    quote = connection.ops.quote_name
    with tenant_context(tenant.id):
        locked = _locked(run)
        locked.waiting_on = {"kind": "timer", "wake_at_ms": 1}
        locked.attempt = 2
        LOCKED_COLUMNS.save(locked)
        locked.waiting_on["wake_at_ms"] = 2  # in place
        locked.attempt = 2  # as stored
        with CaptureQueriesContext(connection) as captured:
            LOCKED_COLUMNS.save(locked)
        statement = captured.captured_queries[0]["sql"]
        assert f"{quote('waiting_on')} =" in statement
        assert f"{quote('attempt')} =" not in statement
        stored = WorkflowInstance.objects.get(id=run)
        assert stored.waiting_on == {"kind": "timer", "wake_at_ms": 2}
        assert stored.attempt == 2

        loaded_by_the_orm = _ormlocked(run)
        loaded_by_the_orm.error = "orm"
        with CaptureQueriesContext(connection) as captured:
            LOCKED_COLUMNS.save(loaded_by_the_orm)
        statement = captured.captured_queries[0]["sql"]
        assert f"{quote('input')} =" in statement and f"{quote('error')} =" in statement
        assert "compaction_state" not in statement
        assert WorkflowInstance.objects.get(id=run).error == "orm"


def test_the_locked_save_leaves_other_instances_to_the_orm(
    tenant: Tenant, start: Callable[[], str]
) -> None:
    """An instance loaded whole (the checkpoint too) is saved by the ORM, checkpoint
    included; a listener to the model's save signals is called."""
    run = start()
    heard: list[Any] = []

    def listener(sender: Any, instance: Any, **kwargs: Any) -> None:
        heard.append(instance.pk)

    with tenant_context(tenant.id):
        whole = WorkflowInstance.objects.get(id=run)
        whole.compaction_state = {"checkpoint": "written"}
        LOCKED_COLUMNS.save(whole)
        assert WorkflowInstance.stored_checkpoint(tenant.id, run) == {"checkpoint": "written"}
        post_save.connect(listener, sender=WorkflowInstance)
        try:
            locked = _locked(run)
            locked.error = "heard"
            LOCKED_COLUMNS.save(locked)
        finally:
            post_save.disconnect(listener, sender=WorkflowInstance)
        assert heard == [locked.pk]
        assert WorkflowInstance.objects.get(id=run).error == "heard"


def _new_run(tenant: Tenant, definition_of: str, now: Any, **extra: Any) -> WorkflowInstance:
    """A run made as a start makes it (not saved): every kind of column set -- JSON, times,
    sealed text, a foreign key given as an object."""
    definition = WorkflowInstance.objects.get(id=definition_of).definition
    run_id = uuid.uuid4()
    return WorkflowInstance(
        id=run_id,
        tenant=tenant,
        workflow_id=str(run_id),
        definition=definition,
        definition_name=definition.name,
        definition_version=definition.version,
        entry_point="run",
        input='{"n": "ünï"}',
        priority=7,
        task_queue="inserts",
        allowed_signals=["go"],
        trace_id="0af7651916cd43dd8448eb211c80319c",
        next_wake_at=now,
        created_at=now,
        **extra,
    )


def test_the_insert_writes_what_the_orms_insert_writes(
    tenant: Tenant, start: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two new runs, the same values: one inserted by the statement built once, the other
    by the ORM's create. The rows then hold the same values in every column (but each run's
    own id, workflow id and save time); the statement was one INSERT of every column."""
    model = start()
    now = timezone.now()
    with tenant_context(tenant.id):
        fast = _new_run(tenant, model, now, continued_from_id=uuid.UUID(model))
        orm = _new_run(tenant, model, now)
        with CaptureQueriesContext(connection) as captured, monkeypatch.context() as patched:
            patched.setattr(WorkflowInstance, "save", lambda *a, **k: pytest.fail("ORM save"))
            INSTANCE_COLUMNS.insert(fast)
        orm.save(force_insert=True)
        assert len(captured.captured_queries) == 1
        statement = captured.captured_queries[0]["sql"]
        assert statement.lstrip().upper().startswith("INSERT")
        for field in INSTANCE_COLUMNS.fields:
            assert connection.ops.quote_name(field.column) in statement, field.column
        assert not fast._state.adding and fast._state.db == connection.alias
        written, expected = _row(str(fast.id)), _row(str(orm.id))
        assert written.pop("continued_from_id") == uuid.UUID(model)
        expected.pop("continued_from_id")
        assert written == expected
        stored = WorkflowInstance.objects.get(id=fast.id)
        assert stored.input == '{"n": "ünï"}' and stored.allowed_signals == ["go"]
        assert stored.updated_at == fast.updated_at  # auto_now, written as made


def test_the_insert_leaves_runs_with_save_listeners_to_the_orm(
    tenant: Tenant, start: Callable[[], str]
) -> None:
    """With a listener to the model's save signals the ORM inserts the run, and the
    listener hears it; a start then still makes its run."""
    model = start()
    heard: list[Any] = []

    def listener(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
        heard.append((instance.pk, created))

    post_save.connect(listener, sender=WorkflowInstance)
    try:
        with tenant_context(tenant.id):
            run = create_run(
                **{
                    f.attname: getattr(_new_run(tenant, model, timezone.now()), f.attname)
                    for f in INSTANCE_COLUMNS.fields
                }
            )
        started = start()
    finally:
        post_save.disconnect(listener, sender=WorkflowInstance)
    assert heard == [(run.pk, True), (uuid.UUID(started), True)]
    with tenant_context(tenant.id):
        assert WorkflowInstance.objects.filter(id__in=[run.pk, started]).count() == 2


def test_the_locked_save_of_a_vanished_row_raises(tenant: Tenant, start: Callable[[], str]) -> None:
    """As the ORM's save of loaded fields: a row that is gone is an error, not an insert."""
    run = start()
    with tenant_context(tenant.id):
        locked = _locked(run)
        WorkflowInstance.objects.filter(id=run).delete()
        with pytest.raises(DatabaseError, match="did not affect any rows"):
            LOCKED_COLUMNS.save(locked)
        assert not WorkflowInstance.objects.filter(id=run).exists()


# --- the readiness rule's sources -------------------------------------------------------------


@pytest.fixture(params=["as_the_database_runs_it", "through_the_orm"])
def arrived(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """wakeup_arrived as this database runs it (one function on PostgreSQL), and through
    the ORM's queries (the form the other databases take) for comparison."""
    if request.param == "through_the_orm":
        terms = {k: v for k, v in queries(connection).items() if k != "wakeup_arrived"}
        monkeypatch.setattr(wake, "queries", lambda _connection: terms)
    elif connection.vendor == "postgresql":
        assert "wakeup_arrived" in queries(connection)
    return str(request.param)


def test_each_source_wakes_the_run_and_nothing_else_does(
    tenant: Tenant, start: Callable[[], str], arrived: str
) -> None:
    run, child, other_child = start(), start(), start()
    task_id, promise_id = uuid.uuid4(), f"promise-{uuid.uuid4().hex[:8]}"
    wait = {
        "kind": "any",
        "signals": ["go", "stop"],
        "run_ids": [child, other_child],
        "task_id": str(task_id),
        "promise_id": promise_id,
    }
    with tenant_context(tenant.id):
        instance = WorkflowInstance.objects.get(id=run)

        def check(expected: bool, why: str, waited: dict[str, Any] | None = None) -> None:
            assert wake.wakeup_arrived(instance, waited or wait) is expected, why

        check(False, "nothing has arrived")
        check(False, "an empty wait", {"kind": "timer"})
        # Rows of the kinds it waits for, none of which satisfies the wait.
        Signal.objects.create(tenant=tenant, instance_id=run, name="other")
        Signal.objects.create(tenant=tenant, instance_id=run, name="go", consumed_at=timezone.now())
        Signal.objects.create(tenant=tenant, instance_id=child, name="go")
        UpdateRequest.objects.create(
            tenant=tenant, instance_id=run, name="u", status=UpdateRequest.State.DONE
        )
        TaskCall.objects.create(
            id=task_id,
            tenant=tenant,
            instance_id=run,
            step=1,
            service="s",
            operation="o",
            idempotency_key="k",
            token="t",
        )
        Promise.objects.create(tenant=tenant, id=promise_id, instance_id=run, name="p")
        WorkflowInstance.objects.filter(id=other_child).update(status=RunStatus.RUNNING)
        check(False, "only what does not satisfy the wait has arrived")

        sources: list[tuple[str, Callable[[], Any], Callable[[], Any], dict[str, Any]]] = [
            (
                "a signal of its names",
                lambda: Signal.objects.create(tenant=tenant, instance_id=run, name="stop"),
                lambda: Signal.objects.filter(name="stop").delete(),
                {"signals": ["stop"]},
            ),
            (
                "an ended child",
                lambda: WorkflowInstance.objects.filter(id=child).update(status=RunStatus.FAILED),
                lambda: WorkflowInstance.objects.filter(id=child).update(status=RunStatus.READY),
                {"run_ids": [child]},
            ),
            (
                "its task call's outcome",
                lambda: TaskCall.objects.filter(id=task_id).update(state=TaskCall.State.REPORTED),
                lambda: TaskCall.objects.filter(id=task_id).update(state=TaskCall.State.PENDING),
                {"task_id": str(task_id)},
            ),
            (
                "its settled promise",
                lambda: Promise.objects.filter(id=promise_id).update(status=Promise.State.REJECTED),
                lambda: Promise.objects.filter(id=promise_id).update(status=Promise.State.PENDING),
                {"promise_id": promise_id},
            ),
            (
                "a pending update (whatever the wait)",
                lambda: UpdateRequest.objects.create(tenant=tenant, instance_id=run, name="v"),
                lambda: UpdateRequest.objects.filter(name="v").delete(),
                {},
            ),
        ]
        for why, arrive, undo, needs in sources:
            arrive()
            check(True, why)
            check(True, why + ", when the wait names only it", {"kind": "any", **needs})
            if needs:
                unrelated = {k: v for k, v in wait.items() if k not in needs}
                check(False, why + ", when the wait does not name it", unrelated)
            undo()
            check(False, why + ", taken back")

        WorkflowInstance.objects.filter(id=run).update(cancel_requested=True)
        instance.refresh_from_db()
        check(True, "a cancellation request", {"kind": "timer"})


def test_a_child_that_continued_as_new_has_ended_when_its_chain_has(
    tenant: Tenant, start: Callable[[], str], arrived: str
) -> None:
    """A child that continued as new has ended only when the last run of its chain has: the
    parent woken before then reads no outcome, waits again and is woken again at once (a
    parent that spun, segment after segment, while its child's chain went on)."""
    run, child, second, third = start(), start(), start(), start()
    wait = {"kind": "child", "run_ids": [child]}
    with tenant_context(tenant.id):
        instance = WorkflowInstance.objects.get(id=run)
        runs = WorkflowInstance.objects

        def check(expected: bool, why: str) -> None:
            assert wake.wakeup_arrived(instance, wait) is expected, why

        runs.filter(id=child).update(status=RunStatus.DONE)
        check(True, "a child that ended")
        runs.filter(id=second).update(continued_from_id=child)
        check(False, "the child continued as new: its successor is ready")
        runs.filter(id=second).update(status=RunStatus.DONE)
        runs.filter(id=third).update(continued_from_id=second, status=RunStatus.RUNNING)
        check(False, "its successor continued as new too: the third run is running")
        runs.filter(id=third).update(status=RunStatus.FAILED)
        check(True, "the chain's last run failed")
        [outcome] = DjangoStorage(tenant.id).child_outcomes(
            RunRef(str(tenant.id), run, run, "w", 0), [child]
        )
        assert outcome is not None and outcome.status == AbiStatus.ERROR


def test_the_children_a_parent_awaits_are_read_together(
    tenant: Tenant, start: Callable[[], str]
) -> None:
    """``child_outcomes`` reads one child or six in the same statements (an await of all
    of them read each one in a transaction of its own: four statements, and one more to look
    for a run it continued as)."""
    run = start()
    children = [start() for _ in range(6)]
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id__in=children[:3]).update(status=RunStatus.DONE)
    storage = DjangoStorage(tenant.id)
    ref = RunRef(str(tenant.id), run, run, "w", 0)
    counted = []
    for asked in ([children[0]], children):
        with CaptureQueriesContext(connection) as queries_made:
            outcomes = storage.child_outcomes(ref, asked)
        counted.append(len(queries_made))
        assert [o is not None and o.status == AbiStatus.OK for o in outcomes] == [
            c in children[:3] for c in asked
        ]
    assert counted[0] == counted[1]
