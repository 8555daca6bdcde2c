"""The shop's checkout, end to end: a view starts the run, the worker carries it, the
warehouse's view signals it, the worker completes it, and the status view reads the result.

``python manage.py test shop`` (the workflow is built once through cleat's build cache).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from django.core.management import call_command
from django.test import TransactionTestCase

from workflows import client

CHECKOUT = Path(__file__).resolve().parents[2] / "flows" / "checkout.py"


def work() -> str:
    """Run the worker until nothing is due, as ``manage.py runworker`` does beside the site."""
    out = io.StringIO()
    call_command("runworker", "--burst", "--concurrency", "1", stdout=out)
    return out.getvalue()


class CheckoutTests(TransactionTestCase):
    # The worker's threads use their own connections: the tests commit, and each test gets
    # back what the migrations wrote (cleat's default tenant) after the flush.
    serialized_rollback = True

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        from cleat_workflow.testing import build

        cls.wasm = build(CHECKOUT)

    def setUp(self) -> None:
        client.deploy("checkout", self.wasm)

    def test_an_order_placed_in_a_view_completes_with_the_worker(self) -> None:
        placed = self.client.post(
            "/orders/", {"sku": "book", "qty": 2}, content_type="application/json"
        )
        self.assertEqual(placed.status_code, 202)
        run_id = placed.json()["run_id"]

        self.assertIn("processed 1 segment(s)", work())
        waiting = self.client.get(f"/orders/{run_id}/").json()
        self.assertEqual(waiting["status"], "ready")
        self.assertEqual(waiting["stage"], "awaiting_shipment")
        self.assertTrue(waiting["waiting_on"].startswith("signals shipped"))

        shipped = self.client.post(
            f"/orders/{run_id}/shipped/", {"carrier": "ups"}, content_type="application/json"
        )
        self.assertEqual(shipped.status_code, 202)
        work()

        done = self.client.get(f"/orders/{run_id}/").json()
        self.assertEqual(done["status"], "done", json.dumps(done))
        self.assertEqual(done["stage"], "shipped")
        self.assertEqual(done["result"]["status"], "shipped")
        self.assertEqual(done["result"]["carrier"], "ups")
        self.assertEqual(done["result"]["amount_cents"], 2 * 1299)
        self.assertTrue(client.get(run_id).finished)

    def test_a_repeated_request_starts_one_checkout(self) -> None:
        headers = {"HTTP_IDEMPOTENCY_KEY": "cart-7"}
        first = self.client.post("/orders/", {"sku": "book"}, "application/json", **headers)
        again = self.client.post("/orders/", {"sku": "book"}, "application/json", **headers)
        self.assertEqual(first.json()["run_id"], again.json()["run_id"])

    def test_an_out_of_stock_order_fails_and_a_shipped_signal_is_refused(self) -> None:
        run_id = self.client.post("/orders/", {"sku": "lamp"}, "application/json").json()["run_id"]
        work()
        failed = self.client.get(f"/orders/{run_id}/").json()
        self.assertEqual(failed["status"], "failed")
        self.assertIn("lamp is out of stock", failed["error"])
        refused = self.client.post(f"/orders/{run_id}/shipped/", {}, "application/json")
        self.assertEqual(refused.status_code, 409)
        self.assertEqual(refused.json()["code"], "conflict")

    def test_an_unknown_run_is_a_404(self) -> None:
        missing = self.client.get("/orders/not-a-run/")
        self.assertEqual(missing.status_code, 404)
        self.assertEqual(missing.json()["field"], "run_id")
