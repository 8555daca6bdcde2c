"""Encryption at rest (workflows/crypto.py) on the Django store, on every dialect the pass
runs on (``CLEAT_TEST_DB``): a run that writes every kind of payload stores none of them as
plaintext, yet runs, replays and reads back (API, admin, commands) as plaintext; a missing
key fails the run with ``encryption_key_missing``; ``rotate_keys`` re-seals and counts."""

from __future__ import annotations

import base64
import html
import json
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client, override_settings

from engine import faults
from engine.events import verify
from schedules.models import Schedule
from schedules.services import create_schedule
from tests.fixtures.wat import INPUT, Wat
from tests.integration.support.processes import command_env, manage
from tests.integration.test_api_support import Api, key_for
from workflows import crypto
from workflows.models import (
    Invocation,
    Promise,
    Signal,
    StaffTenant,
    TaskCall,
    Tenant,
    UpdateRequest,
    WorkflowEvent,
    WorkflowInstance,
    WorkflowState,
)
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)

MARKER = "zebra-7f3a-secret"


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


K1, K2 = new_key(), new_key()


def keys(current: str = "k1", **extra: str) -> override_settings:
    ring = {"k1": K1, **extra}
    return override_settings(
        CLEAT_ENCRYPTION_KEYS=json.dumps(ring), CLEAT_ENCRYPTION_KEY_ID=current
    )


def vault() -> Wat:
    """run: stores its input as state and query state, makes a promise (its id published as
    query state), registers the update handler "on_note", waits for signal "go" and for the
    promise, then reads its state back. on_note answers ``{"seen": <payload>}``."""
    w = Wat()
    w.run(
        f"""
    (drop (call $set_state {w.s("secret")} {w.input()}))
    (drop (call $set_query_state {w.s("q")} {w.input()}))
    (local.set $p (call $create_promise {w.s("approval")}))
    (drop (call $set_query_state {w.s("promise")} {w.payload("p")}))
    (call $recn (call $register_update_handler {w.s("on_note")}))
    (call $rec (call $durable_await_signals {w.js(["go"])} (i64.const -1)))
    (call $rec (call $await_promise {w.payload("p")} (i64.const -1)))
    (call $rec (call $get_state {w.s("secret")}))
    (call $finish)""",
        locals="$p i64",
    )
    seen = w.concat('{"seen":', INPUT, "}")
    w.func("on_note", f"(call $note {w.input()}) {seen}")
    return w


@pytest.fixture
def env(tenant: Tenant) -> Iterator[DatabaseWorkflowEnvironment]:
    environment = DatabaseWorkflowEnvironment(tenant)
    yield environment
    environment.close()


def drive_every_payload(
    env: DatabaseWorkflowEnvironment, *, compact: bool = False
) -> tuple[str, str]:
    """A run that writes each kind of payload with the marker in it, to the end; and a
    second run failed with the marker in its error. Returns both run ids. ``compact``: the
    run's first segment folds its history prefix into the compaction checkpoint."""
    env.deploy("vault", vault().wasm())
    run = env.start("vault", {"card": MARKER})
    with override_settings(CLEAT_COMPACT_AFTER_EVENTS=2 if compact else 0):
        env.run_until_idle()
    if compact:
        info = env.describe(run)
        assert info["compacted_events"] > 0, (info["events"], info["status"], info["waiting_on"])
    promise = env.describe(run)["query_state"]["promise"]
    update = env.update(run, "on_note", {"note": MARKER})
    env.run_until_idle()
    assert env.update_result(update) == ("done", f'{{"seen":{{"note":"{MARKER}"}}}}')
    env.signal(run, "go", {"code": MARKER})
    env.run_until_idle()
    env.resolve_promise(promise, {"approved": MARKER})
    env.run_until_idle()
    failed = env.start("vault", {"card": "other"})
    env.force_fail(failed, f"declined: {MARKER}")
    tenant = env.tenant
    with tenant_context(tenant.id):
        create_schedule(
            tenant, name="nightly", workflow_name="vault", cron="@daily", input={"m": MARKER}
        )
        Invocation.objects.create(
            id="inv-1",
            tenant=tenant,
            instance_id=run,
            service="mail",
            operation="send",
            request=json.dumps({"to": MARKER}),
            idempotency_key="k",
            deliver_at=env.clock.now(),
        )
        TaskCall.objects.create(
            id=uuid.uuid4(),
            tenant=tenant,
            instance_id=run,
            step=99,
            service="celery",
            operation="t",
            idempotency_key="k",
            token="t",
            payload=json.dumps({"out": MARKER}),
        )
    return run, failed


