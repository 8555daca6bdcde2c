"""The console's "state at step N" replays in the web process: it stops at its own short
deadline (``CLEAT_CONSOLE_REPLAY_TIMEOUT_SECONDS``), not at a worker's 30 s, and says so."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from tests.fixtures.wat import Wat
from workflows.console import replay
from workflows.models import Tenant
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/workflows/workflowinstance/"


def spinner() -> bytes:
    """A module that never returns and never calls the host."""
    w = Wat()
    w.run("(loop $spin (br $spin)) (call $finish)")
    return w.wasm()


@pytest.fixture
def env(tenant: Tenant) -> Iterator[DatabaseWorkflowEnvironment]:
    made = DatabaseWorkflowEnvironment(tenant)
    made.deploy("spinner", spinner())
    yield made
    made.close()


@pytest.fixture
def op(tenant: Tenant) -> Client:
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-12345678")
    client = Client()
    client.force_login(user)
    return client


def test_the_default_deadline_is_short() -> None:
    assert settings.CLEAT_CONSOLE_REPLAY_TIMEOUT_SECONDS == replay.DEFAULT_REPLAY_TIMEOUT_S == 2.0
    assert settings.CLEAT_CONSOLE_REPLAY_TIMEOUT_SECONDS < settings.CLEAT_SEGMENT_TIMEOUT_SECONDS


@override_settings(CLEAT_CONSOLE_REPLAY_TIMEOUT_SECONDS=0.5)
def test_a_replay_that_runs_too_long_stops_at_the_consoles_deadline(
    env: DatabaseWorkflowEnvironment, op: Client
) -> None:
    run_id = env.start("spinner")
    began = time.monotonic()
    response = op.get(f"{RUNS}{run_id}/state/?step=0")
    took = time.monotonic() - began
    assert response.status_code == 200
    html = response.content.decode()
    assert "the replay was stopped after 0.5 s" in html
    assert "CLEAT_CONSOLE_REPLAY_TIMEOUT_SECONDS" in html and "cleat-error" in html
    assert took < 5, f"the state page took {took:.1f} s"
    # The worker's deadline is not the console's.
    from workflows.executor import get_runtime

    assert get_runtime().config.segment_timeout_s == settings.CLEAT_SEGMENT_TIMEOUT_SECONDS


@override_settings(CLEAT_CONSOLE_REPLAY_TIMEOUT_SECONDS=0)
def test_a_bad_deadline_setting_is_named_on_the_page(
    env: DatabaseWorkflowEnvironment, op: Client
) -> None:
    run_id = env.start("spinner")
    html = op.get(f"{RUNS}{run_id}/state/?step=0").content.decode()
    assert "CLEAT_CONSOLE_REPLAY_TIMEOUT_SECONDS must be a positive number of seconds" in html
