"""Three scheduler processes racing over one PostgreSQL database, connected as the RLS-bound
application role (so the due read goes through the ``cleat.due_schedules`` definer
function): a hundred every-minute schedules, four instants, every instant started exactly
once and fired by exactly one process.

The processes share a virtual clock: started together once all three are ready, each ticks at
"instant k plus five seconds" until nothing is due at it any more, then moves to instant
k + 1, so all three see the same rows due at the same moment and fight over them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from schedules import services as sched
from schedules.models import Schedule
from tests.fixtures.wat import Wat
from tests.integration.support.processes import MANAGE, command_env, wait_until
from workflows import definitions
from workflows.models import Tenant, WorkflowInstance
from workflows.tenancy import tenant_context

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

SCHEDULES = 100
INSTANTS = 4
PROCESSES = 3
T0 = datetime(2031, 1, 6, 12, 0, tzinfo=UTC)

# One scheduler process (argv: T0, a folder for the start barrier, its name, instants).
SCHEDULER = """
import sys, time
from datetime import datetime, timedelta
from pathlib import Path
import django
django.setup()
from django.db import close_old_connections
from schedules.scheduler import tick

base, folder = datetime.fromisoformat(sys.argv[1]), Path(sys.argv[2])
name, count = sys.argv[3], int(sys.argv[4])
(folder / f"ready-{name}").touch()
while not (folder / "go").exists():
    time.sleep(0.002)
for k in range(count):
    now = base + timedelta(minutes=k, seconds=5)
    while True:  # until no schedule is due at this instant any more
        close_old_connections()
        report = tick(now, limit=500)
        if not report.due:
            break
        if not report.progress:
            time.sleep(0.005)  # the others hold the rows still due
print("scheduler finished", flush=True)
"""

FIRED = re.compile(r"event=schedule_fired schedule=(\S+) .*? instant=(\S+) outcome=(\S+)")


def quick() -> bytes:
    w = Wat()
    w.run(f"(call $note {w.s('done')}) (call $finish)")
    return w.wasm()


def test_three_schedulers_start_each_instant_exactly_once(tenant: Tenant, tmp_path: Path) -> None:
    definitions.deploy_definition(tenant, "quick", quick())
    made = [
        sched.create_schedule(
            tenant,
            name=f"race-{n:03d}",
            workflow_name="quick",
            cron="* * * * *",
            now=T0 - timedelta(seconds=30),
        )
        for n in range(SCHEDULES)
    ]
    assert {s.next_run_at for s in made} == {T0}
    # A generous grace: a loaded machine must not turn a slow race into misfires.
    env = command_env(CLEAT_SCHEDULE_MISFIRE_GRACE_SECONDS="3600")
    logs = [tmp_path / f"scheduler-{i}.log" for i in range(PROCESSES)]
    procs = []
    for i, log in enumerate(logs):
        with open(log, "wb") as out:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        SCHEDULER,
                        T0.isoformat(),
                        str(tmp_path),
                        str(i),
                        str(INSTANTS),
                    ],
                    env=env,
                    cwd=MANAGE.parent,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        # Start them together, once every interpreter has imported Django.
        wait_until(
            lambda: (
                all((tmp_path / f"ready-{i}").exists() for i in range(PROCESSES))
                or any(p.poll() is not None for p in procs)
            ),
            120,
            "three scheduler processes ready",
        )
        (tmp_path / "go").touch()
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    texts = [log.read_text(errors="replace") for log in logs]
    assert codes == [0] * PROCESSES, "\n".join(texts)[-5000:]
    for text in texts:
        assert "scheduler finished" in text
        assert "Traceback" not in text and "event=schedule_error" not in text, text[-3000:]

    fired = [
        (m.group(1), m.group(2), m.group(3), i)
        for i, t in enumerate(texts)
        for m in FIRED.finditer(t)
    ]
    # Every (schedule, instant) fired once, by one process, and started a new run.
    assert len(fired) == SCHEDULES * INSTANTS
    assert len({(s, instant) for s, instant, _, _ in fired}) == SCHEDULES * INSTANTS
    assert Counter(outcome for _, _, outcome, _ in fired) == {"started": SCHEDULES * INSTANTS}
    by_process = Counter(i for *_, i in fired)
    assert len(by_process) >= 2, f"no race happened: {by_process}"

    expected = {T0 + timedelta(minutes=k) for k in range(INSTANTS)}
    with tenant_context(tenant.id):
        keys = list(
            WorkflowInstance.objects.filter(
                start_idempotency_key__startswith="schedule:"
            ).values_list("start_idempotency_key", flat=True)
        )
        after = {s.id: s.next_run_at for s in Schedule.objects.all()}
    assert len(keys) == SCHEDULES * INSTANTS
    per_schedule: dict[str, set[datetime]] = {}
    for key in keys:
        _, schedule_id, instant = key.split(":", 2)
        per_schedule.setdefault(schedule_id, set()).add(datetime.fromisoformat(instant))
    assert {str(s.id) for s in made} == set(per_schedule)
    assert all(instants == expected for instants in per_schedule.values())
    assert set(after.values()) == {T0 + timedelta(minutes=INSTANTS)}