PAYLOAD_COLUMNS: dict[type[Any], tuple[str, ...]] = {
    WorkflowInstance: ("input", "result", "error", "query_state", "compaction_state"),
    WorkflowEvent: ("payload",),
    Signal: ("payload",),
    Promise: ("value", "error"),
    UpdateRequest: ("payload", "result"),
    WorkflowState: ("value",),
    Invocation: ("request",),
    TaskCall: ("payload",),
    Schedule: ("input",),
}


def test_the_scenario_covers_every_sealed_column() -> None:
    """Every sealed column is one the scenario below fills and checks (the compaction
    checkpoint with ``compact=True``)."""
    from workflows.rotation import sealed_columns

    sealed = {(m, f.attname) for m, f in sealed_columns()}
    listed = {(m, c) for m, columns in PAYLOAD_COLUMNS.items() for c in columns}
    assert sealed == listed


def raw_rows(tenant: Tenant, model: type[Any]) -> list[tuple[Any, ...]]:
    """Every row of the model's table as the database holds it (no ORM conversion)."""
    with tenant_context(tenant.id), connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {connection.ops.quote_name(model._meta.db_table)}")
        return [tuple(row) for row in cursor.fetchall()]


def raw_column(tenant: Tenant, model: type[Any], column: str) -> list[Any]:
    quote = connection.ops.quote_name
    with tenant_context(tenant.id), connection.cursor() as cursor:
        cursor.execute(f"SELECT {quote(column)} FROM {quote(model._meta.db_table)}")
        return [row[0] for row in cursor.fetchall()]


def test_no_payload_is_stored_as_plaintext_and_every_surface_shows_it(
    env: DatabaseWorkflowEnvironment, tenant: Tenant
) -> None:
    with keys():
        run, failed = drive_every_payload(env, compact=True)
        assert env.status(run) == "done"
        result = env.result(run)
        assert MARKER in json.dumps(result)
        for model, columns in PAYLOAD_COLUMNS.items():
            rows = raw_rows(tenant, model)
            assert rows, f"no {model.__name__} row was written"
            for row in rows:
                assert MARKER not in repr(row), f"{model.__name__} stores plaintext: {row}"
            for column in columns:
                stored = [v for v in raw_column(tenant, model, column) if v not in (None, "")]
                assert stored, f"{model.__name__}.{column} is empty in every row"
                text = [
                    json.loads(v)
                    if model is WorkflowInstance
                    and column in ("query_state", "compaction_state")
                    and isinstance(v, str)
                    and v.startswith('"')
                    else v
                    for v in stored
                ]
                assert all(crypto.is_sealed(str(v)) for v in text), (model.__name__, column, text)

        # Checksums are over the plaintext: the history verifies, and decodes.
        history = env.stored_history(run)
        assert history and all(verify(e) for e in history)
        assert any(MARKER in e.payload for e in history)

        # The API, the admin and the commands show plaintext.
        api = Api(key_for(tenant))
        shown = api.get(f"/api/v1/workflows/{run}").json()
        assert MARKER in json.dumps(shown["input"]) and MARKER in json.dumps(shown["result"])
        assert MARKER in json.dumps(shown["query_state"])
        assert MARKER in api.get(f"/api/v1/workflows/{failed}").json()["error"]
        events = api.get(f"/api/v1/workflows/{run}/events").json()
        assert MARKER in json.dumps(events)
        out = StringIO()
        call_command("show_workflow", run, stdout=out)
        assert MARKER in out.getvalue()
        out = StringIO()
        call_command("export_history", run, stdout=out)
        exported = json.loads(out.getvalue())
        assert MARKER in exported["input"] and MARKER in json.dumps(exported["history"])
        with tenant_context(tenant.id):
            schedule = Schedule.objects.get(name="nightly")
            assert MARKER in schedule.input
        admin = admin_client(tenant)
        for url in (
            f"/admin/workflows/workflowinstance/{run}/change/",
            f"/admin/workflows/workflowinstance/{failed}/change/",
            f"/admin/schedules/schedule/{schedule.id}/change/",
        ):
            page = admin.get(url)
            assert page.status_code == 200, url
            assert MARKER in html.unescape(page.content.decode()), url


