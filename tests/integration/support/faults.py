"""The fault-injection workload and the checker run after every fault scenario.

The workload (:class:`Workload`): ``job`` runs that debit an idempotent HTTP ledger
(``support.ledger``) and place a hold on it (the debit's event is appended before the hold
goes out), start a ``leaf`` child (which makes a ledger call of its own) and await
it, sleep on a timer, wait briefly for a signal, count their hops in workflow state and
continue-as-new once, then credit the ledger; every-minute ``tick`` schedules whose runs make
one ledger call each. Between them they pass every crash point: a service call and its
append, child starts, continue-as-new, finalizes and schedule firings.

The checker (:func:`check`) returns the violations it finds (a scenario asserts none):

1. every run reached its final state (``done``: a ``job`` chain's first run is done when it
   continued as new, and its successor exists);
2. every history is contiguous (steps 0..n-1, ``event_count`` agreeing), each event's
   checksum valid;
3. no write was accepted under a lost fence: replaying each run's module against its whole
   stored history, with storage, services and the clock sealed (any use is a violation),
   reaches the run's recorded end -- the same result, or the same continue-as-new -- so
   every row the run holds was written by the one segment chain that owned it (a stale
   worker's append or finalize mixed in would not replay, or would disagree with the row);
   and no run is still assigned to a worker;
4. each idempotency key's effect was applied exactly once: the ledger performed one effect
   per key, and the keys it holds are exactly the keys of the call events the histories
   record, each with the ledger's answer as its recorded response (no effect lost, none
   done for a call nobody recorded, none answered differently);
5. each schedule instant fired exactly once: the instants a schedule's runs were started for
   are exactly its every-minute instants from its first up to (not including) its
   ``next_run_at``, one run each.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from engine.determinism import idempotency_key
from engine.events import CallEvent, EncodedEvent, decode, verify
from engine.services import CallResult, Services
from engine.session import Completed, ContinuedAsNew, RunInfo, Suspend, WaitCondition, WaitKind
from engine.storage import RunRef
from tests.fixtures.wat import Wat
from tests.integration.support.ledger import Ledger

LEDGER = "ledger"


def job_module() -> bytes:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call {w.s(LEDGER)} {w.s("debit")} {w.input()}))
    (call $rec (call $durable_call {w.s(LEDGER)} {w.s("hold")} {w.input()}))
    (local.set $c (call $child_workflow {w.s("leaf")} {w.input()}))
    (call $rec (call $await_child {w.payload("c")}))
    (call $recn (call $durable_sleep (i64.const 200)))
    (call $rec (call $durable_await_signals {w.js(["go"])} (i64.const 300)))
    (local.set $n (call $incr_state {w.s("hops")} (i64.const 1)))
    (if (i64.lt_s (local.get $n) (i64.const 2))
      (then (drop (call $continue_as_new {w.input()}))))
    (call $rec (call $durable_call {w.s(LEDGER)} {w.s("credit")} {w.input()}))
    (call $finish)""",
        locals="$c i64 $n i64",
    )
    return w.wasm()


def leaf_module() -> bytes:
    w = Wat()
    w.run(
        f"(call $rec (call $durable_call {w.s(LEDGER)} {w.s('leaf')} {w.input()})) (call $finish)"
    )
    return w.wasm()


def tick_module() -> bytes:
    w = Wat()
    w.run(f"(call $rec (call $durable_call {w.s(LEDGER)} {w.s('tick')} {w.js({})})) (call $finish)")
    return w.wasm()


class Workload:
    """Deploys the workload's definitions in a tenant and starts its runs and schedules."""

    def __init__(self, tenant: Any) -> None:
        from workflows import definitions

        self.tenant = tenant
        for name, module in (
            ("job", job_module()),
            ("leaf", leaf_module()),
            ("tick", tick_module()),
        ):
            definitions.deploy_definition(tenant, name, module)
        self.started = 0

    def start_jobs(self, count: int) -> list[str]:
        from workflows import services

        runs = []
        for _ in range(count):
            instance, _ = services.start_workflow(
                self.tenant, "job", json.dumps({"n": self.started}, separators=(",", ":"))
            )
            self.started += 1
            runs.append(str(instance.id))
        return runs

    def signal(self, run_id: str) -> bool:
        """Send ``go`` to the run (or the run its chain continued as); False if it ended."""
        from workflows import services

        try:
            services.signal_workflow(self.tenant, run_id, "go", {"at": run_id})
        except services.ServiceError:
            return False
        return True

    def create_schedules(self, count: int, now: datetime, prefix: str = "tick") -> list[str]:
        """``count`` every-minute schedules whose first instant is the last minute at or
        before ``now`` (due at once), catching up whatever a fault makes them miss."""
        from schedules import services as sched

        made = []
        for n in range(count):
            schedule = sched.create_schedule(
                self.tenant,
                now=now - timedelta(seconds=60),
                name=f"{prefix}-{n:03d}",
                workflow_name="tick",
                cron="* * * * *",
                overlap_policy="allow",
                misfire_policy="catch_up",
                catch_up_limit=1000,
            )
            made.append(str(schedule.id))
        return made


