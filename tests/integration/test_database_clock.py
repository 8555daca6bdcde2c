"""The worker follows the database's clock (workflows.worker.DatabaseClock): a machine whose
clock is off by more than the tolerance corrects it by the offset it measured against the
server; within the tolerance, or on SQLite (one machine), the local clock is used as is."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from workflows import worker as worker_module
from workflows.store.lifecycle import database_now
from workflows.worker import DatabaseClock

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_skewed_machine_follows_the_database(monkeypatch: pytest.MonkeyPatch) -> None:
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(seconds=90))
    clock = DatabaseClock()
    clock.sync()
    if connection.vendor == "sqlite":
        assert database_now() is None
        assert clock.offset is None and clock.segment_clock() is None
        return
    assert clock.offset is not None
    assert abs(clock.offset.total_seconds() + 90) < 1.0, clock.offset
    assert abs((clock.now() - real()).total_seconds()) < 1.0
    assert clock.segment_clock() == clock.now
    # Synced once per CLOCK_SYNC_S: a second call inside it asks nothing.
    monkeypatch.setattr(worker_module, "database_now", lambda: pytest.fail("synced again"))
    clock.sync()


def test_an_offset_within_the_tolerance_is_ignored() -> None:
    clock = DatabaseClock()
    clock.sync()
    server = database_now()
    assert clock.offset is None and clock.segment_clock() is None
    if server is not None:
        assert isinstance(server, datetime) and server.tzinfo is not None
        assert abs((server - timezone.now()).total_seconds()) < 1.0