def admin_client(tenant: Tenant) -> Client:
    """A staff user of the tenant who may view runs and schedules in the admin."""
    user = get_user_model().objects.create_user("vera", password="pw-12345678", is_staff=True)
    codenames = ("view_workflowinstance", "view_schedule")
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    StaffTenant.objects.create(user=user, tenant=tenant)
    client = Client()
    client.force_login(user)
    return client


def test_a_ciphertext_moved_to_another_row_or_altered_does_not_open(
    env: DatabaseWorkflowEnvironment, tenant: Tenant
) -> None:
    with keys():
        env.deploy("vault", vault().wasm())
        first = env.start("vault", {"card": MARKER})
        second = env.start("vault", {"card": "plain"})
        quote = connection.ops.quote_name
        table = quote(WorkflowInstance._meta.db_table)
        with tenant_context(tenant.id), connection.cursor() as cursor:
            cursor.execute(f"SELECT {quote('input')} FROM {table} WHERE id = %s", [_pk(first)])
            (sealed,) = cursor.fetchone()
            cursor.execute(
                f"UPDATE {table} SET {quote('input')} = %s WHERE id = %s", [sealed, _pk(second)]
            )
        with tenant_context(tenant.id):
            moved = WorkflowInstance.objects.get(id=second).input
            assert isinstance(moved, crypto.Unopened) and "k1" in moved.error.message
            assert json.loads(WorkflowInstance.objects.get(id=first).input) == {"card": MARKER}
        altered = sealed[:-6] + ("A" if sealed[-6] != "A" else "B") + sealed[-5:]
        with tenant_context(tenant.id), connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET {quote('input')} = %s WHERE id = %s", [altered, _pk(first)]
            )
        with tenant_context(tenant.id):
            assert isinstance(WorkflowInstance.objects.get(id=first).input, crypto.Unopened)
        shown = Api(key_for(tenant)).get(f"/api/v1/workflows/{second}").json()
        assert "k1" in json.dumps(shown["input"]) and MARKER not in json.dumps(shown)


def _pk(run_id: str) -> Any:
    """A run id as the table's column takes it (MariaDB and SQLite store UUIDs as hex)."""
    return WorkflowInstance._meta.pk.get_db_prep_value(uuid.UUID(run_id), connection)


def test_a_run_replays_after_a_retry_with_encryption_on(
    env: DatabaseWorkflowEnvironment, tenant: Tenant
) -> None:
    """Each segment replays the sealed history of the ones before it; a retry of the whole
    run from the start (continue from history) replays it all again and ends the same."""
    with keys():
        run, _ = drive_every_payload(env)
        first = env.result(run)
        with tenant_context(tenant.id):
            WorkflowInstance.objects.filter(id=run).update(
                status="ready", next_wake_at=env.clock.now(), result=None
            )
        env.run_until_idle()
        assert env.result(run) == first


def test_a_missing_key_fails_the_run_with_its_id_and_the_worker_goes_on(
    env: DatabaseWorkflowEnvironment, tenant: Tenant
) -> None:
    with keys():
        env.deploy("vault", vault().wasm())
        locked = env.start("vault", {"card": MARKER})
        env.run_until_idle()
    with override_settings(
        CLEAT_ENCRYPTION_KEYS=json.dumps({"k2": K2}), CLEAT_ENCRYPTION_KEY_ID=""
    ):
        env.signal(locked, "go", {"code": "x"})
        healthy = env.start("vault", {"card": "fine"})
        env.run_until_idle()
        info = env.describe(locked)
        assert (info["status"], info["error_code"]) == ("failed", "encryption_key_missing")
        assert "'k1'" in info["error"]
        assert env.status(healthy) == "ready"  # its segment ran (waiting for its signal)
        assert json.loads(env.describe(healthy)["query_state"]["q"]) == {"card": "fine"}


