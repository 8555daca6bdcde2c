//! The engine benchmark's step workload in Rust (bench/guest_bench.py): the input is N, and
//! the workflow makes N durable calls to bench.echo with `{}`, then returns `true`.
#![no_std]

use cleat::Value;

fn steps(input: Value) -> cleat::Result<Value> {
    let request = cleat::obj! {};
    for _ in 0..input.as_i64().unwrap_or(0) {
        cleat::call("bench", "echo", &request)?;
    }
    Ok(Value::Bool(true))
}

cleat::workflow!(run, steps);
