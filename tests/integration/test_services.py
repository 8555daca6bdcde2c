"""The services' error contract and their operator actions, on every database.

Every refusal is a ``ServiceError`` subclass with a stable ``code``, the HTTP status the API
maps it to and, for bad input, the offending ``field``; a refusal changes nothing. Operator
actions write their audit row and ``admin_action`` event in the transaction of the change.
Starting is idempotent per key; versions resolve explicit > tag > weighted rule > latest
non-deprecated; an update with ``wait_s`` returns the handler's answer.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from engine.events import AdminActionEvent, EventType
from tests.fixtures.wat import INPUT, Wat
from workflows import definitions
from workflows import services as svc
from workflows.models import (
    AuditLog,
    RoutingRule,
    RunStatus,
    Tenant,
    UpdateRequest,
    VersionTag,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
)
from workflows.store.lifecycle import claim_ready_instances
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)

# Just over the limit: as a value (serialised by the service) and as JSON text.
BIG = {"blob": "x" * (svc.MAX_PAYLOAD_BYTES - 10)}
BIG_TEXT = '"' + "x" * svc.MAX_PAYLOAD_BYTES + '"'


def waiter() -> bytes:
    """Registers the update handlers ``bump`` (answers "got <payload>") and ``refuse``
    (fails), then waits for ``stop``."""
    w = Wat()
    w.func(
        "bump",
        f"(drop (call $set_query_state {w.s('bumped')} {w.input()})) {w.concat('got ', INPUT)}",
    )
    w.func("refuse", w.reply(2, "not today"))
    w.run(
        f"""
    (drop (call $register_update_handler {w.s("bump")}))
    (drop (call $register_update_handler {w.s("refuse")}))
    (call $rec (call $durable_await_signals {w.js(["stop"])} (i64.const -1)))
    (call $finish)"""
    )
    return w.wasm()


def note(text: str) -> bytes:
    w = Wat()
    w.run(f"(call $note {w.s(text)}) (call $finish)")
    return w.wasm()


def failing() -> bytes:
    """Fails at once with a PERMANENT error (no retries): the run ends ``failed``."""
    w = Wat()
    w.run(w.reply(2, "bad order"))
    return w.wasm()


@pytest.fixture
def env(tenant: Tenant) -> Iterator[DatabaseWorkflowEnvironment]:
    made = DatabaseWorkflowEnvironment(tenant)
    made.deploy("waiter", waiter())
    made.deploy("quick", note("quick"))
    made.deploy("failing", failing())
    yield made
    made.close()


@pytest.fixture
def runs(env: DatabaseWorkflowEnvironment) -> dict[str, str]:
    """A run waiting for ``stop`` (after one segment), a done run and a failed run."""
    made = {"waiting": env.run("waiter"), "done": env.run("quick"), "failed": env.run("failing")}
    assert [env.status(made[k]) for k in ("waiting", "done", "failed")] == [
        RunStatus.READY,
        RunStatus.DONE,
        RunStatus.FAILED,
    ]
    return made


def row(tenant: Tenant, run_id: str) -> WorkflowInstance:
    with tenant_context(tenant.id):
        return WorkflowInstance.objects.get(tenant_id=tenant.id, id=run_id)


def snapshot(tenant: Tenant, run_id: str) -> tuple[Any, ...]:
    """Everything an operator action could change on a run, with its audit trail."""
    found = row(tenant, run_id)
    with tenant_context(tenant.id):
        audits = AuditLog.objects.filter(instance_id=run_id).count()
        events = WorkflowEvent.objects.filter(instance_id=run_id).count()
    return (
        found.status,
        found.generation,
        found.event_count,
        found.result,
        found.error,
        found.error_code,
        found.next_wake_at,
        audits,
        events,
    )


# --- invalid input -------------------------------------------------------------------------------

Call = Callable[[Tenant, dict[str, str]], Any]

INVALID: dict[str, tuple[Call, type[svc.ServiceError], str, str]] = {
    "input not JSON": (
        lambda t, r: svc.start_workflow(t, "quick", '{"order": '),
        svc.InvalidInput,
        "input",
        "input is not valid JSON",
    ),
    "input not representable": (
        lambda t, r: svc.start_workflow(t, "quick", {"ids": {1, 2}}),
        svc.InvalidInput,
        "input",
        "input cannot be represented as JSON",
    ),
    "input too large": (
        lambda t, r: svc.start_workflow(t, "quick", BIG),
        svc.PayloadTooLarge,
        "input",
        f"input is larger than {svc.MAX_PAYLOAD_BYTES} bytes",
    ),
    "idempotency key empty": (
        lambda t, r: svc.start_workflow(t, "quick", idempotency_key=""),
        svc.InvalidInput,
        "idempotency_key",
        "idempotency_key must be 1-255 characters",
    ),
    "idempotency key too long": (
        lambda t, r: svc.start_workflow(t, "quick", idempotency_key="k" * 256),
        svc.InvalidInput,
        "idempotency_key",
        "1-255",
    ),
    "task queue empty": (
        lambda t, r: svc.start_workflow(t, "quick", task_queue=""),
        svc.InvalidInput,
        "task_queue",
        "task_queue must be 1-64 characters",
    ),
    "workflow id too long": (
        lambda t, r: svc.start_workflow(t, "quick", workflow_id="w" * 129),
        svc.InvalidInput,
        "workflow_id",
        "workflow_id must be 1-128 characters",
    ),
    "unknown entry point": (
        lambda t, r: svc.start_workflow(t, "quick", entry_point="nope"),
        svc.InvalidInput,
        "entry_point",
        "has no entry point 'nope' (it exports: run)",
    ),
    "definition name with a space": (
        lambda t, r: definitions.deploy_definition(t, "my flow", note("x")),
        svc.InvalidInput,
        "name",
        "name 'my flow' is not a valid name",
    ),
    "definition name empty": (
        lambda t, r: definitions.deploy_definition(t, "", note("x")),
        svc.InvalidInput,
        "name",
        "is not a valid name",
    ),
    "definition name starting with a dash": (
        lambda t, r: definitions.deploy_definition(t, "-flow", note("x")),
        svc.InvalidInput,
        "name",
        "starting with a letter or digit",
    ),
    "definition name too long": (
        lambda t, r: definitions.deploy_definition(t, "n" * 129, note("x")),
        svc.InvalidInput,
        "name",
        "is not a valid name",
    ),
    "empty module": (
        lambda t, r: definitions.deploy_definition(t, "flow", b""),
        svc.InvalidInput,
        "wasm",
        "the module is empty",
    ),
    "invalid module": (
        lambda t, r: definitions.deploy_definition(t, "flow", b"\0asm\x01\0\0\0\x05"),
        svc.InvalidInput,
        "wasm",
        "failed to parse WebAssembly module",
    ),
    "version zero": (
        lambda t, r: definitions.deploy_definition(t, "flow", note("x"), version=0),
        svc.InvalidInput,
        "version",
        "version must be a positive integer",
    ),
    "signal name empty": (
        lambda t, r: svc.signal_workflow(t, r["waiting"], "", {}),
        svc.InvalidInput,
        "name",
        "signal name must be 1-256 characters",
    ),
    "signal name too long": (
        lambda t, r: svc.signal_workflow(t, r["waiting"], "s" * 257, {}),
        svc.InvalidInput,
        "name",
        "1-256",
    ),
    "signal payload not JSON": (
        lambda t, r: svc.signal_workflow(t, r["waiting"], "stop", "{oops"),
        svc.InvalidInput,
        "payload",
        "payload is not valid JSON",
    ),
    "signal payload too large": (
        lambda t, r: svc.signal_workflow(t, r["waiting"], "stop", BIG_TEXT),
        svc.PayloadTooLarge,
        "payload",
        "payload is larger than",
    ),
    "update name empty": (
        lambda t, r: svc.send_update(t, r["waiting"], "", {}),
        svc.InvalidInput,
        "name",
        "update name must be 1-128 characters",
    ),
    "update payload too large": (
        lambda t, r: svc.send_update(t, r["waiting"], "bump", BIG),
        svc.PayloadTooLarge,
        "payload",
        "payload is larger than",
    ),
    "forced result too large": (
        lambda t, r: svc.force_complete(t, r["waiting"], None, BIG_TEXT, "op"),
        svc.PayloadTooLarge,
        "result",
        "result is larger than",
    ),
    "forced result not JSON": (
        lambda t, r: svc.force_complete(t, r["waiting"], None, "not json", "op"),
        svc.InvalidInput,
        "result",
        "result is not valid JSON",
    ),
    "forced failure without message": (
        lambda t, r: svc.force_fail(t, r["waiting"], None, ""),
        svc.InvalidInput,
        "message",
        "an error message is required",
    ),
    "forced failure with unknown code": (
        lambda t, r: svc.force_fail(t, r["waiting"], None, "boom", code="oops"),
        svc.InvalidInput,
        "code",
        "unknown error code 'oops'",
    ),
    "promise value not JSON": (
        lambda t, r: svc.settle_promise(t, "p-1", value="{"),
        svc.InvalidInput,
        "value",
        "value is not valid JSON",
    ),
    "rejection without message": (
        lambda t, r: svc.settle_promise(t, "p-1", reject=True),
        svc.InvalidInput,
        "message",
        "a rejection needs a message",
    ),
}


def test_invalid_input_names_the_field(
    tenant: Tenant, runs: dict[str, str], subtests: pytest.Subtests
) -> None:
    """Each case is refused with the right class, code, HTTP status, field and message,
    and leaves the runs, the definitions and the updates as they were."""
    before = {k: snapshot(tenant, v) for k, v in runs.items()}
    with tenant_context(tenant.id):
        definitions = WorkflowDefinition.objects.count()
        instances = WorkflowInstance.objects.count()
    expected = {
        svc.InvalidInput: ("invalid", 400),
        svc.PayloadTooLarge: ("payload_too_large", 413),
    }
    for case, (call, error, field, message) in INVALID.items():
        with subtests.test(case):
            with pytest.raises(error) as caught:
                call(tenant, runs)
            assert type(caught.value) is error
            assert caught.value.field == field
            assert message in caught.value.message
            assert (caught.value.code, caught.value.http_status) == expected[error]
    assert {k: snapshot(tenant, v) for k, v in runs.items()} == before
    with tenant_context(tenant.id):
        assert WorkflowDefinition.objects.count() == definitions
        assert WorkflowInstance.objects.count() == instances
        assert not UpdateRequest.objects.exists()


def test_a_payload_at_the_limit_is_accepted(tenant: Tenant, runs: dict[str, str]) -> None:
    at_limit = '"' + "x" * (svc.MAX_PAYLOAD_BYTES - 2) + '"'
    signal = svc.signal_workflow(tenant, runs["waiting"], "stop", at_limit)
    assert len(signal.payload.encode()) == svc.MAX_PAYLOAD_BYTES


# --- not found -----------------------------------------------------------------------------------


NOT_FOUND: dict[str, tuple[Call, str, str]] = {
    "unknown definition": (
        lambda t, r: svc.start_workflow(t, "nope"),
        "definition",
        "no workflow definition named 'nope'",
    ),
    "unknown version": (
        lambda t, r: svc.start_workflow(t, "quick", version=5),
        "version",
        "quick has no version 5",
    ),
    "unknown tag": (
        lambda t, r: svc.start_workflow(t, "quick", tag="stable"),
        "tag",
        "quick has no tag 'stable'",
    ),
    "unknown run": (
        lambda t, r: svc.signal_workflow(t, "9f1c6a52-2a4e-4d55-9a36-6b0d7f1f3c11", "go"),
        "run_id",
        "no workflow run 9f1c6a52-2a4e-4d55-9a36-6b0d7f1f3c11",
    ),
    "malformed run id": (
        lambda t, r: svc.cancel_workflow(t, "run-42"),
        "run_id",
        "no workflow run 'run-42'",
    ),
    "unknown promise": (
        lambda t, r: svc.settle_promise(t, "p-nope", value=1),
        "promise_id",
        "no promise p-nope",
    ),
    "unknown query key": (
        lambda t, r: svc.query_state(t, r["waiting"], "missing"),
        "key",
        "has no query state 'missing'",
    ),
    "unknown tenant name": (
        lambda t, r: svc.get_tenant("ghost"),
        "tenant",
        "unknown tenant 'ghost'",
    ),
    "unknown tenant id": (
        lambda t, r: svc.get_tenant("6a0c2b8e-0c3b-4c52-8d8e-0d2b9a7c1e55"),
        "tenant",
        "unknown tenant '6a0c2b8e-0c3b-4c52-8d8e-0d2b9a7c1e55'",
    ),
}


def test_not_found_names_what_is_missing(
    tenant: Tenant, runs: dict[str, str], subtests: pytest.Subtests
) -> None:
    for case, (call, field, message) in NOT_FOUND.items():
        with subtests.test(case):
            with pytest.raises(svc.NotFound) as caught:
                call(tenant, runs)
            assert (caught.value.field, caught.value.code, caught.value.http_status) == (
                field,
                "not_found",
                404,
            )
            assert message in caught.value.message


def test_a_deactivated_tenant_is_a_conflict(other_tenant: Tenant) -> None:
    Tenant.objects.filter(id=other_tenant.id).update(is_active=False)
    with pytest.raises(svc.Conflict) as caught:
        svc.get_tenant(other_tenant.name)
    assert caught.value.field == "tenant" and "deactivated" in caught.value.message


# --- conflicts -----------------------------------------------------------------------------------


STALE: dict[str, Callable[[Tenant, str, int], Any]] = {
    "force_complete": lambda t, r, g: svc.force_complete(t, r, g, {"ok": 1}, "op", "why"),
    "force_fail": lambda t, r, g: svc.force_fail(t, r, g, "broken", operator="op"),
    "re_replay": lambda t, r, g: svc.re_replay(t, r, g, "op", "why"),
}


@pytest.mark.parametrize("action", list(STALE))
def test_a_stale_generation_is_a_conflict(tenant: Tenant, runs: dict[str, str], action: str):
    """An operator acting on what they saw at generation g-1 is refused once a worker has
    moved the run on, and nothing is written; at the current generation it goes through."""
    run = runs["waiting"]
    current = row(tenant, run).generation
    assert current >= 1
    before = snapshot(tenant, run)
    with pytest.raises(svc.Conflict) as caught:
        STALE[action](tenant, run, current - 1)
    assert caught.value.field == "generation"
    assert f"at generation {current}, not {current - 1}" in caught.value.message
    assert (caught.value.code, caught.value.http_status) == ("conflict", 409)
    assert snapshot(tenant, run) == before
    after = STALE[action](tenant, run, current)
    assert after.generation == current + 1


def _claimed(tenant: Tenant, env: DatabaseWorkflowEnvironment) -> str:
    run = env.start("quick")
    [claim] = claim_ready_instances("w", ["default"], 1, timezone.now(), tenant.id)
    assert str(claim.id) == run and row(tenant, run).status == RunStatus.RUNNING
    return run


def _paused(tenant: Tenant, env: DatabaseWorkflowEnvironment) -> str:
    run = env.start("quick")
    svc.pause_workflow(tenant, run)
    return run


ILLEGAL: dict[str, tuple[str, Callable[[Tenant, str], Any], str]] = {
    "signal a done run": (
        "done",
        lambda t, r: svc.signal_workflow(t, r, "stop"),
        "is done; it cannot receive signals",
    ),
    "signal a failed run": (
        "failed",
        lambda t, r: svc.signal_workflow(t, r, "stop"),
        "is failed; it cannot receive signals",
    ),
    "update a done run": (
        "done",
        lambda t, r: svc.send_update(t, r, "bump"),
        "cannot take updates",
    ),
    "cancel a done run": ("done", lambda t, r: svc.cancel_workflow(t, r), "is already done"),
    "terminate a failed run": (
        "failed",
        lambda t, r: svc.terminate_workflow(t, r),
        "is already failed",
    ),
    "pause a running run": (
        "running",
        lambda t, r: svc.pause_workflow(t, r),
        "only a ready run can be paused",
    ),
    "pause a done run": ("done", lambda t, r: svc.pause_workflow(t, r), "only a ready run"),
    "pause a paused run": ("paused", lambda t, r: svc.pause_workflow(t, r), "only a ready run"),
    "resume a ready run": ("waiting", lambda t, r: svc.resume_workflow(t, r), "is not paused"),
    "retry a done run": (
        "done",
        lambda t, r: svc.retry_workflow(t, r),
        "only failed or dead-lettered runs can be retried",
    ),
    "retry a waiting run": ("waiting", lambda t, r: svc.retry_workflow(t, r), "can be retried"),
    "force-complete a done run": (
        "done",
        lambda t, r: svc.force_complete(t, r, None, 1, "op"),
        "is already done",
    ),
    "force-fail a failed run": (
        "failed",
        lambda t, r: svc.force_fail(t, r, None, "again", operator="op"),
        "is already failed",
    ),
    "re-replay a running run": (
        "running",
        lambda t, r: svc.re_replay(t, r, None, "op"),
        "re-replay needs a settled run",
    ),
    "re-replay a paused run": (
        "paused",
        lambda t, r: svc.re_replay(t, r, None, "op"),
        "re-replay needs a settled run",
    ),
}


def test_an_illegal_transition_is_a_conflict(
    tenant: Tenant,
    env: DatabaseWorkflowEnvironment,
    runs: dict[str, str],
    subtests: pytest.Subtests,
) -> None:
    """Each transition the run's status does not allow is a Conflict naming the run and
    why, and changes nothing on the run."""
    every = {**runs, "running": _claimed(tenant, env), "paused": _paused(tenant, env)}
    for case, (which, call, message) in ILLEGAL.items():
        with subtests.test(case):
            run = every[which]
            before = snapshot(tenant, run)
            with pytest.raises(svc.Conflict) as caught:
                call(tenant, run)
            assert caught.value.field == "run_id"
            assert message in caught.value.message
            assert snapshot(tenant, run) == before


def test_settling_a_settled_promise_or_an_unaccepted_signal_is_a_conflict(
    tenant: Tenant, env: DatabaseWorkflowEnvironment, runs: dict[str, str]
) -> None:
    w = Wat()
    w.run(
        f"""
    (local.set $p (call $create_promise {w.s("ok")}))
    (drop (call $set_query_state {w.s("promise")} {w.payload("p")}))
    (call $rec (call $await_promise {w.payload("p")} (i64.const -1)))
    (call $finish)""",
        locals="$p i64",
    )
    env.deploy("promising", w.wasm())
    run = env.run("promising")
    promise_id = svc.query_state(tenant, run, "promise")
    svc.settle_promise(tenant, promise_id, value={"yes": True})
    with pytest.raises(svc.Conflict) as caught:
        svc.settle_promise(tenant, promise_id, error="changed my mind", reject=True)
    assert caught.value.field == "promise_id" and "already resolved" in caught.value.message
    env.run_until_idle()
    assert env.result(run) == [[0, '{"yes":true}']]

    waiting = runs["waiting"]
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=waiting).update(allowed_signals=["stop"])
    with pytest.raises(svc.Conflict) as refused:
        svc.signal_workflow(tenant, waiting, "other")
    assert (
        refused.value.field == "name" and "does not accept signal 'other'" in refused.value.message
    )


# --- operator actions and their audit trail ------------------------------------------------------


ACTIONS: dict[str, tuple[str, Callable[[Tenant, str, int], Any], str, str]] = {
    # action: (run, call, function that makes the change, status afterwards)
    "force_complete": (
        "waiting",
        lambda t, r, g: svc.force_complete(t, r, g, {"forced": True}, "ada", "stuck upstream"),
        "close_instance",
        RunStatus.DONE,
    ),
    "force_fail": (
        "waiting",
        lambda t, r, g: svc.force_fail(
            t, r, g, "gave up", code="permanent", operator="ada", reason="stuck upstream"
        ),
        "close_instance",
        RunStatus.FAILED,
    ),
    "re_replay": (
        "done",
        lambda t, r, g: svc.re_replay(t, r, g, "ada", "stuck upstream"),
        "_reopen",
        RunStatus.READY,
    ),
    "retry": (
        "failed",
        lambda t, r, g: svc.retry_workflow(t, r, operator="ada", reason="stuck upstream"),
        "_reopen",
        RunStatus.READY,
    ),
}


def admin_events(tenant: Tenant, env: DatabaseWorkflowEnvironment, run: str) -> list[Any]:
    return [e for e in env.history(run) if e.TYPE is EventType.ADMIN_ACTION]


@pytest.mark.parametrize("action", list(ACTIONS))
def test_an_operator_action_is_audited_with_its_change(
    tenant: Tenant, env: DatabaseWorkflowEnvironment, runs: dict[str, str], action: str
) -> None:
    which, call, _, status = ACTIONS[action]
    run = runs[which]
    before = row(tenant, run)
    after = call(tenant, run, before.generation)
    assert after.status == status
    assert after.generation == before.generation + 1
    assert after.event_count == before.event_count + 1
    with tenant_context(tenant.id):
        [audit] = AuditLog.objects.filter(instance_id=run)
    assert (audit.action, audit.operator, audit.reason) == (action, "ada", "stuck upstream")
    assert audit.tenant_id == tenant.id
    [event] = admin_events(tenant, env, run)
    assert isinstance(event, AdminActionEvent)
    assert (event.step, event.action, event.operator, event.reason) == (
        before.event_count,
        action,
        "ada",
        "stuck upstream",
    )
    if action == "force_complete":
        assert (after.result, after.error, after.waiting_on) == ('{"forced":true}', None, None)
    elif action == "force_fail":
        assert (after.error, after.error_code) == ("gave up", "permanent")
    else:
        # Reopened: a worker replays the history, stepping over the admin event.
        env.run_until_idle()
        final = row(tenant, run)
        if action == "re_replay":
            assert final.status == RunStatus.DONE and env.result(run) == ["quick"]
        else:
            assert (final.status, final.error) == (RunStatus.FAILED, "bad order")


@pytest.mark.parametrize("action", list(ACTIONS))
def test_the_audit_is_rolled_back_with_a_failed_change(
    tenant: Tenant,
    runs: dict[str, str],
    action: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The change fails after the audit row and event were written: neither survives, so
    they cannot be committed separately from the change."""
    which, call, change, _ = ACTIONS[action]
    run = runs[which]
    before = snapshot(tenant, run)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the change failed")

    monkeypatch.setattr(svc, change, broken)
    with pytest.raises(RuntimeError, match="the change failed"):
        call(tenant, run, row(tenant, run).generation)
    assert snapshot(tenant, run) == before
    with tenant_context(tenant.id):
        assert not AuditLog.objects.filter(instance_id=run).exists()


