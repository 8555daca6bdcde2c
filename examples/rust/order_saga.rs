//! An order saga in Rust, the same workflow as `examples/order_saga.py`: reserve stock,
//! charge the card, wait for the warehouse to ship. Every step that succeeded registers its
//! compensation; when a later step fails (the charge is declined, or nothing ships within
//! three days) the compensations run in reverse order.
//!
//!     manage.py build_workflow examples/rust/order_saga.rs -o order_saga.wasm
//!     manage.py deploy_workflow order_saga order_saga.wasm
//!
//! Services it calls: `inventory.reserve` / `inventory.release`, `payments.charge` /
//! `payments.refund`.

#![no_std]

extern crate alloc;

use alloc::format;
use alloc::vec::Vec;
use cleat::{obj, Error, Retry, Status, Value};

const SHIPPING_DEADLINE_DAYS: i64 = 3;

struct Compensation {
    service: &'static str,
    operation: &'static str,
    request: Value,
}

fn compensate(compensations: &[Compensation]) -> cleat::Result<()> {
    for c in compensations.iter().rev() {
        cleat::call_with_retry(c.service, c.operation, &c.request, &Retry::attempts(10))?;
    }
    Ok(())
}

fn order_saga(order: Value) -> cleat::Result<Value> {
    let order_id = order["order_id"].clone();
    let mut compensations: Vec<Compensation> = Vec::new();

    cleat::set_query("status", &"reserving".into());
    let reservation = cleat::call(
        "inventory",
        "reserve",
        &obj! { "order_id" => order_id.clone(), "sku" => order["sku"].clone(), "qty" => order["qty"].clone() },
    )?;
    compensations.push(Compensation {
        service: "inventory",
        operation: "release",
        request: obj! { "reservation_id" => reservation["id"].clone() },
    });

    cleat::set_query("status", &"charging".into());
    let charge = match cleat::call_with_retry(
        "payments",
        "charge",
        &obj! { "order_id" => order_id.clone(), "amount_cents" => order["amount_cents"].clone() },
        &Retry::attempts(3).initial_interval_ms(2000).non_retryable(&["declined"]),
    ) {
        Ok(charge) => charge,
        Err(e) if e.is_call_failed() || e.status == Status::PERMANENT => {
            compensate(&compensations)?;
            cleat::set_query("status", &"payment_failed".into());
            let id = order_id.as_str().unwrap_or("");
            return Err(Error::permanent(format!("order {}: payment failed: {}", id, e.message)));
        }
        Err(e) => return Err(e),
    };
    compensations.push(Compensation {
        service: "payments",
        operation: "refund",
        request: obj! { "charge_id" => charge["id"].clone() },
    });

    cleat::set_query("status", &"awaiting_shipment".into());
    let deadline_ms = SHIPPING_DEADLINE_DAYS * 86_400_000;
    let shipped = match cleat::await_signals(&["shipped"], Some(deadline_ms)) {
        Ok(signal) => signal,
        Err(e) if e.status == Status::TIMEOUT => {
            compensate(&compensations)?;
            cleat::set_query("status", &"cancelled".into());
            return Ok(obj! {
                "order_id" => order_id,
                "status" => "cancelled",
                "reason" => format!("not shipped within {} days", SHIPPING_DEADLINE_DAYS),
            });
        }
        Err(e) => return Err(e),
    };

    cleat::set_query("status", &"shipped".into());
    Ok(obj! {
        "order_id" => order_id,
        "status" => "shipped",
        "charge_id" => charge["id"].clone(),
        "carrier" => shipped.payload["carrier"].clone(),
        "shipped_at" => cleat::now_iso(),
    })
}

cleat::workflow!(run, order_saga);
