"""An order saga: reserve stock, charge the card, wait for the warehouse to ship.

Every step that succeeded registers its compensation; when a later step fails (the charge
is declined, or nothing ships within the deadline) the compensations run in reverse order,
so the shop never keeps stock reserved or money taken for an order that will not ship.

    manage.py build_workflow examples/order_saga.py -o order_saga.wasm
    manage.py deploy_workflow order_saga order_saga.wasm
    manage.py start_workflow order_saga '{"order_id": "A-1", "sku": "book", "qty": 1,
                                           "amount_cents": 1299}'
    manage.py signal_workflow <run id> shipped '{"carrier": "ups", "tracking": "1Z..."}'

Services it calls: ``inventory.reserve`` / ``inventory.release``, ``payments.charge`` /
``payments.refund``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from cleat_workflow import CallFailed, Context, PermanentError, Timeout, workflow

SHIPPING_DEADLINE = timedelta(days=3)


@workflow
def order_saga(ctx: Context, order: dict[str, Any]) -> dict[str, Any]:
    compensations: list[tuple[str, str, dict[str, Any]]] = []

    def compensate() -> None:
        for service, operation, request in reversed(compensations):
            ctx.call_with_retry(service, operation, request, max_attempts=10)

    ctx.set_query("status", "reserving")
    reservation = ctx.call(
        "inventory",
        "reserve",
        {"order_id": order["order_id"], "sku": order["sku"], "qty": order["qty"]},
    )
    compensations.append(("inventory", "release", {"reservation_id": reservation["id"]}))

    ctx.set_query("status", "charging")
    try:
        charge = ctx.call_with_retry(
            "payments",
            "charge",
            {"order_id": order["order_id"], "amount_cents": order["amount_cents"]},
            max_attempts=3,
            initial_interval=2,
            non_retryable=["declined"],
        )
    except (CallFailed, PermanentError) as exc:
        compensate()
        ctx.set_query("status", "payment_failed")
        raise PermanentError(f"order {order['order_id']}: payment failed: {exc.message}") from None
    compensations.append(("payments", "refund", {"charge_id": charge["id"]}))

    ctx.set_query("status", "awaiting_shipment")
    try:
        shipped = ctx.wait_for_signal("shipped", timeout=SHIPPING_DEADLINE)
    except Timeout:
        compensate()
        ctx.set_query("status", "cancelled")
        return {
            "order_id": order["order_id"],
            "status": "cancelled",
            "reason": f"not shipped within {SHIPPING_DEADLINE.days} days",
        }

    ctx.set_query("status", "shipped")
    return {
        "order_id": order["order_id"],
        "status": "shipped",
        "charge_id": charge["id"],
        "carrier": (shipped.payload or {}).get("carrier"),
        "shipped_at": ctx.now().isoformat(),
    }
