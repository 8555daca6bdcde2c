"""The ``payments`` service the checkout workflow calls (``CLEAT_SERVICES``)."""

from __future__ import annotations

from typing import Any

PRICES_CENTS = {"book": 1299, "lamp": 4500}


def charge(request: dict[str, Any], *, idempotency_key: str, context: Any) -> dict[str, Any]:
    amount = PRICES_CENTS[request["sku"]] * int(request["qty"])
    return {"charge": f"ch-{idempotency_key[:10]}", "amount_cents": amount}
