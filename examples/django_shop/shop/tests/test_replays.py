"""Replay tests: every history exported from a real run (``manage.py export_history``) must
replay against the checkout's current code. A change that would break runs recorded by the
deployed code fails here, in CI, naming the step -- not in production.

The histories are ``shop/tests/histories/*.json`` (``$SHOP_HISTORIES`` names another
directory). See docs/changing-workflows.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from unittest import TestCase

CHECKOUT = Path(__file__).resolve().parents[2] / "flows" / "checkout.py"
HISTORIES = Path(os.environ.get("SHOP_HISTORIES", Path(__file__).parent / "histories"))


class CheckoutReplayTests(TestCase):
    def test_every_exported_history_replays_against_the_current_code(self) -> None:
        from cleat_workflow.testing import replay

        histories = sorted(HISTORIES.glob("*.json"))
        self.assertTrue(histories, f"no exported histories in {HISTORIES}")
        for path in histories:
            with self.subTest(history=path.name):
                # Raises NondeterminismError naming the step where the code diverges.
                result = replay(path, CHECKOUT)
                self.assertGreater(result.replayed_steps, 0)
