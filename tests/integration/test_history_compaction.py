"""History compaction on the Django store (engine/compaction.py, workflows/store/compaction.py),
on whatever database the pass runs on (SQLite, PostgreSQL as ``cleat_app`` under RLS,
MariaDB): a long run whose prefix is folded into a checkpoint every few hundred events ends
with the same result, state and history as its uncompacted twin; a changed module replaying
over a compacted prefix is still caught and named; a tampered checkpoint fails the run with
``history_corrupt``.

``CLEAT_COMPACTION_TEST_STEPS`` / ``CLEAT_COMPACTION_TEST_EVERY`` raise the golden run (the
issue's figure: 50,000 steps compacted every 1,000 events)."""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from engine import compaction
from engine.events import EncodedEvent, history_from_json, verify
from tests.fixtures.wat import Wat
from tests.integration.support.environments import database_environment
from tests.integration.test_api_support import Api, key_for
from tests.integration.test_encryption import admin_client
from workflows.models import Tenant, WorkflowEvent, WorkflowInstance
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = int(os.environ.get("CLEAT_COMPACTION_TEST_STEPS", "5000"))
EVERY = int(os.environ.get("CLEAT_COMPACTION_TEST_EVERY", "500"))
# The workflow sleeps (ends a segment: the next one loads and replays) this often.
SEGMENT = max(STEPS // 5, 1)
WAKE = re.compile(r',"w":\d+')


def long_counter(steps: int, *, segment: int = SEGMENT, drift_at: int = -1) -> Wat:
    """``steps`` state increments, sleeping a second after every ``segment`` of them; the
    result is the final count. ``drift_at``: that increment touches another key (a changed
    module)."""
    w = Wat()
    drift = f"""
      (if (i64.eq (local.get $i) (i64.const {drift_at}))
        (then (drop (call $incr_state {w.s("drift")} (i64.const 1)))))"""
    w.run(
        f"""
    (block $done (loop $again
      (br_if $done (i64.ge_s (local.get $i) (i64.const {steps})))
      {drift if drift_at >= 0 else ""}
      (if (i64.ne (local.get $i) (i64.const {drift_at}))
        (then (local.set $n (call $incr_state {w.s("count")} (i64.const 1)))))
      (local.set $i (i64.add (local.get $i) (i64.const 1)))
      (if (i64.eqz (i64.rem_s (local.get $i) (i64.const {segment})))
        (then (drop (call $durable_sleep (i64.const 1000)))))
      (br $again)))
    (call $recn (local.get $n))
    (call $finish)""",
        locals="$i i64 $n i64",
    )
    return w


# The short runs of the non-determinism and tamper tests.
SHORT = 150


def step_of(increment: int) -> int:
    """The history step of the ``increment``-th state increment of a short run (its sleeps
    are steps too)."""
    return increment + increment // SHORT


@pytest.fixture
def env(tenant: Tenant) -> Iterator[DatabaseWorkflowEnvironment]:
    environment: DatabaseWorkflowEnvironment = database_environment(tenant, None)
    yield environment
    environment.close()


def drive(env: DatabaseWorkflowEnvironment, run: str) -> None:
    env.run_until_idle()
    while env.status(run) == "ready":
        env.advance(seconds=1)


def rows(env: DatabaseWorkflowEnvironment, run: str) -> int:
    with tenant_context(env.tenant.id):
        return WorkflowEvent.objects.filter(instance_id=run).count()


def instance(env: DatabaseWorkflowEnvironment, run: str) -> WorkflowInstance:
    with tenant_context(env.tenant.id):
        return WorkflowInstance.objects.get(id=run)


def comparable(history: list[EncodedEvent], workflow_id: str) -> list[tuple[Any, ...]]:
    """The history without what differs between twins: time (a timer's wake-up instant),
    the workflow's own id."""
    return [
        (e.step, e.type_code, WAKE.sub("", e.payload.replace(workflow_id, "WF")), bool(e.checksum))
        for e in history
    ]


def test_a_compacted_run_ends_as_its_uncompacted_twin(
    env: DatabaseWorkflowEnvironment, tenant: Tenant
) -> None:
    wasm = long_counter(STEPS).wasm()
    env.deploy("long", wasm)
    with override_settings(CLEAT_COMPACT_AFTER_EVENTS=0):
        twin = env.start("long")
        drive(env, twin)
    with override_settings(CLEAT_COMPACT_AFTER_EVENTS=EVERY):
        run = env.start("long")
        drive(env, run)
    assert env.result(run) == env.result(twin) == [STEPS]
    # Both incremented the same workflow-scoped counter (each its own workflow id).
    assert env.describe(run)["query_state"] == env.describe(twin)["query_state"]
    compacted, plain = env.stored_history(run), env.stored_history(twin)
    assert len(compacted) == len(plain) == STEPS + STEPS // SEGMENT
    ids = env.describe(run)["workflow_id"], env.describe(twin)["workflow_id"]
    assert comparable(compacted, ids[0]) == comparable(plain, ids[1])
    # The state the run kept (its counter), as the last increment recorded it.
    assert f'"res":"{STEPS}"' in compacted[-2].payload and f'"res":"{STEPS}"' in plain[-2].payload
    # The compacted run keeps only its tail as rows; the twin keeps every event.
    folded = instance(env, run).compacted_events
    assert folded >= len(compacted) - EVERY - SEGMENT, folded
    assert rows(env, run) == len(compacted) - folded
    assert rows(env, twin) == len(plain)
    assert instance(env, twin).compacted_events == 0
    assert instance(env, run).compaction_marker == f"steps 0\u2013{folded - 1} compacted"

    # Every surface that shows the history shows the compacted prefix as such.
    out = StringIO()
    call_command("export_history", run, stdout=out)
    exported = json.loads(out.getvalue())
    assert len(exported["history"]) == len(compacted)
    assert exported["compacted_events"] == folded
    api = Api(key_for(tenant))
    info = api.get(f"/api/v1/workflows/{run}").json()
    assert (info["events"], info["compacted_events"]) == (len(compacted), folded)
    assert len(api.get(f"/api/v1/workflows/{run}/history").json()["history"]) == len(compacted)
    page = api.get(f"/api/v1/workflows/{run}/events").json()
    assert page["results"][0]["step"] == folded, page["results"][0]
    marker = f"steps 0\u2013{folded - 1} compacted: kept in the run's checkpoint"
    admin = admin_client(tenant)
    shown = html.unescape(
        admin.get(f"/admin/workflows/workflowinstance/{run}/change/").content.decode()
    )
    assert marker in shown
    assert "compacted" not in html.unescape(
        admin.get(f"/admin/workflows/workflowinstance/{twin}/change/").content.decode()
    )


def test_a_changed_module_is_caught_in_and_after_the_compacted_prefix(
    env: DatabaseWorkflowEnvironment,
) -> None:
    steps = 4 * SHORT
    with override_settings(CLEAT_COMPACT_AFTER_EVENTS=compaction.KEEP_TAIL // 2):
        for name, drift_at in (("in-prefix", 3), ("in-tail", 3 * SHORT - 10)):
            env.deploy(name, long_counter(steps, segment=SHORT).wasm())
            run = env.start(name)
            env.run_until_idle()
            env.advance(seconds=1)
            env.advance(seconds=1)  # three segments: two sleeps recorded
            folded = instance(env, run).compacted_events
            assert folded > 0
            # The first drift is in the checkpoint, the second in the rows after it.
            assert (step_of(drift_at) < folded) == (name == "in-prefix"), folded
            env.replace_module(  # type: ignore[attr-defined]
                name, 1, long_counter(steps, segment=SHORT, drift_at=drift_at).wasm()
            )
            env.advance(seconds=1)
            info = env.describe(run)
            assert (info["status"], info["error_code"]) == ("dead_lettered", "nondeterminism")
            assert info["error"].startswith(f"non-determinism at step {step_of(drift_at)}:"), info[
                "error"
            ]
            assert "drift" in info["error"]


def tamper(env: DatabaseWorkflowEnvironment, run: str, change: Any) -> None:
    with tenant_context(env.tenant.id):
        row = WorkflowInstance.objects.get(id=run)
        row.compaction_state = change(row.compaction_state)
        row.save(update_fields=["compaction_state"])


def altered_payload(value: Any) -> Any:
    """The checkpoint with one event's payload changed (its checksum left as it was)."""
    state = compaction.CompactionState.from_json(value)
    events = compaction.expand(state)
    events[2] = events[2]._replace(payload=events[2].payload.replace("count", "cOunt"))
    return compaction.fold(None, events).as_json()


def broken_chunk(value: Any) -> Any:
    value = json.loads(json.dumps(value))
    value["chunks"][0][2] = "bm90IHpsaWI="  # base64 of "not zlib"
    return value


@pytest.mark.parametrize("change", [altered_payload, broken_chunk])
def test_a_tampered_checkpoint_fails_the_run_with_history_corrupt(
    env: DatabaseWorkflowEnvironment, tenant: Tenant, change: Any
) -> None:
    with override_settings(CLEAT_COMPACT_AFTER_EVENTS=compaction.KEEP_TAIL // 2):
        env.deploy("long", long_counter(4 * SHORT, segment=SHORT).wasm())
        run = env.start("long")
        env.run_until_idle()
        env.advance(seconds=1)
        assert instance(env, run).compacted_events > 0
        tamper(env, run, change)
        env.advance(seconds=1)
    info = env.describe(run)
    assert info["error_code"] == "history_corrupt", info
    assert info["status"] in ("failed", "dead_lettered")
    answer = Api(key_for(tenant)).get(f"/api/v1/workflows/{run}/history")
    if change is broken_chunk:  # the export says why, it does not crash
        assert answer.status_code == 409, answer.content
        assert "cannot be read" in answer.content.decode()
    else:  # it reads back; the altered event fails its checksum
        history = history_from_json(answer.json()["history"])
        assert [verify(e) for e in history].count(False) == 1


def test_a_bad_setting_is_refused_with_its_name() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from workflows.conf import compact_after_events

    for bad in (-1, "many", True):
        with (
            override_settings(CLEAT_COMPACT_AFTER_EVENTS=bad),
            pytest.raises(ImproperlyConfigured, match="CLEAT_COMPACT_AFTER_EVENTS"),
        ):
            compact_after_events()


# --- the in-memory store applies the same rule (engine.inmemory.History) ----------------------


def test_the_in_memory_store_compacts_by_the_same_rule(tenant: Tenant) -> None:
    """engine.testing's environment with compaction on: the run keeps only its tail as events
    after its checkpoint, ends as its uncompacted twin, and a changed module replayed over the
    compacted prefix is still caught, naming the step."""
    from tests.integration.support.environments import MemoryEnvironment

    steps, every = 600, 100
    wasm = long_counter(steps, segment=120).wasm()
    runs: dict[int, tuple[MemoryEnvironment, str]] = {}
    for threshold in (0, every):
        memory = MemoryEnvironment(compact_after_events=threshold)
        memory.deploy("long", wasm)
        run = memory.start("long")
        memory.run_until_idle()
        while memory.status(run) == "ready":
            memory.advance(seconds=1)
        runs[threshold] = (memory, run)
    (plain_env, twin), (env_, run) = runs[0], runs[every]
    assert env_.result(run) == plain_env.result(twin) == [steps]
    stored = env_.storage.runs[run].history
    assert stored.compacted > 0 and len(stored.tail) < every
    assert env_.describe(run)["compacted_events"] == stored.compacted
    assert plain_env.storage.runs[twin].history.compacted == 0
    ids = env_.describe(run)["workflow_id"], plain_env.describe(twin)["workflow_id"]
    assert comparable(list(stored), ids[0]) == comparable(
        list(plain_env.storage.runs[twin].history), ids[1]
    )
    env_.assert_replays(run)
    # A module that drifts at an increment inside the checkpoint is caught at that step.
    from engine.errors import ErrorCode

    env_.replace_module("long", 1, long_counter(steps, segment=120, drift_at=10).wasm())
    replayed = env_.replay(run)
    assert replayed.outcome.code == ErrorCode.NONDETERMINISM  # type: ignore[union-attr]
    assert "non-determinism at step 10:" in replayed.outcome.message  # type: ignore[union-attr]
