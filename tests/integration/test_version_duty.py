"""The versions duty (workflows/version_duty.py): the stale-version check as a periodic duty
of the workers (or of beat), with the version garbage collection when CLEAT_VERSION_GC is on."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.fixtures.wat import Wat
from workflows import definitions, duties, services, version_duty
from workflows.duties import WorkerContext
from workflows.models import Tenant, WorkflowDefinition
from workflows.tenancy import tenant_context

pytestmark = pytest.mark.django_db(transaction=True)


def module() -> bytes:
    w = Wat()
    w.run("(call $finish)")
    return w.wasm()


def seed(tenant: Tenant) -> None:
    """ "flow": four versions, v1 deprecated and 120 days old with no run (a GC candidate);
    "busy": v1 60 days old with a run still waiting on it while v2 exists (migrate)."""
    wasm = module()
    for _ in range(4):
        definitions.deploy_definition(tenant, "flow", wasm)
    definitions.deprecate_definition(tenant, "flow", 1)
    definitions.deploy_definition(tenant, "busy", wasm)
    services.start_workflow(tenant, "busy", None)
    definitions.deploy_definition(tenant, "busy", wasm)
    old = timezone.now()
    with tenant_context(tenant.id):
        WorkflowDefinition.objects.filter(name="flow", version=1).update(
            created_at=old - timedelta(days=120)
        )
        WorkflowDefinition.objects.filter(name="busy", version=1).update(
            created_at=old - timedelta(days=60)
        )


def versions(tenant: Tenant, name: str) -> list[int]:
    with tenant_context(tenant.id):
        return sorted(
            WorkflowDefinition.objects.filter(name=name).values_list("version", flat=True)
        )


def test_the_duty_reports_stale_versions_and_collects_only_when_asked(
    tenant: Tenant, settings: Any
) -> None:
    seed(tenant)
    now = timezone.now()
    settings.CLEAT_VERSION_GC = False
    duty = version_duty.worker_duty(WorkerContext("w", None, 1.0))
    assert duty is not None
    assert duty.run_due(now) is False  # its first check comes a little after start-up
    assert duty.run_due(now + timedelta(minutes=3)) is True
    assert any("busy v1" in a and "consider migrating" in a for a in duty.last_alerts)
    assert any("flow v1" in a and "can be purged" in a for a in duty.last_alerts)
    assert version_duty.STALE_VERSIONS.labels("migrate")._value.get() == 1
    assert version_duty.STALE_VERSIONS.labels("purge")._value.get() == 1
    assert duty.last_removed == [] and versions(tenant, "flow") == [1, 2, 3, 4]
    assert duty.run_due(now + timedelta(minutes=4)) is False  # next one a day later

    settings.CLEAT_VERSION_GC = True
    collecting = version_duty.worker_duty(WorkerContext("w", None, 1.0))
    assert collecting is not None
    collecting.run_due(now + timedelta(minutes=3))
    assert collecting.last_removed == [f"{tenant.name}: flow v1"]
    assert versions(tenant, "flow") == [2, 3, 4] and versions(tenant, "busy") == [1, 2]


def test_the_duty_is_registered_and_can_be_turned_off(settings: Any) -> None:
    assert "versions" in duties.registered()
    settings.CLEAT_VERSION_CHECK_INTERVAL_SECONDS = 0
    assert version_duty.worker_duty(WorkerContext("w", None, 1.0)) is None
