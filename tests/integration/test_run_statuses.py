"""The run statuses are defined once, in ``engine.status``: the model's choices, the terminal
set and the status field the migrations built are all the engine's, value for value and label
for label, so a status added to or changed in the engine shows up here (and in
``makemigrations --check``) instead of drifting silently."""

from __future__ import annotations

from django.db.migrations.loader import MigrationLoader

from engine.status import TERMINAL_STATUSES as ENGINE_TERMINAL_STATUSES
from engine.status import RunStatus as EngineRunStatus
from workflows.models import ACTIVE_STATUSES, TERMINAL_STATUSES, RunStatus, WorkflowInstance


def test_the_model_choices_are_the_engine_statuses() -> None:
    assert RunStatus.choices == [
        ("ready", "ready"),
        ("running", "running"),
        ("done", "done"),
        ("failed", "failed"),
        ("dead_lettered", "dead-lettered"),
        ("terminated", "terminated"),
        ("paused", "paused"),
    ]
    assert [(s.name, s.value, s.label) for s in RunStatus] == [
        (s.name, s.value, s.label) for s in EngineRunStatus
    ]
    assert RunStatus.DEAD_LETTERED == EngineRunStatus.DEAD_LETTERED == "dead_lettered"
    assert RunStatus.DEAD_LETTERED.label == "dead-lettered"


def test_terminal_and_active_statuses_split_the_engine_statuses() -> None:
    assert TERMINAL_STATUSES == ENGINE_TERMINAL_STATUSES
    assert {"done", "failed", "dead_lettered", "terminated"} == TERMINAL_STATUSES
    assert not TERMINAL_STATUSES & ACTIVE_STATUSES
    assert set(EngineRunStatus) == TERMINAL_STATUSES | ACTIVE_STATUSES


def test_a_run_in_an_engine_terminal_status_is_ended() -> None:
    for status in EngineRunStatus:
        run = WorkflowInstance(status=status)
        assert run.is_terminal == (status in ENGINE_TERMINAL_STATUSES), status


def test_the_migrated_status_field_has_the_engine_choices() -> None:
    # No connection: the migration graph is read from the files, not the database.
    state = MigrationLoader(None, ignore_no_migrations=True).project_state()
    field = state.models["workflows", "workflowinstance"].fields["status"]
    assert list(field.choices) == [(s.value, s.label) for s in EngineRunStatus]
    assert field.default == EngineRunStatus.READY