# --- starting: idempotency and version resolution ------------------------------------------------


def test_an_idempotency_key_returns_the_existing_run(
    tenant: Tenant, env: DatabaseWorkflowEnvironment
) -> None:
    first, created = svc.start_workflow(tenant, "quick", {"n": 1}, idempotency_key="order-9")
    assert created is True
    again, created = svc.start_workflow(tenant, "quick", {"n": 2}, idempotency_key="order-9")
    assert (again.id, created, again.input) == (first.id, False, '{"n":1}')
    other, created = svc.start_workflow(tenant, "quick", {"n": 3}, idempotency_key="order-10")
    assert created is True and other.id != first.id
    with tenant_context(tenant.id):
        assert WorkflowInstance.objects.filter(start_idempotency_key="order-9").count() == 1
    env.run_until_idle()
    again, created = svc.start_workflow(tenant, "quick", idempotency_key="order-9")
    assert (again.id, created, again.status) == (first.id, False, RunStatus.DONE)


@pytest.fixture
def versions(env: DatabaseWorkflowEnvironment) -> str:
    for n in (1, 2, 3):
        assert env.deploy("multi", note(f"v{n}")) == n
    return "multi"


def started_version(tenant: Tenant, name: str, **kw: Any) -> int:
    instance, created = svc.start_workflow(tenant, name, **kw)
    assert created
    return instance.definition_version


