"""``manage.py demo``: deploy the demo workflow, run it through the store and worker, and
print its history. ``--in-memory`` runs it on the engine alone (no database)."""

from __future__ import annotations

import json
import time
from typing import Any

import wasmtime
from django.core.management.base import BaseCommand, CommandParser

from engine.services import Services
from engine.testing import WorkflowEnvironment
from workflows import services as svc
from workflows.definitions import deploy_definition
from workflows.demo import DEMO_WAT, charge, reserve
from workflows.executor import get_services, set_services
from workflows.models import DEFAULT_TENANT_ID, WorkflowDefinition
from workflows.tenancy import tenant_context
from workflows.worker import Worker, WorkerOptions


class _DemoService:
    reserve = staticmethod(reserve)
    charge = staticmethod(charge)


class Command(BaseCommand):
    help = "Run the demo order workflow (reserve, wait for 'paid', charge, sleep 2 s) and print it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--in-memory", action="store_true", help="engine only, no database")

    def handle(self, *args: Any, **options: Any) -> None:
        wasm = wasmtime.wat2wasm(DEMO_WAT.read_text())
        if options["in_memory"]:
            self._in_memory(wasm)
        else:
            self._through_the_store(wasm)

    def _in_memory(self, wasm: bytes) -> None:
        env = WorkflowEnvironment(services={"demo": _DemoService()})
        env.deploy("demo-order", wasm)
        run = env.run("demo-order", {"customer": "ada"})
        self.stdout.write(f"started run {run}: waiting on {env.describe(run)['waiting_on']}")
        env.signal(run, "paid", {"amount": 12})
        env.run_until_idle()
        env.advance(seconds=2)
        info = env.describe(run)
        self.stdout.write(f"status: {info['status']}  result: {info['result']}")
        for event in env.history(run):
            self.stdout.write(f"  step {event.step:>2}  {event.describe()}")
        env.assert_replays(run)
        self.stdout.write(
            self.style.SUCCESS("replayed from history: same result, no call repeated")
        )

    def _through_the_store(self, wasm: bytes) -> None:
        tenant = svc.get_tenant(DEFAULT_TENANT_ID)
        services = get_services()
        demo = Services(
            caller=services.caller,
            fetcher=services.fetcher,
            plugins=services.plugins,
            resolvers=services.resolvers,
        )
        registry = getattr(demo.caller, "register", None)
        if registry is not None:
            registry("demo", _DemoService())
        set_services(demo)
        with tenant_context(tenant.id):
            latest = (
                WorkflowDefinition.objects.filter(tenant=tenant, name="demo-order")
                .order_by("-version")
                .values_list("sha256", "version")
                .first()
            )
        import hashlib

        if latest is None or latest[0] != hashlib.sha256(wasm).hexdigest():
            version = deploy_definition(tenant, "demo-order", wasm).version
            self.stdout.write(f"deployed demo-order version {version}")
        instance, _ = svc.start_workflow(tenant, "demo-order", {"customer": "ada"})
        run = str(instance.id)
        self.stdout.write(f"started run {run}")
        self._work()
        self.stdout.write(f"  waiting on: {self._show(run)['waiting_on']}")
        svc.signal_workflow(tenant, run, "paid", {"amount": 12})
        self.stdout.write("signalled 'paid'")
        self._work()
        self.stdout.write(f"  waiting on: {self._show(run)['waiting_on']}")
        time.sleep(2.1)
        self._work()
        info = self._show(run)
        self.stdout.write(f"status: {info['status']}  result: {info['result']}")
        from engine.events import decode
        from workflows.models import WorkflowEvent

        with tenant_context(tenant.id):
            for stored in WorkflowEvent.history(tenant.id, run):
                event = decode(stored)
                self.stdout.write(f"  step {event.step:>2}  {event.describe()}")
        self.stdout.write(self.style.SUCCESS("the history is in the database; the admin shows it"))

    def _work(self) -> None:
        Worker(WorkerOptions(worker_id="demo", burst=True, concurrency=1)).run()

    def _show(self, run: str) -> dict[str, Any]:
        from workflows.models import instance_summary

        tenant = svc.get_tenant(DEFAULT_TENANT_ID)
        with tenant_context(tenant.id):
            return json.loads(json.dumps(instance_summary(svc.get_instance(tenant, run))))