@pytest.mark.parametrize(
    ("keys_setting", "current", "reason"),
    [
        ('{"k1": "not base64!"}', "", "not valid base64"),
        ('{"k1": "' + base64.b64encode(b"short").decode() + '"}', "", "5 bytes, not 32"),
        ('{"k1": "' + K1 + '"}', "k9", "'k9' is not in CLEAT_ENCRYPTION_KEYS"),
        ('{"k1": "' + K1 + '", "k2": "' + K2 + '"}', "", "must name the current key"),
        ("[1]", "", "must be a JSON object"),
    ],
)
def test_a_bad_key_configuration_stops_start_up_and_the_commands(
    keys_setting: str, current: str, reason: str
) -> None:
    with override_settings(CLEAT_ENCRYPTION_KEYS=keys_setting, CLEAT_ENCRYPTION_KEY_ID=current):
        from workflows.apps import check_encryption_settings

        errors = check_encryption_settings()
        assert [e.id for e in errors] == ["workflows.E005"] and reason in errors[0].msg
        with pytest.raises(CommandError, match=reason):
            call_command("rotate_keys", "--check", stdout=StringIO())


def check_lines(**settings: str) -> list[str]:
    out = StringIO()
    with override_settings(**settings):
        call_command("rotate_keys", "--check", stdout=out)
    return out.getvalue().splitlines()


def sealed_with(tenant: Tenant) -> Counter[str]:
    """The key id (or "plain") of every payload value stored, counted."""
    found: Counter[str] = Counter()
    for model, columns in PAYLOAD_COLUMNS.items():
        for column in columns:
            for value in raw_column(tenant, model, column):
                if value is None:
                    continue
                text = str(value)
                text = json.loads(text) if text.startswith('"') else text
                found[crypto.key_id_of(text) if crypto.is_sealed(text) else "plain"] += 1
    return found


def test_rotate_keys_reseals_old_keys_and_plaintext_and_check_counts_them(
    env: DatabaseWorkflowEnvironment, tenant: Tenant
) -> None:
    both = {"CLEAT_ENCRYPTION_KEYS": json.dumps({"k1": K1, "k2": K2})}
    with keys():
        run, _ = drive_every_payload(env, compact=True)  # the checkpoint is re-sealed too
    # Written with encryption off (as before it was turned on): plaintext rows.
    before = env.start("vault", {"card": "written without a key"})
    stored = sealed_with(tenant)
    assert stored["k1"] > 10 and stored["plain"] > 0 and "k2" not in stored

    lines = check_lines(CLEAT_ENCRYPTION_KEY_ID="k1", **both)
    assert f"key k1 (current): {stored['k1']} rows" in lines
    assert "key k2: 0 rows" in lines
    assert f"(plaintext): {stored['plain']} rows" in lines
    assert "  workflows.workflowevent.payload: " in "\n".join(lines)

    out = StringIO()
    with override_settings(CLEAT_ENCRYPTION_KEY_ID="k2", **both):
        call_command("rotate_keys", "--batch-size", "3", stdout=out)
    total = stored["k1"] + stored["plain"]
    assert out.getvalue().splitlines()[-1].startswith(f"re-sealed {total} rows under key 'k2'")
    assert (
        "tenant default: workflows.workflowevent.payload: re-sealed 3 of 3 rows" in out.getvalue()
    )
    assert sealed_with(tenant) == Counter({"k2": total})

    lines = check_lines(CLEAT_ENCRYPTION_KEY_ID="k2", **both)
    assert "key k1: 0 rows" in lines and f"key k2 (current): {total} rows" in lines
    # Nothing is left under k1: it can be retired, and everything still reads.
    with override_settings(
        CLEAT_ENCRYPTION_KEYS=json.dumps({"k2": K2}), CLEAT_ENCRYPTION_KEY_ID=""
    ):
        assert MARKER in json.dumps(env.result(run))
        assert env.describe(before)["status"] == "ready"
        assert env.history(run)
        again = StringIO()
        call_command("rotate_keys", stdout=again)
        assert again.getvalue().strip() == "re-sealed 0 rows under key 'k2' in 0 batches"


