"""The demo the README's first command runs."""

from __future__ import annotations

from io import StringIO

from django.core.management import call_command


def test_demo_runs_the_order_workflow_to_completion():
    out = StringIO()
    call_command("demo", stdout=out)
    text = out.getvalue()
    assert "status: done" in text
    assert '"charged":12' in text
    assert "step  3  sleep(60000, sleep)" in text
    assert "no call repeated" in text
