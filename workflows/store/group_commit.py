"""Adaptive group commit (PostgreSQL): the per-step appends of every run executing in this
worker process, written together in shared transactions when the process appends fast.

A durable step's event must be committed before the run's next call goes out (what the
reply led to must not leave the process before the reply is stored), so a run's thread
blocks on each append, made just before that call (engine.session.replay, "Persistence"). One
append per transaction makes the commit -- a round trip, the server's per-statement work and
its WAL flush -- the ceiling of a worker: on this project's 2-core test machine the server
spent about 1 ms of CPU on each step written alone, and 0.16 ms on each of 8 written in one
statement (``bench/store_bench.py`` prints both figures).

How it works, for each append (``DjangoStorage.append_events`` asks :func:`append` first):

- **Below the rate threshold** (``CLEAT_GROUP_COMMIT_MIN_RATE`` appends per second in this
  process, measured over windows of ``RATE_WINDOW_S``) the append is written directly, in a
  transaction of its own (``fenced_append``): the lowest latency when there is nothing to
  share a transaction with. Above it the process switches to batches, and back below half
  of it (the hysteresis keeps a rate near the threshold from flapping).
- **In batches**, the first run to arrive leads. When no batch is being written it writes
  at once: the database has nothing to do, and waiting for segments still computing would
  only add latency. While one is being written, it gathers the runs that arrive until that
  write ends, then writes them all; it stops waiting sooner when the batch holds
  ``CLEAT_GROUP_COMMIT_MAX_EVENTS`` events or ``CLEAT_GROUP_COMMIT_MAX_WAIT_MS`` have passed
  (then two writes are in flight). So the batch is what accumulated during one write: large
  when the process appends fast, a single append when it does not, and the segments'
  computing overlaps the database's writing. (Closing a batch as soon as every running
  segment waited put several small batches in flight at once: 2-2.7 events per batch on
  ``bench/store_bench.py`` against 3.9 now, and a quarter more database CPU per step with two
  processes.) A batch is written in one statement -- the function ``cleat.append_events``,
  which sets each tenant of the batch in turn (RLS) -- and so in one transaction.
- **Each run's fence is checked in the same statement**: the UPDATE matches only the rows
  still claimed by this worker at the run's generation whose history ends right before the
  run's first new step, and the INSERT writes the events of the matched runs only. A run
  whose fence was lost (reaped, terminated, a retried flush) is simply not matched: its
  writes are not made, its caller takes the general path, which tells those cases apart and
  raises ``FenceLost`` for that run alone; the other runs' writes commit.
- **Durability is unchanged**: every caller returns only after its batch committed, so its
  call goes out only then. When the
  batch's statement fails (a deadlock, a dropped connection), nothing of it was written -- one
  transaction -- and each caller writes its own append directly, as it would have
  without batching (a commit whose reply was lost is found by the general path: the steps
  already stored are skipped).

A direct append goes through the same function, with one run (``storage.fenced_append``).
Other databases write each append directly (their store says these statements through the
ORM).

**The finalizes of completed runs** are gathered the same way, by a second group commit with
the same settings (its rate counted apart: finalizes per second): above the threshold, the
runs that complete while a finalize is being written are finalized together, in one call of
the function ``cleat.finalize_done`` with all of them (:func:`write_finalizes`), as the appends
are. Each run's fence is checked in the call's statement; a run that did not match is not
written and takes the general finalize, which raises ``FenceLost`` for it alone. A finalize
returns only after its batch committed, as an append does. **The finalizes of suspended
runs** (every wait: ``cleat.finalize_wait``, :func:`write_suspends`) are gathered by a third
one, the same way.

The metrics are ``cleat_group_commit_*`` (the finalizes': ``cleat_group_commit_finalize*``;
the suspends': ``cleat_group_commit_suspend*``).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from prometheus_client import Counter, Histogram

from engine.events import EncodedEvent, Event, encode
from engine.storage import RunRef
from workflows.crypto import seal_column
from workflows.models import WorkflowEvent
from workflows.store.sql import queries

RATE_WINDOW_S = 0.25


@dataclass(frozen=True)
class _Meters:
    """The metrics of one kind of shared write (appends, completed runs' finalizes)."""

    writes: Counter
    batch_runs: Histogram
    wait: Histogram
    switches: Counter
    failures: Counter
    batch_events: Histogram | None = None


def _meters(writes: str, prefix: str, things: str) -> _Meters:
    """The metrics of one kind of write (``things``: what the help texts call them):
    ``cleat_group_commit_<writes>_total`` and ``cleat_group_commit_<prefix>batch_runs``,
    ``..._wait_seconds``, ``..._mode_switches_total``, ``..._batch_failures_total``."""
    name = f"cleat_group_commit_{prefix}"
    return _Meters(
        writes=Counter(
            f"cleat_group_commit_{writes}_total",
            f"{things[0].upper()}{things[1:]}, by how they were written (direct: a transaction "
            "of their own; batched: in a shared one; fallback: directly after their batch "
            "failed)",
            ["path"],
        ),
        batch_runs=Histogram(
            f"{name}batch_runs",
            f"Runs in one shared transaction of {things}",
            buckets=(1, 2, 4, 8, 16, 32, 64),
        ),
        wait=Histogram(
            f"{name}wait_seconds",
            f"How long one of the {things} waited for its batch to close",
            buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05),
        ),
        switches=Counter(
            f"{name}mode_switches_total",
            f"Switches between {things} written directly and in batches, by the mode switched to",
            ["to"],
        ),
        failures=Counter(
            f"{name}batch_failures_total",
            f"Shared transactions of {things} that failed (each was then written directly)",
        ),
    )


