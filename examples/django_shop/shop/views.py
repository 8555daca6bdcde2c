"""The shop's views: they start, signal and read checkout runs through ``workflows.client``.

A view never waits for a workflow: it starts the run (committed with the request), answers,
and the worker (``manage.py runworker``) carries the run on.
"""

from __future__ import annotations

import json

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_POST

from workflows import client


def _error(exc: client.ClientError) -> JsonResponse:
    return JsonResponse(
        {"error": exc.message, "code": exc.code, "field": exc.field}, status=exc.http_status
    )


@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    order = json.loads(request.body or b"{}")
    try:
        run = client.start(
            "checkout",
            {"sku": order.get("sku"), "qty": order.get("qty", 1)},
            # A retried or double-clicked request starts no second checkout.
            idempotency_key=request.headers.get("Idempotency-Key"),
        )
    except client.ClientError as exc:
        return _error(exc)
    return JsonResponse({"run_id": run.id, "status": run.status}, status=202)


@require_GET
def order_status(request: HttpRequest, run_id: str) -> JsonResponse:
    try:
        run = client.get(run_id)
    except client.ClientError as exc:
        return _error(exc)
    return JsonResponse(
        {
            "run_id": run.id,
            "status": run.status,
            "stage": run.query_state.get("stage"),
            "waiting_on": run.waiting_on,
            "result": run.result,
            "error": run.error,
        }
    )


@require_POST
def mark_shipped(request: HttpRequest, run_id: str) -> JsonResponse:
    body = json.loads(request.body or b"{}")
    try:
        client.signal(run_id, "shipped", {"carrier": body.get("carrier", "post")})
    except client.ClientError as exc:
        return _error(exc)
    return JsonResponse({"run_id": run_id, "signalled": "shipped"}, status=202)