# --- the checker ---------------------------------------------------------------------------------


@dataclass
class CheckReport:
    runs: int = 0
    events: int = 0
    calls: int = 0
    firings: int = 0
    violations: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        self.violations.append(text)

    def summary(self) -> str:
        return (
            f"runs={self.runs} events={self.events} calls={self.calls} "
            f"firings={self.firings} violations={len(self.violations)}"
        )


def unfinished(tenant: Any) -> int:
    """Runs not done yet (what a scenario waits on before checking)."""
    from workflows.models import RunStatus, WorkflowInstance
    from workflows.tenancy import tenant_context

    with tenant_context(tenant.id):
        return WorkflowInstance.objects.exclude(status=RunStatus.DONE).count()


def check(tenant: Any, ledger: Ledger, schedule_ids: Collection[str] = ()) -> CheckReport:
    from workflows.crypto import open_column
    from workflows.models import RunStatus, WorkflowDefinition, WorkflowEvent, WorkflowInstance
    from workflows.tenancy import tenant_context

    report = CheckReport()
    with tenant_context(tenant.id):
        rows = list(WorkflowInstance.objects.all())
        history: dict[str, list[EncodedEvent]] = {str(r.id): [] for r in rows}
        for run, step, code, ts, payload, checksum in WorkflowEvent.objects.order_by(
            "instance_id", "step"
        ).values_list("instance_id", "step", "type_code", "timestamp_ms", "payload", "checksum"):
            # Opened as every reader opens it (encryption at rest, when it is on).
            payload = open_column(WorkflowEvent, "payload", tenant.id, (run, step), payload)
            history[str(run)].append(EncodedEvent(step, code, ts, payload or "", checksum))
        modules = {
            d["id"]: (d["sha256"], bytes(d["wasm"]))
            for d in WorkflowDefinition.objects.values("id", "sha256", "wasm")
        }
        successors = {str(r.continued_from_id) for r in rows if r.continued_from_id}
    report.runs = len(rows)
    recorded: dict[str, str] = {}  # idempotency key -> recorded response
    where: dict[str, str] = {}  # idempotency key -> the run, step and call that recorded it
    for row in rows:
        run = str(row.id)
        events = history[run]
        report.events += len(events)
        # 4. the calls it recorded (of every run: an unfinished one's are not orphans)
        for encoded in events:
            event = decode(encoded)
            if isinstance(event, CallEvent) and event.service == LEDGER:
                key = idempotency_key(row.workflow_id, run, event.step)
                if key in recorded:
                    report.add(f"run {run} step {event.step}: key {key} recorded twice")
                recorded[key] = event.response
                where[key] = (
                    f"run {run} ({row.definition_name}, {row.workflow_id}) step {event.step}: "
                    f"{event.operation} status={event.status} attempt={event.attempt} "
                    f"error={event.error!r} response={event.response!r}"
                )
                report.calls += 1
        # 1. the final state
        if row.status != RunStatus.DONE:
            kids = {str(r.id): r.status for r in rows if str(r.parent_id) == run}
            report.add(
                f"run {run} ({row.definition_name}) is {row.status}: error={row.error!r} "
                f"waiting_on={row.waiting_on} next_wake_at={row.next_wake_at} "
                f"assigned_to={row.assigned_to} generation={row.generation} "
                f"events={[decode(e).describe() for e in events][-3:]} children={kids}"
            )
            continue
        if row.assigned_to:
            report.add(f"run {run} is done but still assigned to {row.assigned_to}")
        # 2. contiguous, checksummed
        steps = [e.step for e in events]
        if steps != list(range(len(events))):
            report.add(f"run {run}: history steps {steps} are not contiguous")
            continue
        if row.event_count != len(events):
            report.add(f"run {run}: event_count {row.event_count} but {len(events)} events")
        bad = [e.step for e in events if not verify(e)]
        if bad:
            report.add(f"run {run}: checksum mismatch at steps {bad}")
            continue
        # 3. the history replays to the row's end
        problem = _replay(row, events, modules[row.definition_id], run in successors)
        if problem:
            report.add(f"run {run} ({row.definition_name}): {problem}")
    _check_ledger(ledger, recorded, where, report)
    for schedule_id in schedule_ids:
        _check_schedule(tenant, schedule_id, report)
    return report


