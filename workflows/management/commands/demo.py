"""``manage.py demo``: run the demo workflow end to end and print its timeline."""

from __future__ import annotations

from typing import Any

import wasmtime
from django.core.management.base import BaseCommand

from engine.testing import WorkflowEnvironment
from workflows.demo import DEMO_WAT, charge, reserve


class Command(BaseCommand):
    help = "Run the demo order workflow (reserve, wait for 'paid', charge, sleep) and print it."

    def handle(self, *args: Any, **options: Any) -> None:
        env = WorkflowEnvironment(services={"demo": _DemoService()})
        env.deploy("demo-order", wasmtime.wat2wasm(DEMO_WAT.read_text()))
        run = env.run("demo-order", {"customer": "ada"})
        self.stdout.write(f"started run {run}: {env.describe(run)['waiting_on']}")
        env.signal(run, "paid", {"amount": 12})
        env.run_until_idle()
        self.stdout.write(f"signalled 'paid': now waiting on {env.describe(run)['waiting_on']}")
        env.advance(seconds=60)
        info = env.describe(run)
        self.stdout.write(f"status: {info['status']}  result: {info['result']}")
        self.stdout.write("history:")
        for event in env.history(run):
            self.stdout.write(f"  step {event.step:>2}  {event.describe()}")
        env.assert_replays(run)
        self.stdout.write(
            self.style.SUCCESS("replayed from history: same result, no call repeated")
        )


class _DemoService:
    reserve = staticmethod(reserve)
    charge = staticmethod(charge)