_APPEND_METERS = dataclasses.replace(
    _meters("appends", "", "per-step appends"),
    batch_events=Histogram(
        "cleat_group_commit_batch_events",
        "Events written by one shared transaction",
        buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    ),
)
_FINALIZE_METERS = _meters("finalizes", "finalize_", "completed runs' finalizes")
_SUSPEND_METERS = _meters("suspends", "suspend_", "suspended runs' finalizes")


def next_mode(batched: bool, rate: float, min_rate: float) -> bool:
    """Whether appends are batched, given the last window's rate (appends per second) and
    the threshold: batches from ``min_rate`` up, direct again below half of it; always
    batched when the threshold is 0."""
    if min_rate <= 0:
        return True
    return rate >= (min_rate / 2 if batched else min_rate)


@dataclass(frozen=True)
class Settings:
    enabled: bool
    min_rate: float
    max_events: int
    max_wait_s: float

    @classmethod
    def from_django(cls) -> Settings:
        return cls(
            enabled=bool(getattr(settings, "CLEAT_GROUP_COMMIT", True)),
            min_rate=float(getattr(settings, "CLEAT_GROUP_COMMIT_MIN_RATE", 200.0)),
            max_events=max(1, int(getattr(settings, "CLEAT_GROUP_COMMIT_MAX_EVENTS", 64))),
            max_wait_s=max(0.0, float(getattr(settings, "CLEAT_GROUP_COMMIT_MAX_WAIT_MS", 2.0)))
            / 1000.0,
        )


