//! An order saga in Zig, the same workflow as examples/order_saga.py: reserve stock, charge
//! the card, wait for the warehouse to ship. Every step that succeeded registers its
//! compensation; when a later step fails (the charge is declined, or nothing ships within
//! three days) the compensations run in reverse order.
//!
//!     manage.py build_workflow examples/zig/order_saga.zig -o order_saga.wasm
//!     manage.py deploy_workflow order_saga order_saga.wasm
//!
//! Services it calls: inventory.reserve / inventory.release, payments.charge / payments.refund.

const cleat = @import("cleat");
const json = cleat.json;

const shipping_deadline_days = 3;

const Compensation = struct { service: []const u8, operation: []const u8, request: []const u8 };

var compensations: [2]Compensation = undefined;
var n_compensations: usize = 0;

fn addCompensation(service: []const u8, operation: []const u8, key: []const u8, id: ?[]const u8) void {
    var request = cleat.Buf{};
    json.beginObject(&request);
    json.key(&request, key);
    json.raw(&request, id);
    json.endObject(&request);
    compensations[n_compensations] = .{ .service = service, .operation = operation, .request = request.slice() };
    n_compensations += 1;
}

/// Undo what succeeded, newest first; the failure of a compensation, or null.
fn compensate() ?cleat.Reply {
    var i = n_compensations;
    while (i > 0) {
        i -= 1;
        const c = compensations[i];
        const reply = cleat.callWithRetry(c.service, c.operation, c.request, .{ .max_attempts = 10 });
        if (!reply.isOk()) return reply;
    }
    return null;
}

fn setStatus(status: []const u8) void {
    cleat.setQuery("status", json.quote(status));
}

fn orderSaga(order: []const u8) cleat.Reply {
    const order_id = json.get(order, "order_id");
    n_compensations = 0;

    setStatus("reserving");
    var request = cleat.Buf{};
    json.beginObject(&request);
    json.key(&request, "order_id");
    json.raw(&request, order_id);
    json.key(&request, "sku");
    json.raw(&request, json.get(order, "sku"));
    json.key(&request, "qty");
    json.raw(&request, json.get(order, "qty"));
    json.endObject(&request);
    const reservation = cleat.call("inventory", "reserve", request.slice());
    if (!reservation.isOk()) return reservation;
    addCompensation("inventory", "release", "reservation_id", json.get(reservation.value, "id"));

    setStatus("charging");
    request = cleat.Buf{};
    json.beginObject(&request);
    json.key(&request, "order_id");
    json.raw(&request, order_id);
    json.key(&request, "amount_cents");
    json.raw(&request, json.get(order, "amount_cents"));
    json.endObject(&request);
    const charge = cleat.callWithRetry("payments", "charge", request.slice(), .{
        .max_attempts = 3,
        .initial_interval_ms = 2000,
        .non_retryable = "[\"declined\"]",
    });
    if (charge.isCallFailed() or charge.status == cleat.PERMANENT) {
        if (compensate()) |failed| return failed;
        setStatus("payment_failed");
        var message = cleat.Buf{};
        message.bytes("order ");
        message.bytes(json.asString(order_id) orelse "");
        message.bytes(": payment failed: ");
        message.bytes(charge.value);
        return cleat.fail(cleat.PERMANENT, message.slice());
    }
    if (!charge.isOk()) return charge;
    const charge_id = json.get(charge.value, "id");
    addCompensation("payments", "refund", "charge_id", charge_id);

    setStatus("awaiting_shipment");
    const shipped = cleat.awaitSignals("[\"shipped\"]", shipping_deadline_days * 86_400_000);
    var result = cleat.Buf{};
    if (shipped.status == cleat.TIMEOUT) {
        if (compensate()) |failed| return failed;
        setStatus("cancelled");
        var reason = cleat.Buf{};
        reason.bytes("not shipped within ");
        reason.int(shipping_deadline_days);
        reason.bytes(" days");
        json.beginObject(&result);
        json.key(&result, "order_id");
        json.raw(&result, order_id);
        json.key(&result, "status");
        json.string(&result, "cancelled");
        json.key(&result, "reason");
        json.string(&result, reason.slice());
        json.endObject(&result);
        return cleat.ok(result.slice());
    }
    if (!shipped.isOk()) return shipped;

    setStatus("shipped");
    json.beginObject(&result);
    json.key(&result, "order_id");
    json.raw(&result, order_id);
    json.key(&result, "status");
    json.string(&result, "shipped");
    json.key(&result, "charge_id");
    json.raw(&result, charge_id);
    json.key(&result, "carrier");
    json.raw(&result, json.get(json.get(shipped.value, "payload"), "carrier"));
    json.key(&result, "shipped_at");
    json.string(&result, cleat.iso8601(cleat.nowMs()));
    json.endObject(&result);
    return cleat.ok(result.slice());
}

export fn run(ptr: [*]const u8, len: usize) i64 {
    return cleat.entry(ptr, len, orderSaga);
}