def test_rotate_keys_names_the_keys_it_cannot_open_and_exits_non_zero(
    env: DatabaseWorkflowEnvironment, tenant: Tenant
) -> None:
    with keys():
        env.deploy("vault", vault().wasm())
        env.start("vault", {"card": MARKER})
    with (
        override_settings(CLEAT_ENCRYPTION_KEYS=json.dumps({"k2": K2}), CLEAT_ENCRYPTION_KEY_ID=""),
        pytest.raises(CommandError, match="not configured were left as they are: 'k1'"),
    ):
        call_command("rotate_keys", stdout=StringIO())
    with (
        override_settings(CLEAT_ENCRYPTION_KEYS="", CLEAT_ENCRYPTION_KEY_ID=""),
        pytest.raises(CommandError, match="no current key to rotate to"),
    ):
        call_command("rotate_keys", stdout=StringIO())


def test_a_rotation_killed_inside_a_batch_resumes_to_completion(
    env: DatabaseWorkflowEnvironment, tenant: Tenant
) -> None:
    """``rotate_batch``: the process dies inside its second batch (rows re-sealed, not
    committed). The first batch stays committed, the second is rolled back whole; running
    the command again re-seals the rest, and every payload still opens."""
    with keys():
        run, _ = drive_every_payload(env)
        first = env.result(run)
    stored = sealed_with(tenant)
    both = json.dumps({"k1": K1, "k2": K2})
    settings = command_env(CLEAT_ENCRYPTION_KEYS=both, CLEAT_ENCRYPTION_KEY_ID="k2")
    crashed = manage(
        ["rotate_keys", "--batch-size", "2"], {**settings, "CLEAT_TEST_CRASH_AT": "rotate_batch:2"}
    )
    assert crashed.returncode == faults.EXIT_CODE, crashed.stdout + crashed.stderr
    assert "event=crash_point point=rotate_batch" in crashed.stderr
    # One batch committed (its progress line printed), the second lost whole.
    committed = [line for line in crashed.stdout.splitlines() if "re-sealed" in line]
    assert len(committed) == 1, crashed.stdout
    resealed = int(committed[0].split("re-sealed ")[1].split()[0])
    halfway = sealed_with(tenant)
    assert halfway["k2"] == resealed > 0 and halfway["k1"] == stored["k1"] - resealed

    finished = manage(["rotate_keys", "--batch-size", "2"], settings)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert sealed_with(tenant) == Counter({"k2": sum(stored.values())})
    checked = manage(["rotate_keys", "--check"], settings)
    assert "key k1: 0 rows" in checked.stdout.splitlines(), checked.stdout
    with override_settings(
        CLEAT_ENCRYPTION_KEYS=json.dumps({"k2": K2}), CLEAT_ENCRYPTION_KEY_ID=""
    ):
        assert env.result(run) == first
        assert all(verify(e) for e in env.stored_history(run))


def test_a_history_sealed_with_a_missing_key_fails_the_run_too(
    env: DatabaseWorkflowEnvironment, tenant: Tenant
) -> None:
    """The run's own row opens (written in plaintext here) but its events do not: the load
    of the history is what fails, with the same code and key id."""
    with keys():
        env.deploy("vault", vault().wasm())
        run = env.start("vault", {"card": MARKER})
        env.run_until_idle()
    quote = connection.ops.quote_name
    table = quote(WorkflowInstance._meta.db_table)
    with tenant_context(tenant.id), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {quote('input')} = %s, {quote('query_state')} = %s WHERE id = %s",
            ['{"card":"plain"}', "{}", _pk(run)],
        )
    with override_settings(
        CLEAT_ENCRYPTION_KEYS=json.dumps({"k2": K2}), CLEAT_ENCRYPTION_KEY_ID=""
    ):
        with tenant_context(tenant.id):
            assert crypto.unopened(WorkflowInstance.objects.get(id=run)) is None
        env.signal(run, "go", {"code": "x"})
        env.run_until_idle()
        info = env.describe(run)
        assert (info["status"], info["error_code"]) == ("failed", "encryption_key_missing")
        assert "'k1'" in info["error"]
