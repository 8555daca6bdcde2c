"""The OpenAPI schema: generated without warnings, served at /api/schema/ with Swagger UI at
/api/docs/, and a schemathesis run against it -- every operation, valid and invalid data,
with real names and ids as well as generated ones -- that finds no server error and no
response that breaks the schema (status code, content type, headers, body).

Bounded: a fixed seed, a fixed number of examples per operation and mode, no shrinking
phase (a failure is reported with the example that failed), no example database.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.conf import settings
from django.contrib.staticfiles import finders
from django.core.cache import cache
from django.core.handlers.wsgi import WSGIHandler
from django.core.management import call_command
from django.test import Client, override_settings
from hypothesis import HealthCheck, Phase, given, seed
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from schedules import services as schedule_services
from tests.integration.test_api_support import Api, key_for, promiser, signal_waiter
from workflows import definitions, services
from workflows.models import Promise, Role, Tenant
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)

SEED = 20261130
# Examples per operation: valid data, invalid data.
EXAMPLES = {"positive": 5, "negative": 3}
RESPONSE_CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
NO_THROTTLING = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"api_key": None}}


@pytest.fixture(autouse=True)
def _fresh_throttle_counts() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


def test_schema_generates_without_warnings() -> None:
    out = io.StringIO()
    call_command(
        "spectacular", "--fail-on-warn", "--validate", "--format", "openapi-json", stdout=out
    )
    assert '"/api/v1/workflows/{run_id}/signal"' in out.getvalue()


def test_schema_and_swagger_ui_are_served() -> None:
    client = Client()
    schema = client.get("/api/schema/", {"format": "json"})
    assert schema.status_code == 200
    document = schema.json()
    assert document["openapi"].startswith("3.")
    assert "apiKey" in document["components"]["securitySchemes"]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert any(code.startswith("2") for code in codes), (method, path)
            if path.startswith("/api/v1/"):
                assert {"400", "401", "403", "429"} <= codes, (method, path)
                assert operation["responses"]["401"]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/Error"
                }
    docs = client.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()
    # Swagger UI's own files come from this server (an air-gapped install still has its docs).
    page = docs.content.decode()
    assert "cdn.jsdelivr" not in page and "unpkg" not in page
    bundle = "drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js"
    assert f"/static/{bundle}" in page
    assert finders.find(bundle) is not None


@pytest.fixture
def real_ids(tenant: Tenant) -> Iterator[dict[str, str]]:
    """Definitions, runs and a promise the fuzzer can aim at by their real names and ids."""
    env = DatabaseWorkflowEnvironment(tenant)
    try:
        definitions.deploy_definition(tenant, "waiter", signal_waiter())
        definitions.deploy_definition(tenant, "waiter", signal_waiter())
        definitions.deploy_definition(tenant, "promiser", promiser())
        definitions.set_tag(tenant, "waiter", "stable", 2)
        run, _ = services.start_workflow(tenant, "waiter", {"order": 1})
        finished, _ = services.start_workflow(tenant, "waiter", {"order": 2})
        promised, _ = services.start_workflow(tenant, "promiser")
        env.run_until_idle()
        services.terminate_workflow(tenant, str(finished.id), "fixture")
        # Yearly, overlap skip: a backfill or trigger starts at most a few runs.
        schedule_services.create_schedule(
            tenant, name="yearly", workflow_name="waiter", cron="0 0 1 1 *", overlap_policy="skip"
        )
        with tenant_context(tenant.id):
            promise = Promise.objects.get(instance_id=promised.id).id
        yield {
            "name": "waiter",
            "version": "1",
            "tag": "stable",
            "run_id": str(run.id),
            "promise_id": promise,
            # Updates go to a finished run (409 at once): an update to a waiting run would
            # make every example wait for an answer no worker gives.
            "update_run_id": str(finished.id),
            "schedule": "yearly",
        }
    finally:
        env.close()


def fuzz(operation: Any, key: str, mode: Any, path_parameters: dict[str, str] | None) -> None:
    checks = [*RESPONSE_CHECKS]
    if mode == schemathesis.GenerationMode.NEGATIVE:
        checks.append(negative_data_rejection)
    strategy = operation.as_strategy(
        generation_mode=mode,
        headers={"Authorization": f"Bearer {key}"},
        path_parameters=path_parameters,
    )

    @seed(SEED)
    @hypothesis_settings(
        max_examples=EXAMPLES[str(mode)],
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=False,
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        response = case.call()
        case.validate_response(response, checks=checks)

    run()


def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    tenant: Tenant, real_ids: dict[str, str]
) -> None:
    key = key_for(tenant, Role.ADMIN, "fuzzer")
    assert Api(key).get("/api/v1/workflows").status_code == 200
    with override_settings(REST_FRAMEWORK=NO_THROTTLING):
        schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", WSGIHandler())
        failures: list[str] = []
        operations = 0
        for result in schema.get_all_operations():
            operation = result.ok()
            operations += 1
            needed = {p.name for p in operation.path_parameters}
            real = {name: value for name, value in real_ids.items() if name in needed}
            if operation.path.endswith("/update"):
                real["run_id"] = real_ids["update_run_id"]
            # With path parameters: valid data aimed at real rows (generated ids would only
            # ever meet 404s), invalid data with generated ones.
            plans: list[tuple[Any, dict[str, str] | None]] = [
                (schemathesis.GenerationMode.POSITIVE, real or None),
                (schemathesis.GenerationMode.NEGATIVE, None),
            ]
            for mode, path_parameters in plans:
                try:
                    fuzz(operation, key, mode, path_parameters)
                except Unsatisfiable:
                    # Nothing about this operation can be made invalid (no parameters, no
                    # body): there is no negative case to try.
                    assert mode == schemathesis.GenerationMode.NEGATIVE, operation.label
                except Exception as exc:  # collect them all, then fail with every report
                    failures.append(f"{operation.label} [{mode}]: {exc}")
    assert operations >= 50
    assert not failures, "\n\n".join(failures)