def test_version_resolution_order(tenant: Tenant, versions: str) -> None:
    """Explicit version, then tag, then weighted rules, then the latest non-deprecated."""
    assert started_version(tenant, versions) == 3
    with tenant_context(tenant.id):
        WorkflowDefinition.objects.filter(name=versions, version=3).update(deprecated=True)
    assert started_version(tenant, versions) == 2
    assert started_version(tenant, versions, version=3) == 3  # explicit still reaches it
    with tenant_context(tenant.id):
        RoutingRule.objects.create(tenant=tenant, name=versions, version=1, weight=1.0)
    assert started_version(tenant, versions) == 1
    with tenant_context(tenant.id):
        VersionTag.objects.create(tenant=tenant, name=versions, tag="stable", version=3)
    assert started_version(tenant, versions, tag="stable") == 3
    assert started_version(tenant, versions, tag="stable", version=2) == 2
    with tenant_context(tenant.id):
        VersionTag.objects.create(tenant=tenant, name=versions, tag="gone", version=7)
    with pytest.raises(svc.NotFound) as caught:
        svc.start_workflow(tenant, versions, tag="gone")
    assert caught.value.field == "version" and "no version 7" in caught.value.message


def test_a_start_reads_the_versions_and_rules_in_one_statement(
    tenant: Tenant, versions: str
) -> None:
    """Resolving a definition reads the deployed versions and the routing rules in one
    statement where the dialect has it (PostgreSQL), in two through the ORM elsewhere, and
    the chosen version's row in one more. A rule whose version is no longer deployed keeps
    its share (the start falls back to the newest live version); a rule of weight 0 never
    routes."""
    from django.test.utils import CaptureQueriesContext

    expected = 2 if connection.vendor == "postgresql" else 3
    with tenant_context(tenant.id):
        RoutingRule.objects.create(tenant=tenant, name=versions, version=1, weight=0.0)
        with CaptureQueriesContext(connection) as plain:
            assert definitions.resolve_definition(tenant, versions).version == 3
        RoutingRule.objects.create(tenant=tenant, name=versions, version=9, weight=5.0)
        assert {definitions.resolve_definition(tenant, versions).version for _ in range(5)} == {3}
        RoutingRule.objects.filter(name=versions, version=1).update(weight=1.0)
        RoutingRule.objects.filter(name=versions, version=9).delete()
        with CaptureQueriesContext(connection) as routed:
            assert definitions.resolve_definition(tenant, versions).version == 1
        with CaptureQueriesContext(connection) as explicit:
            assert definitions.resolve_definition(tenant, versions, version=2).version == 2
    assert len(plain.captured_queries) == expected, [q["sql"] for q in plain.captured_queries]
    assert len(routed.captured_queries) == expected, [q["sql"] for q in routed.captured_queries]
    # An explicit version reads no rules.
    assert len(explicit.captured_queries) == 2, [q["sql"] for q in explicit.captured_queries]


