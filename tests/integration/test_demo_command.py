"""The demo the README's first command runs."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_runs_the_order_workflow_through_the_store(tenant: Any) -> None:
    """Deploy, start, worker, signal, worker, timer, worker: done, with its history stored."""
    out = StringIO()
    call_command("demo", stdout=out)
    text = out.getvalue()
    assert "waiting on: signals paid" in text
    assert "status: done" in text
    assert '"charged":12' in text
    assert "step  3  sleep(2000, sleep)" in text


def test_demo_in_memory_replays_without_repeating_a_call() -> None:
    out = StringIO()
    call_command("demo", "--in-memory", stdout=out)
    text = out.getvalue()
    assert "status: done" in text
    assert "no call repeated" in text
