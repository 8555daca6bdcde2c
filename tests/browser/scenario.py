"""The console tests' world: a shop workflow whose warehouse can be "offline", and runs of it
and of the demo order workflow in every state the console shows.

``shop-order`` (hand-written WAT, guest ABI v1): sets query state ``stage``, calls
``shop.reserve`` with the run's input and returns its failure as the run's failure; then
sleeps 500 ms, calls ``shop.charge`` and returns the charge's answer. An item listed in
``OUTAGES`` makes ``reserve`` fail with a retryable error (the run is dead-lettered when its
definition allows one attempt); ``"forbidden"`` fails permanently.

Retrying such a run replays its history, recorded failure included, so it fails the same way
again. The dead letter a retry *fixes* is ``invoice-order``'s: a bad deploy replaced the
version's bytes with code that asks a different question at step 0 (``nondeterminism``), then
the right bytes were put back; its runs wait in the queue for an operator's retry.
"""

from __future__ import annotations

import hashlib
from typing import Any

import wasmtime

from engine.errors import PermanentError
from workflows import definitions
from workflows.demo import DEMO_WAT
from workflows.models import Tenant, WorkflowDefinition
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

OUTAGES: set[str] = set()
SERVICES = {"shop": "tests.browser.scenario", "demo": "workflows.demo"}

SHOP_WAT = r"""
(module
  (import "env" "durable_call" (func $call (param i32 i32 i32 i32 i32 i32) (result i64)))
  (import "env" "durable_sleep" (func $sleep (param i64) (result i64)))
  (import "env" "set_query_state" (func $query (param i32 i32 i32 i32) (result i64)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 4096))
  (data (i32.const 100) "shop")
  (data (i32.const 110) "reserve")
  (data (i32.const 120) "charge")
  (data (i32.const 200) "stage")
  (data (i32.const 210) "\"reserved\"")
  (data (i32.const 230) "\"charged\"")
  (data (i32.const 250) "\"started\"")
  (func (export "cleat_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "run") (param $in i32) (param $len i32) (result i64)
    (local $r i64)
    (drop (call $query (i32.const 200) (i32.const 5) (i32.const 250) (i32.const 9)))
    (local.set $r (call $call (i32.const 100) (i32.const 4) (i32.const 110) (i32.const 7)
                              (local.get $in) (local.get $len)))
    (if (i32.ne (i32.load8_u (i32.wrap_i64 (i64.shr_u (local.get $r) (i64.const 32))))
                (i32.const 0))
      (then (return (local.get $r))))
    (drop (call $query (i32.const 200) (i32.const 5) (i32.const 210) (i32.const 10)))
    (drop (call $sleep (i64.const 500)))
    (local.set $r (call $call (i32.const 100) (i32.const 4) (i32.const 120) (i32.const 6)
                              (local.get $in) (local.get $len)))
    (drop (call $query (i32.const 200) (i32.const 5) (i32.const 230) (i32.const 9)))
    (local.get $r))
)
"""


# The same module asking shop.reservx instead of shop.reserve (same length: same offsets).
DRIFTED_WAT = SHOP_WAT.replace('"reserve"', '"reservx"')


def reserve(request: dict[str, Any], *, idempotency_key: str, context: Any) -> dict[str, Any]:
    item = str(request.get("item", "?"))
    if item == "forbidden":
        raise PermanentError(f"item {item} may not be sold")
    if item in OUTAGES:
        raise RuntimeError(f"warehouse for {item} is offline")
    return {"reserved": item}


def charge(request: dict[str, Any], *, idempotency_key: str, context: Any) -> dict[str, Any]:
    return {"charged": request.get("amount", 0), "receipt": idempotency_key[:12]}


def deploy(tenant: Tenant) -> None:
    """``shop-order`` (one attempt: a failure dead-letters at once) and ``demo-order``."""
    definitions.deploy_definition(
        tenant, "shop-order", wasmtime.wat2wasm(SHOP_WAT), retry_max_attempts=1
    )
    definitions.deploy_definition(tenant, "demo-order", wasmtime.wat2wasm(DEMO_WAT.read_text()))
    definitions.deploy_definition(tenant, "invoice-order", wasmtime.wat2wasm(SHOP_WAT))


def _replace_module(tenant: Tenant, name: str, wat: str) -> None:
    """What a bad deploy (and its roll-back) does: the version's bytes replaced in place."""
    wasm = wasmtime.wat2wasm(wat)
    with tenant_context(tenant.id):
        WorkflowDefinition.objects.filter(tenant_id=tenant.id, name=name).update(
            wasm=wasm, sha256=hashlib.sha256(wasm).hexdigest()
        )


def nondeterministic_runs(env: DatabaseWorkflowEnvironment, items: list[str]) -> list[str]:
    """Runs of ``invoice-order`` dead-lettered by a bad deploy that was then rolled back."""
    runs = [env.start("invoice-order", {"item": item, "amount": 9}) for item in items]
    # One segment each (reserve, then the 500 ms sleep suspends it), and no more: a run whose
    # timer came due meanwhile would finish with the right code before the bad deploy. The
    # claim order (due time, then age) takes the runs not yet started first.
    for _ in runs:
        assert env.step(), "an invoice run was not due"
    _replace_module(env.tenant, "invoice-order", DRIFTED_WAT)
    env.advance(1)  # the replay asks shop.reservx where the history has shop.reserve
    _replace_module(env.tenant, "invoice-order", SHOP_WAT)
    return runs


def dead_lettered_run(env: DatabaseWorkflowEnvironment, item: str, amount: int = 5) -> str:
    OUTAGES.add(item)
    return env.run("shop-order", {"item": item, "amount": amount})


def populate(tenant: Tenant) -> dict[str, Any]:
    """Runs in every state: done, dead-lettered (two of one group), failed, waiting for a
    signal, sleeping. Returns their ids by role."""
    env = DatabaseWorkflowEnvironment(tenant, SERVICES)
    try:
        deploy(tenant)
        done = env.run("shop-order", {"item": "book", "amount": 12})
        env.advance(1)
        runs = {
            "done": done,
            "dead": [dead_lettered_run(env, "lamp"), dead_lettered_run(env, "lamp", 7)],
            "broken": nondeterministic_runs(env, ["ledger", "stamp"]),
            "failed": env.run("shop-order", {"item": "forbidden"}),
            "waiting": [env.run("demo-order", {"n": i}) for i in range(3)],
            "sleeping": env.run("shop-order", {"item": "pen", "amount": 3}),
        }
    finally:
        env.close()
    return runs