def test_weighted_routing_splits_starts(
    tenant: Tenant, versions: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rules weighted 1:3 over v1 and v2 (v3 at weight 0 never chosen): with a seeded
    generator, 200 resolutions split about 25/75."""
    monkeypatch.setattr(definitions, "random", random.Random(20260101))
    with tenant_context(tenant.id):
        for version, weight in ((1, 1.0), (2, 3.0), (3, 0.0)):
            RoutingRule.objects.create(tenant=tenant, name=versions, version=version, weight=weight)
        chosen = [definitions.resolve_definition(tenant, versions).version for _ in range(200)]
    counts = {v: chosen.count(v) for v in (1, 2, 3)}
    assert counts[3] == 0
    assert 25 <= counts[1] <= 75, counts
    assert counts[1] + counts[2] == 200
    # Through the real start as well.
    assert started_version(tenant, versions) in (1, 2)


def test_a_rule_to_a_missing_version_falls_back_and_all_deprecated_is_not_found(
    tenant: Tenant, versions: str
) -> None:
    with tenant_context(tenant.id):
        RoutingRule.objects.create(tenant=tenant, name=versions, version=9, weight=1.0)
    assert started_version(tenant, versions) == 3
    with tenant_context(tenant.id):
        WorkflowDefinition.objects.filter(name=versions).update(deprecated=True)
    with pytest.raises(svc.NotFound) as caught:
        svc.start_workflow(tenant, versions)
    assert caught.value.field == "definition"
    assert "every version of multi is deprecated" in caught.value.message


# --- updates -------------------------------------------------------------------------------------


class Worker(threading.Thread):
    """Executes the tenant's due segments (the real claim and executor) until stopped."""

    def __init__(self, env: DatabaseWorkflowEnvironment) -> None:
        super().__init__(daemon=True)
        self.env = env
        self.stop = threading.Event()
        self.segments = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if self.env.step():
                    self.segments += 1
                else:
                    time.sleep(0.02)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            connection.close()

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=60)
        assert not self.is_alive(), "the worker thread did not stop"
        assert self.error is None, self.error


