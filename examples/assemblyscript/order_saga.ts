// An order saga in AssemblyScript, the same workflow as examples/order_saga.py: reserve
// stock, charge the card, wait for the warehouse to ship. Every step that succeeded registers
// its compensation; when a later step fails (the charge is declined, or nothing ships within
// three days) the compensations run in reverse order.
//
//   manage.py build_workflow examples/assemblyscript/order_saga.ts -o order_saga.wasm
//   manage.py deploy_workflow order_saga order_saga.wasm
//
// Services it calls: inventory.reserve / inventory.release, payments.charge / payments.refund.

import * as cleat from "../../sdk/assemblyscript/assembly/index";
import { Reply, Retry, Value } from "../../sdk/assemblyscript/assembly/index";

export { cleat_alloc, cleat_abi_version } from "../../sdk/assemblyscript/assembly/index";

const SHIPPING_DEADLINE_DAYS: i64 = 3;

class Compensation {
  constructor(public service: string, public operation: string, public request: Value) {}
}

let compensations: Compensation[] = [];

/** Undo what succeeded, newest first; the failure of a compensation, or null. */
function compensate(): Reply | null {
  for (let i = compensations.length - 1; i >= 0; i--) {
    const c = compensations[i];
    const reply = cleat.callWithRetry(c.service, c.operation, c.request, Retry.attempts(10));
    if (!reply.isOk()) return reply;
  }
  return null;
}

function setStatus(status: string): void {
  cleat.setQuery("status", Value.str(status));
}

function orderSaga(order: Value): Reply {
  const orderId = order.get("order_id");
  compensations = [];

  setStatus("reserving");
  const reservation = cleat.call(
    "inventory",
    "reserve",
    Value.object().set("order_id", orderId).set("sku", order.get("sku")).set("qty", order.get("qty")),
  );
  if (!reservation.isOk()) return reservation;
  compensations.push(
    new Compensation("inventory", "release", Value.object().set("reservation_id", reservation.json().get("id"))),
  );

  setStatus("charging");
  const retry = Retry.attempts(3);
  retry.initialIntervalMs = 2000;
  retry.nonRetryable = ["declined"];
  const charge = cleat.callWithRetry(
    "payments",
    "charge",
    Value.object().set("order_id", orderId).set("amount_cents", order.get("amount_cents")),
    retry,
  );
  if (charge.isCallFailed() || charge.status == cleat.PERMANENT) {
    const failed = compensate();
    if (failed !== null) return failed;
    setStatus("payment_failed");
    return cleat.fail(cleat.PERMANENT, "order " + orderId.asString() + ": payment failed: " + charge.text);
  }
  if (!charge.isOk()) return charge;
  const chargeId = charge.json().get("id");
  compensations.push(new Compensation("payments", "refund", Value.object().set("charge_id", chargeId)));

  setStatus("awaiting_shipment");
  const shipped = cleat.awaitSignals(["shipped"], SHIPPING_DEADLINE_DAYS * 86_400_000);
  if (shipped.status == cleat.TIMEOUT) {
    const failed = compensate();
    if (failed !== null) return failed;
    setStatus("cancelled");
    return cleat.ok(
      Value.object()
        .set("order_id", orderId)
        .setString("status", "cancelled")
        .setString("reason", "not shipped within " + SHIPPING_DEADLINE_DAYS.toString() + " days"),
    );
  }
  if (!shipped.isOk()) return shipped;

  setStatus("shipped");
  return cleat.ok(
    Value.object()
      .set("order_id", orderId)
      .setString("status", "shipped")
      .set("charge_id", chargeId)
      .set("carrier", shipped.json().get("payload").get("carrier"))
      .setString("shipped_at", cleat.iso8601(cleat.nowMs())),
  );
}

export function run(ptr: usize, len: usize): i64 {
  return cleat.entry(ptr, len, orderSaga);
}
