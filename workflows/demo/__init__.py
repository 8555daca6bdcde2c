"""The demo workflow `python3 dev.py up` runs, and the toy services it calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DEMO_WAT = Path(__file__).with_name("order.wat")


def reserve(request: dict[str, Any], *, idempotency_key: str, context: Any) -> dict[str, Any]:
    return {"reserved": request.get("item", "?"), "reservation": idempotency_key[:12]}


def charge(request: dict[str, Any], *, idempotency_key: str, context: Any) -> dict[str, Any]:
    return {"charged": request.get("amount", 0), "receipt": idempotency_key[:12]}