def test_send_update_waits_for_the_handlers_answer(
    tenant: Tenant, env: DatabaseWorkflowEnvironment, runs: dict[str, str]
) -> None:
    """With a worker running, ``send_update(wait_s=...)`` returns the answered request:
    the handler's reply (or its failure), while the run goes on waiting. Without a wait
    the request comes back pending."""
    run = runs["waiting"]
    worker = Worker(env)
    worker.start()
    try:
        answered = svc.send_update(tenant, run, "bump", {"by": 2}, wait_s=30)
        refused = svc.send_update(tenant, run, "refuse", None, wait_s=30)
    finally:
        worker.finish()
    assert (answered.status, answered.result) == (UpdateRequest.State.DONE, 'got {"by":2}')
    assert answered.completed_at is not None
    assert (refused.status, refused.result) == (UpdateRequest.State.FAILED, "not today")
    assert worker.segments >= 2
    assert svc.query_state(tenant, run, "bumped") == '{"by":2}'
    assert row(tenant, run).status == RunStatus.READY

    pending = svc.send_update(tenant, run, "bump", {"by": 3})
    assert pending.status == UpdateRequest.State.PENDING and pending.result == ""
    env.run_until_idle()
    with tenant_context(tenant.id):
        assert UpdateRequest.objects.get(id=pending.id).result == 'got {"by":3}'
    env.signal(run, "stop")
    env.run_until_idle()
    assert env.result(run)[0][0] == 0


