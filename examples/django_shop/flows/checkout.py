"""The shop's checkout, a cleat workflow: reserve, charge, wait for the warehouse.

Built into a WebAssembly component and deployed with::

    python manage.py build_workflow flows/checkout.py -o checkout.wasm
    python manage.py deploy_workflow checkout checkout.wasm
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from cleat_workflow import Context, Timeout, workflow


@workflow
def checkout(ctx: Context, order: dict[str, Any]) -> dict[str, Any]:
    ctx.set_query("stage", "reserving")
    reservation = ctx.call("inventory", "reserve", {"sku": order["sku"], "qty": order["qty"]})
    ctx.set_query("stage", "charging")
    charge = ctx.call("payments", "charge", {"sku": order["sku"], "qty": order["qty"]})
    ctx.set_query("stage", "awaiting_shipment")
    try:
        shipped = ctx.wait_for_signal("shipped", timeout=timedelta(days=7))
    except Timeout:
        return {"status": "not_shipped", "reservation": reservation["reservation"]}
    ctx.set_query("stage", "shipped")
    return {
        "status": "shipped",
        "reservation": reservation["reservation"],
        "charge": charge["charge"],
        "amount_cents": charge["amount_cents"],
        "carrier": shipped.payload["carrier"],
    }