class _Done:
    """A one-shot signal between a batch's leader and one caller: :meth:`wait` returns once
    :meth:`set` was called (each called once). A lock held from the start: a
    ``threading.Event`` builds a ``Condition`` and notifies through it, about 4 µs of the
    GIL per append that a lock's release does not take."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        self._lock.release()

    def wait(self) -> None:
        self._lock.acquire()


@dataclass(eq=False)
class _Append:
    ref: RunRef
    # what write_batch sends for it: the run's fence and its events, payloads sealed
    run: dict[str, Any]
    rows: list[dict[str, Any]]
    done: _Done = field(default_factory=_Done)
    # True: committed; False: the fence did not match (nothing written); None: the batch
    # failed (nothing written): write it directly
    committed: bool | None = None

    @property
    def size(self) -> int:
        return len(self.rows)


@dataclass(eq=False)
class _Finalize:
    """A run's one-call finalize, as :func:`write_finalizes` (completed runs,
    ``cleat.finalize_done``) or :func:`write_suspends` (suspended runs,
    ``cleat.finalize_wait``) takes it: its entry in the function's list of runs and its
    remaining events (payloads sealed)."""

    ref: RunRef
    run: dict[str, Any]
    rows: list[dict[str, Any]]
    done: _Done = field(default_factory=_Done)
    committed: bool | None = None  # as _Append's
    # What the function returned for a matched run: its parent, if any (finalize_done);
    # when it is due, if ever (finalize_wait).
    answer: Any = None

    @property
    def size(self) -> int:
        return 1


_Item = TypeVar("_Item", _Append, _Finalize)


class GroupCommit(Generic[_Item]):
    """The process's group commit of one kind of write (see the module's docstring):
    ``write`` (by default :func:`write_batch`, the appends') writes a batch in one
    transaction and returns the ids of the runs whose fence matched. Thread-safe."""

    def __init__(
        self,
        config: Settings,
        write: Callable[[list[_Item]], set[str]] | None = None,
        meters: _Meters = _APPEND_METERS,
    ) -> None:
        self.config = config
        self._write: Callable[[list[_Item]], set[str]] = write or _write_appends
        self._meters = meters
        # the writes' counter for each path, its labels looked up once (about 3 us each time)
        self._written = {
            path: meters.writes.labels(path) for path in ("direct", "batched", "fallback")
        }
        self._cond = threading.Condition()
        self._open: list[_Item] = []  # the batch being gathered
        self._open_events = 0
        self._open_runs: set[str] = set()
        self._leading = False  # a leader is gathering _open
        self._flushing = 0  # batches being written
        self.batched = config.min_rate <= 0
        self._window_start = time.monotonic()
        self._window_count = 0
        # totals for summary(): writes by path, batches written, events (or runs) in them
        self.totals = {"direct": 0, "batched": 0, "fallback": 0, "batches": 0, "events": 0}

    def _count(self) -> bool:
        """Count one write (under the lock); whether it is batched."""
        now = time.monotonic()
        self._window_count += 1
        elapsed = now - self._window_start
        if elapsed >= RATE_WINDOW_S:
            batched = next_mode(self.batched, self._window_count / elapsed, self.config.min_rate)
            if batched != self.batched:
                self._meters.switches.labels("batched" if batched else "direct").inc()
                self.batched = batched
            self._window_start, self._window_count = now, 0
        return self.batched

    def counted_batched(self) -> bool:
        """Count one write; whether it goes in a batch (else the caller writes it
        directly)."""
        with self._cond:
            if self._count():
                return True
            self.totals["direct"] += 1
        self._written["direct"].inc()
        return False

    def append(
        self, tenant_id: uuid.UUID, ref: RunRef, events: Sequence[Event], now: datetime
    ) -> bool | None:
        """Write ``events`` (consecutive, from the run's stored count) in a shared
        transaction. True: committed; False: nothing written, the fence did not match (the
        caller's general path tells why); None: not batched, or the batch failed -- the
        caller writes them directly."""
        if not events or not contiguous(events) or not _can_batch(_connection()):
            return None
        if not self.counted_batched():
            return None
        # On this run's own thread, outside the lock: an error here (a payload that does
        # not seal) is this run's, and the encoding of one run does not hold up the others.
        return self.write(prepared(tenant_id, ref, events, now))  # type: ignore[arg-type]

    def write(self, item: _Item) -> bool | None:
        """Write ``item`` with the others gathered meanwhile (a counted, batched write)."""
        with self._cond:
            # A full batch, or one that holds this run already (a run appends one step at
            # a time; events join their run by id): join the next one.
            while self._leading and (
                self._open_events >= self.config.max_events or item.ref.run_id in self._open_runs
            ):
                self._cond.wait()
            self._open.append(item)
            self._open_runs.add(item.ref.run_id)
            self._open_events += item.size
            lead = not self._leading
            if lead:
                self._leading = True
                batch = self._gather()
            elif self._open_events >= self.config.max_events:
                self._cond.notify_all()  # the batch is full: its leader writes it now
        try:
            if lead:
                self._flush(batch)
            else:
                item.done.wait()
        finally:
            with self._cond:
                path = "fallback" if item.committed is None else "batched"
                self.totals[path] += 1
        self._written[path].inc()
        return item.committed

    def summary(self, name: str = "group_commit") -> str:
        """The totals, for the worker's last log line."""
        with self._cond:
            t = dict(self.totals)
        per_batch = t["events"] / t["batches"] if t["batches"] else 0.0
        return (
            f"{name}_direct={t['direct']} {name}_batched={t['batched']} "
            f"{name}_fallback={t['fallback']} {name}_batches={t['batches']} "
            f"{name}_{'events' if self._meters.batch_events else 'runs'}_per_batch="
            f"{per_batch:.1f}"
        )

    def _gather(self) -> list[_Item]:
        """The leader's wait (under the lock): while another batch is being written, until
        that write ends, the batch is full or its time is up; then the batch is taken and
        the next can gather."""
        started = time.monotonic()
        deadline = started + self.config.max_wait_s
        while True:
            if (
                self._open_events >= self.config.max_events
                or self._flushing == 0
                or time.monotonic() >= deadline
            ):
                break
            self._cond.wait(max(0.0, deadline - time.monotonic()))
        self._meters.wait.observe(time.monotonic() - started)
        batch, self._open, self._open_events = self._open, [], 0
        self._open_runs = set()
        self._leading = False
        self._flushing += 1
        self._cond.notify_all()  # whoever waits for a batch with room: this one is open
        return batch

    def _flush(self, batch: list[_Item]) -> None:
        """Write the batch on this (the leader's) thread's connection; tell every caller."""
        try:
            matched = self._write(batch)
        except Exception:  # nothing of the batch was written: each writes its own directly
            self._meters.failures.inc()
            for item in batch:
                item.committed = None
        else:
            events = sum(item.size for item in batch)
            if self._meters.batch_events is not None:
                self._meters.batch_events.observe(events)
            self._meters.batch_runs.observe(len(batch))
            with self._cond:
                self.totals["batches"] += 1
                self.totals["events"] += events
            for item in batch:
                item.committed = item.ref.run_id in matched
        finally:
            with self._cond:
                self._flushing -= 1
                self._cond.notify_all()
            for item in batch:
                item.done.set()


def contiguous(events: Sequence[Event]) -> bool:
    """The events' steps follow one another (what the one-statement appends require)."""
    first = events[0].step if events else 0
    return all(event.step == first + i for i, event in enumerate(events))


def _connection() -> BaseDatabaseWrapper:
    """This thread's connection, looked up once by each function that uses it: Django's
    ``connection`` proxy looks it up again at every attribute (about 5 µs each on the
    project's 2-core test machine, several times for each append)."""
    return connections[DEFAULT_DB_ALIAS]


def outside_transaction(conn: BaseDatabaseWrapper) -> bool:
    """``conn`` is in no transaction, so a statement sent on it is one of its own: what a
    one-message write, a one-call finalize or the claim's one-message load requires."""
    return not conn.in_atomic_block and conn.get_autocommit()


def _can_batch(conn: BaseDatabaseWrapper) -> bool:
    """The statements exist on ``conn``'s database (PostgreSQL) and the connection is
    outside a transaction (the batch is one transaction of its own)."""
    return "append_events" in queries(conn) and outside_transaction(conn)


def write_batch(batch: Sequence[_Append]) -> set[str]:
    """The appends in one statement (``append_events``, sql/postgresql.py), one transaction
    unless the caller is in one. Returns the ids of the runs whose fence matched (their
    events are written)."""
    runs = [item.run for item in batch]
    rows = [row for item in batch for row in item.rows]
    conn = _connection()
    with conn.cursor() as cursor:
        cursor.execute(queries(conn)["append_events"], [_json(runs), _json(rows)])
        return {str(row[0]) for row in cursor.fetchall()}


def _write_appends(batch: list[Any]) -> set[str]:
    """The appends' writer: :func:`write_batch`, looked up at each write (tests replace
    it)."""
    return write_batch(batch)


def write_finalizes(batch: Sequence[_Finalize]) -> set[str]:
    """Completed runs' finalizes in one statement (:func:`finalize_runs`). Sets each matched
    run's ``answer`` (its parent's id); returns the ids of the runs whose fence matched
    (written)."""
    return _answered(batch, finalize_runs(*_arguments(batch)))


def write_suspends(batch: Sequence[_Finalize]) -> set[str]:
    """Suspended runs' finalizes in one statement (:func:`finalize_waits`). Sets each matched
    run's ``answer`` (when it is due); returns the ids of the runs whose fence matched
    (written)."""
    return _answered(batch, finalize_waits(*_arguments(batch)))


def _arguments(batch: Sequence[_Finalize]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A batch's runs and their remaining events, as the one-call finalizes take them."""
    return [item.run for item in batch], [row for item in batch for row in item.rows]


def _answered(batch: Sequence[_Finalize], answers: dict[str, Any]) -> set[str]:
    for item in batch:
        item.answer = answers.get(item.ref.run_id)
    return set(answers)


def finalize_runs(runs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The statement ``finalize_done`` (sql/postgresql.py) for ``runs``, each as
    :func:`finalize_entry` makes it, and their remaining events ``rows``: one transaction
    unless the caller is in one. Returns each run whose fence matched (written), by id, with
    its parent's id (None for none)."""
    return _one_call("finalize_done", runs, rows)


def finalize_waits(runs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The statement ``finalize_wait`` (sql/postgresql.py) for suspended runs, each as
    :func:`finalize_entry` makes it with a suspension's fields, and their remaining events
    ``rows``: one transaction unless the caller is in one. Returns each run whose fence
    matched (written), by id, with when it is due (None: waits until woken)."""
    return _one_call("finalize_wait", runs, rows)


def _one_call(name: str, runs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The one-call finalize ``name`` (its two JSON arguments): each matched run's id, with
    the second column the function returns for it."""
    conn = _connection()
    with conn.cursor() as cursor:
        cursor.execute(queries(conn)[name], [_json(runs), _json(rows)])
        return {str(run_id): answer for run_id, answer in cursor.fetchall()}


def finalize_entry(
    tenant_id: uuid.UUID,
    ref: RunRef,
    events: Sequence[Event],
    now: datetime,
    fields: dict[str, Any],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A completed run's entry in ``finalize_done``'s list of runs, or a suspended one's in
    ``finalize_wait``'s (its fence, as an append's, and ``fields``: what the transition
    writes, sealed) and its remaining events' rows; ``events`` are consecutive
    (:func:`contiguous`), possibly none."""
    stored = [encode(e) for e in events]
    stamp = now.isoformat()
    run = {**_fenced_run(tenant_id, ref, stored, stamp), **fields}
    return run, event_rows(tenant_id, ref.run_id, stored, stamp)


# json.dumps with these arguments would build an encoder at every call.
_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def prepared(tenant_id: uuid.UUID, ref: RunRef, events: Sequence[Event], now: datetime) -> _Append:
    """One run's append, as :func:`write_batch` takes it: the events encoded, the payloads
    sealed, the fence and the rows as the statement's JSON reads them."""
    stored = [encode(e) for e in events]
    stamp = now.isoformat()
    run = _fenced_run(tenant_id, ref, stored, stamp)
    return _Append(ref, run, event_rows(tenant_id, ref.run_id, stored, stamp))


def _fenced_run(
    tenant_id: uuid.UUID, ref: RunRef, stored: Sequence[EncodedEvent], stamp: str
) -> dict[str, Any]:
    """A run's fence as the append's and the finalize's JSON read it: the run, its owner and
    generation, the first new step and the count after the last (None for both without
    events), and the write's moment ``stamp``."""
    first = stored[0].step if stored else None
    return {
        "id": ref.run_id,
        "tenant": str(tenant_id),
        "first": first,
        "next": None if first is None else first + len(stored),
        "worker": ref.worker_id,
        "generation": ref.generation,
        "now": stamp,
    }


def event_rows(
    tenant_id: uuid.UUID, run_id: str, stored: Sequence[EncodedEvent], stamp: str
) -> list[dict[str, Any]]:
    """Stored events as the append's and the finalize's JSON read them (``run`` naming the
    run, the payloads sealed; ``stamp``: the write's moment, ISO 8601; the SQL that reads
    them is ``_INSERT_FENCED_EVENTS`` in sql/postgresql.py): the intent time of an event
    without a checksum (a call's intent) is the write's."""
    return [
        {
            "run": run_id,
            "step": s.step,
            "type_code": s.type_code,
            "payload": seal_column(
                WorkflowEvent, "payload", tenant_id, (run_id, s.step), s.payload
            ),
            "ts": s.ts,
            "checksum": s.checksum,
            "intent_at": stamp if not s.checksum else None,
            "created_at": stamp,
        }
        for s in stored
    ]


_committer: GroupCommit[_Append] | None = None
_finalizer: GroupCommit[_Finalize] | None = None
_suspender: GroupCommit[_Finalize] | None = None
_made = False
_committer_lock = threading.Lock()


def _make() -> None:
    global _committer, _finalizer, _suspender, _made
    with _committer_lock:
        if not _made:
            config = Settings.from_django()
            if config.enabled:
                _committer = GroupCommit(config)
                # the writers looked up at each write, as the appends' writer is
                _finalizer = GroupCommit(
                    config, lambda batch: write_finalizes(batch), _FINALIZE_METERS
                )
                _suspender = GroupCommit(
                    config, lambda batch: write_suspends(batch), _SUSPEND_METERS
                )
            _made = True


def committer() -> GroupCommit[_Append] | None:
    """The process's group commit of appends, made from the settings at first use; None when
    it is turned off (``CLEAT_GROUP_COMMIT=false``)."""
    if not _made:
        _make()
    return _committer


def finalizer() -> GroupCommit[_Finalize] | None:
    """The process's group commit of completed runs' finalizes (the same settings; its rate
    is counted apart from the appends')."""
    if not _made:
        _make()
    return _finalizer


def suspender() -> GroupCommit[_Finalize] | None:
    """The process's group commit of suspended runs' finalizes (the same settings; its rate
    is counted apart)."""
    if not _made:
        _make()
    return _suspender


def reset() -> None:
    """Forget the process's group commits (tests changing their settings)."""
    global _committer, _finalizer, _suspender, _made
    with _committer_lock:
        _committer, _finalizer, _suspender, _made = None, None, None, False


def append(
    tenant_id: uuid.UUID, ref: RunRef, events: Sequence[Event], now: datetime
) -> bool | None:
    """:meth:`GroupCommit.append` of the process's group commit (None when it is off)."""
    group = committer()
    return None if group is None else group.append(tenant_id, ref, events, now)


def finalize(
    ref: RunRef, run: dict[str, Any], rows: list[dict[str, Any]]
) -> tuple[bool, Any] | None:
    """A completed run's finalize (its :func:`finalize_entry`) in a shared transaction,
    when the process finalizes fast: (True, its parent id or None) when committed; (False,
    None) when its fence did not match (nothing written: the caller's general path tells
    why); None when not batched or its batch failed -- the caller writes it directly. The
    caller's connection is outside a transaction."""
    return _shared(finalizer(), ref, run, rows)


def suspend(
    ref: RunRef, run: dict[str, Any], rows: list[dict[str, Any]]
) -> tuple[bool, Any] | None:
    """A suspended run's finalize (its :func:`finalize_entry` for ``finalize_wait``) in a
    shared transaction, when the process suspends runs fast: (True, when it is due) when
    committed; (False, None) when its fence did not match or its history is due for a fold
    (nothing written: the caller's general path follows); None when not batched or its batch
    failed -- the caller writes it directly. The caller's connection is outside a
    transaction."""
    return _shared(suspender(), ref, run, rows)


def _shared(
    group: GroupCommit[_Finalize] | None,
    ref: RunRef,
    run: dict[str, Any],
    rows: list[dict[str, Any]],
) -> tuple[bool, Any] | None:
    """A one-call finalize through ``group`` (:func:`finalize`, :func:`suspend`)."""
    if group is None or not group.counted_batched():
        return None
    item = _Finalize(ref, run, rows)
    committed = group.write(item)
    return None if committed is None else (committed, item.answer)


__all__ = [
    "GroupCommit",
    "Settings",
    "append",
    "committer",
    "event_rows",
    "finalize",
    "finalize_entry",
    "finalize_runs",
    "finalizer",
    "next_mode",
    "outside_transaction",
    "reset",
    "suspend",
    "suspender",
]