def test_an_update_for_a_run_that_ends_fails(
    tenant: Tenant, env: DatabaseWorkflowEnvironment, runs: dict[str, str]
) -> None:
    """A request still pending when the run is terminated is failed, not left waiting."""
    run = runs["waiting"]
    update = svc.send_update(tenant, run, "bump", {"by": 1})
    svc.terminate_workflow(tenant, run, "shutting down")
    with tenant_context(tenant.id):
        update = UpdateRequest.objects.get(id=update.id)
    assert update.status == UpdateRequest.State.FAILED
    assert "terminated" in update.result


def test_a_module_over_the_databases_statement_limit_is_refused_with_advice(tenant: Any) -> None:
    """MariaDB drops the connection for a statement over max_allowed_packet; deploy refuses a
    module that would not fit, naming the setting. Other databases have no such limit."""
    from django.db import connection

    from workflows.definitions import _check_packet_size
    from workflows.services import InvalidInput

    huge = 10**10
    if connection.vendor == "mysql":
        with pytest.raises(InvalidInput) as err:
            _check_packet_size(huge)
        assert err.value.field == "wasm"
        assert "max_allowed_packet" in err.value.message
    else:
        assert _check_packet_size(huge) is None


def test_pause_and_resume_are_annotated_in_the_history_and_replay_steps_over_them(
    tenant: Tenant, env: DatabaseWorkflowEnvironment, runs: dict[str, str]
) -> None:
    run = runs["waiting"]
    before = row(tenant, run).event_count
    svc.pause_workflow(tenant, run, "ada", "maintenance window")
    svc.resume_workflow(tenant, run, "ada", "window over")
    events = admin_events(tenant, env, run)
    assert [(e.step, e.action, e.reason) for e in events] == [
        (before, "pause", "maintenance window"),
        (before + 1, "resume", "window over"),
    ]
    svc.signal_workflow(tenant, run, "stop", {"ok": True})
    env.run_until_idle()
    assert env.status(run) == RunStatus.DONE  # replay stepped over both annotations
