/* An order saga in C, the same workflow as examples/order_saga.py: reserve stock, charge the
 * card, wait for the warehouse to ship. Every step that succeeded registers its compensation;
 * when a later step fails (the charge is declined, or nothing ships within three days) the
 * compensations run in reverse order.
 *
 *     manage.py build_workflow examples/c/order_saga.c -o order_saga.wasm
 *     manage.py deploy_workflow order_saga order_saga.wasm
 *
 * Services it calls: inventory.reserve / inventory.release, payments.charge / payments.refund.
 */
#include "cleat.h"

#define SHIPPING_DEADLINE_DAYS 3

typedef struct {
    cleat_str service, operation, request;
} compensation;

static compensation compensations[2];
static int n_compensations;

static void add_compensation(cleat_str service, cleat_str operation, const char *key,
                             cleat_str id) {
    cleat_buf request = cleat_buf_new();
    cleat_json_begin_object(&request);
    cleat_json_key(&request, key);
    cleat_json_raw(&request, id);
    cleat_json_end_object(&request);
    compensations[n_compensations++] =
        (compensation){service, operation, cleat_buf_view(&request)};
}

/* Undo what succeeded, newest first; a compensation that still fails fails the run. */
static bool compensate(cleat_reply *failed) {
    cleat_retry retry = CLEAT_RETRY_DEFAULT;
    retry.max_attempts = 10;
    for (int i = n_compensations - 1; i >= 0; i--) {
        compensation c = compensations[i];
        cleat_reply r = cleat_call_with_retry(c.service, c.operation, c.request, retry);
        if (!cleat_is_ok(r)) {
            *failed = r;
            return false;
        }
    }
    return true;
}

static void set_status(const char *status) {
    cleat_buf value = cleat_buf_new();
    cleat_json_string(&value, cleat_cstr(status));
    cleat_set_query(CLEAT_S("status"), cleat_buf_view(&value));
}

static cleat_reply order_saga(cleat_str order) {
    cleat_str order_id = cleat_json_get(order, "order_id");
    cleat_reply failed;
    n_compensations = 0;

    set_status("reserving");
    cleat_buf request = cleat_buf_new();
    cleat_json_begin_object(&request);
    cleat_json_key(&request, "order_id");
    cleat_json_raw(&request, order_id);
    cleat_json_key(&request, "sku");
    cleat_json_raw(&request, cleat_json_get(order, "sku"));
    cleat_json_key(&request, "qty");
    cleat_json_raw(&request, cleat_json_get(order, "qty"));
    cleat_json_end_object(&request);
    cleat_reply reservation =
        cleat_call(CLEAT_S("inventory"), CLEAT_S("reserve"), cleat_buf_view(&request));
    if (!cleat_is_ok(reservation)) return reservation;
    add_compensation(CLEAT_S("inventory"), CLEAT_S("release"), "reservation_id",
                     cleat_json_get(reservation.value, "id"));

    set_status("charging");
    request = cleat_buf_new();
    cleat_json_begin_object(&request);
    cleat_json_key(&request, "order_id");
    cleat_json_raw(&request, order_id);
    cleat_json_key(&request, "amount_cents");
    cleat_json_raw(&request, cleat_json_get(order, "amount_cents"));
    cleat_json_end_object(&request);
    cleat_retry retry = CLEAT_RETRY_DEFAULT;
    retry.max_attempts = 3;
    retry.initial_interval_ms = 2000;
    retry.non_retryable = CLEAT_S("[\"declined\"]");
    cleat_reply charge =
        cleat_call_with_retry(CLEAT_S("payments"), CLEAT_S("charge"), cleat_buf_view(&request), retry);
    if (cleat_is_call_failed(charge) || charge.status == CLEAT_PERMANENT) {
        if (!compensate(&failed)) return failed;
        set_status("payment_failed");
        cleat_buf message = cleat_buf_new();
        cleat_buf_cstr(&message, "order ");
        cleat_buf_str(&message, cleat_json_as_string(order_id));
        cleat_buf_cstr(&message, ": payment failed: ");
        cleat_buf_str(&message, charge.value);
        return cleat_fail(CLEAT_PERMANENT, cleat_buf_view(&message));
    }
    if (!cleat_is_ok(charge)) return charge;
    cleat_str charge_id = cleat_json_get(charge.value, "id");
    add_compensation(CLEAT_S("payments"), CLEAT_S("refund"), "charge_id", charge_id);

    set_status("awaiting_shipment");
    cleat_reply shipped = cleat_await_signals(CLEAT_S("[\"shipped\"]"),
                                              (int64_t)SHIPPING_DEADLINE_DAYS * 86400000);
    cleat_buf result = cleat_buf_new();
    if (shipped.status == CLEAT_TIMEOUT) {
        if (!compensate(&failed)) return failed;
        set_status("cancelled");
        cleat_json_begin_object(&result);
        cleat_json_key(&result, "order_id");
        cleat_json_raw(&result, order_id);
        cleat_json_key(&result, "status");
        cleat_json_string(&result, CLEAT_S("cancelled"));
        cleat_json_key(&result, "reason");
        cleat_buf reason = cleat_buf_new();
        cleat_buf_cstr(&reason, "not shipped within ");
        cleat_buf_int(&reason, SHIPPING_DEADLINE_DAYS);
        cleat_buf_cstr(&reason, " days");
        cleat_json_string(&result, cleat_buf_view(&reason));
        cleat_json_end_object(&result);
        return cleat_ok(cleat_buf_view(&result));
    }
    if (!cleat_is_ok(shipped)) return shipped;

    set_status("shipped");
    cleat_json_begin_object(&result);
    cleat_json_key(&result, "order_id");
    cleat_json_raw(&result, order_id);
    cleat_json_key(&result, "status");
    cleat_json_string(&result, CLEAT_S("shipped"));
    cleat_json_key(&result, "charge_id");
    cleat_json_raw(&result, charge_id);
    cleat_json_key(&result, "carrier");
    cleat_json_raw(&result, cleat_json_get(cleat_json_get(shipped.value, "payload"), "carrier"));
    cleat_json_key(&result, "shipped_at");
    cleat_json_string(&result, cleat_iso8601(cleat_now_ms()));
    cleat_json_end_object(&result);
    return cleat_ok(cleat_buf_view(&result));
}

CLEAT_WORKFLOW(run, order_saga)