def _check_ledger(
    ledger: Ledger, recorded: dict[str, str], where: dict[str, str], report: CheckReport
) -> None:
    for key, response in recorded.items():
        entry = ledger.entries.get(key)
        if entry is None:
            report.add(
                f"key {key}: a recorded call the ledger never performed "
                f"(requests with the key: {ledger.requests.get(key, 0)}; "
                f"truncated requests: {ledger.truncated}): {where[key]}"
            )
        elif entry.response != response:
            report.add(
                f"key {key}: recorded {response!r}, the ledger answered {entry.response!r}: "
                f"{where[key]}"
            )
    orphans = set(ledger.entries) - set(recorded)
    if orphans:
        report.add(
            f"{len(orphans)} ledger effect(s) no history records, e.g. {sorted(orphans)[:2]}"
        )
    seqs = sorted(e.seq for e in ledger.entries.values())
    if seqs != list(range(1, len(seqs) + 1)):
        report.add("the ledger's sequence has gaps or repeats")
    if ledger.mismatches:
        report.add(f"idempotency keys reused for other requests: {ledger.mismatches[:3]}")


def _check_schedule(tenant: Any, schedule_id: str, report: CheckReport) -> None:
    from schedules.models import Schedule
    from workflows.models import WorkflowInstance
    from workflows.tenancy import tenant_context

    with tenant_context(tenant.id):
        schedule = Schedule.objects.get(id=schedule_id)
        started = list(
            WorkflowInstance.objects.filter(
                workflow_id__startswith=f"{schedule.name}@", continued_from__isnull=True
            ).values_list("workflow_id", flat=True)
        )
    fired = Counter(
        datetime.strptime(w.split("@", 1)[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        for w in started
    )
    report.firings += len(started)
    twice = sorted(i.isoformat() for i, n in fired.items() if n > 1)
    if twice:
        report.add(f"schedule {schedule.name}: instants fired more than once: {twice}")
    if schedule.next_run_at is None:
        report.add(f"schedule {schedule.name} has no next instant")
        return
    first = schedule.created_at.replace(second=0, microsecond=0) - timedelta(minutes=1)
    owed = set()
    at = first
    while at < schedule.next_run_at:
        owed.add(at)
        at += timedelta(minutes=1)
    # The first instant is the one at or after its creation's `now` (a minute before).
    owed = {i for i in owed if i >= min(fired, default=first)}
    if not fired:
        report.add(f"schedule {schedule.name} never fired (next_run_at {schedule.next_run_at})")
    elif set(fired) != owed:
        missing = sorted(i.isoformat() for i in owed - set(fired))
        extra = sorted(i.isoformat() for i in set(fired) - owed)
        report.add(f"schedule {schedule.name}: instants missing {missing}, beyond {extra}")


# --- the sealed replay -------------------------------------------------------------------------


class _Sealed(Suspend):
    def __init__(self, what: str) -> None:
        super().__init__(WaitCondition(WaitKind.TIMER))
        self.what = what


def _seal(what: str) -> Any:
    raise _Sealed(what)


class _SealedStorage:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: _seal(f"storage.{name}")


class _SealedCaller:
    def call(self, service: str, operation: str, request: str, context: Any) -> CallResult:
        return _seal(f"{service}.{operation}")  # type: ignore[no-any-return]


class _SealedFetcher:
    def fetch(self, *args: Any) -> CallResult:
        return _seal("fetch")  # type: ignore[no-any-return]


def _replay(
    row: Any, events: Sequence[EncodedEvent], module: tuple[str, bytes], continued: bool
) -> str:
    """'' when the module, replayed on ``events`` alone, ends as the row says."""
    from workflows.executor import get_runtime

    runtime = get_runtime()
    sha, wasm = module
    loaded = runtime.modules.peek(sha) or runtime.load(wasm, sha)
    run = RunInfo(
        ref=RunRef(str(row.tenant_id), row.workflow_id, str(row.id), "checker", 0),
        definition=row.definition_name,
        version=row.definition_version,
        input=row.input,
        start_ms=int(row.created_at.timestamp() * 1000),
        entry_point=row.entry_point,
    )
    services = Services(
        caller=_SealedCaller(),  # type: ignore[arg-type]
        fetcher=_SealedFetcher(),  # type: ignore[arg-type]
        plugins=_SealedStorage(),  # type: ignore[arg-type]
        resolvers={},
    )
    result = runtime.run_segment(
        loaded, run, list(events), _SealedStorage(), services, lambda: _seal("clock")
    )  # type: ignore[arg-type]
    outcome = result.outcome
    if result.recorded and result.replayed_steps != len(events):
        return f"the replay recorded new events past the history ({outcome!r})"
    if isinstance(outcome, Completed):
        if continued:
            return "completed on replay, but the row has a successor"
        if outcome.result != (row.result or ""):
            return f"the replay's result {outcome.result!r} differs from the row's {row.result!r}"
        return ""
    if isinstance(outcome, ContinuedAsNew):
        return "" if continued else "continued as new on replay, but has no successor"
    return f"the history does not replay to its end: {outcome!r}"
