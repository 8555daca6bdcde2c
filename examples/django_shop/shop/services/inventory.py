"""The ``inventory`` service the checkout workflow calls (``CLEAT_SERVICES``).

A Python service is a module of functions ``operation(request, *, idempotency_key,
context)``; the worker calls them with the call's replay-stable idempotency key, which a
real implementation stores with its effect so a retried call does not reserve twice.
"""

from __future__ import annotations

from typing import Any

from engine.errors import PermanentError

STOCK = {"book": 5, "lamp": 0}


def reserve(request: dict[str, Any], *, idempotency_key: str, context: Any) -> dict[str, Any]:
    sku, qty = request["sku"], int(request["qty"])
    if STOCK.get(sku, 0) < qty:
        raise PermanentError(f"{sku} is out of stock")
    return {"reservation": f"res-{idempotency_key[:10]}", "sku": sku, "qty": qty}
