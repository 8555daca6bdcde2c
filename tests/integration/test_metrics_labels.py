"""``/metrics`` stays bounded whatever unauthenticated clients send: every label value of
the API's series comes from a fixed set (methods, route names, status codes)."""

from __future__ import annotations

import pytest
from django.test import Client

from workflows.api.views import method_label, status_label

pytestmark = pytest.mark.django_db(transaction=True)


def _exposition(client: Client) -> bytes:
    response = client.get("/metrics")
    assert response.status_code == 200
    return bytes(response.content)


def _series(text: bytes) -> set[str]:
    """The exposition's series (name and labels), without their values."""
    lines = text.decode().splitlines()
    return {line.rsplit(" ", 1)[0] for line in lines if line and not line.startswith("#")}


def test_junk_methods_and_paths_leave_the_exposition_bounded(tenant: object) -> None:
    client = Client()

    def junk(start: int, count: int) -> None:
        for n in range(start, start + count):
            client.generic(f"JUNK{n}", "/api/v1/workflows")
            client.get(f"/api/v1/workflows/run-{n}")
            client.get(f"/api/v1/no-such-endpoint-{n}" if n % 2 else f"/api/v1/definitions/d{n}")

    junk(0, 5)  # every series these requests can create exists now
    before = _exposition(client)
    junk(5, 300)
    after = _exposition(client)
    assert _series(after) == _series(before)
    assert b"JUNK" not in after and b"run-" not in after and b"no-such" not in after
    # Only the counts' digits grew: 900 more requests, a few bytes per series.
    assert len(after) - len(before) < 2_000, (len(before), len(after))


def test_label_values_come_from_fixed_sets() -> None:
    assert [method_label(m) for m in ("GET", "DELETE", "get", "JUNK", "", None)] == [
        "GET",
        "DELETE",
        "other",
        "other",
        "other",
        "other",
    ]
    assert [status_label(c) for c in (200, 404, 429, 418, 599, 99, 1000)] == [
        "200",
        "404",
        "429",
        "4xx",
        "5xx",
        "1xx",
        "5xx",
    ]
