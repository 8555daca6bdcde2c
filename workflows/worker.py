"""The dispatch worker: claims due runs in batches, executes their segments on a thread pool,
keeps their leases alive, reaps the leases of workers that died, and sleeps until the next
due instant, a PostgreSQL NOTIFY or a segment's end -- whichever comes first.

Waking up: a listener thread holds a dedicated connection in ``LISTEN cleat_wake`` and sets
an event on every notification; ``stop()`` sets it too, and so does a finished segment when
the claim has room (a segment that ends while claimed runs still wait for a thread is
collected at the loop's next pass). The loop clears
the event *before* each claim and sleeps on it afterwards, so a notification that arrives
after a claim's snapshot (a run that claim could not see) ends the next sleep at once, even
while other segments run: wake-ups are at least once, never a poll interval late. While the
listener is not connected (start-up failure, a dropped connection being re-opened) the loop
polls at its poll interval, and every (re)connection wakes it once to catch up.

The worker owns only the loop. A bad row, a failing workflow or a database blip is logged
and the loop goes on; SIGTERM stops claiming, lets running segments finish (each is bounded
by the segment deadline) and exits.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ALL_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, close_old_connections, connection, connections
from django.utils import timezone
from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from workflows import duties
from workflows.executor import SegmentReport, execute_claim, get_services, runtime_if_made
from workflows.maintenance import maintenance_on_beat
from workflows.redaction import redacted_text
from workflows.store import group_commit, invocations
from workflows.store import workers as registry
from workflows.store.lifecycle import (
    Claim,
    Claims,
    claim_ready_instances,
    database_now,
    heartbeat_worker,
    next_due_at,
    release,
)
from workflows.store.sql import queries

log = logging.getLogger("cleat.worker")

SEGMENTS = Counter("cleat_segments_total", "Execution segments run", ["outcome"])
STEPS = Counter("cleat_steps_total", "Durable steps recorded")
SEGMENT_SECONDS = Histogram("cleat_segment_seconds", "Wall time of one segment")
CLAIMED = Counter("cleat_claimed_total", "Runs claimed")
LOOP_ERRORS = Counter("cleat_worker_loop_errors_total", "Errors caught by the worker loop")
INFLIGHT = Gauge("cleat_worker_inflight", "Segments running now")


class ReadyInstancesCollector(Collector):
    """The process's Python-workflow instances made ahead of their segments
    (engine.ready_instances): segments that took one or instantiated inline, instances made
    and dropped unused."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        runtime = runtime_if_made()
        stats = runtime.ready_stats() if runtime is not None else None
        if stats is None:
            return
        taken = CounterMetricFamily(
            "cleat_component_instances_taken",
            "Python-workflow segments by where their instance was made: ahead of the "
            "segment (ahead) or by the segment itself (inline)",
            labels=["made"],
        )
        taken.add_metric(["ahead"], stats.hits)
        taken.add_metric(["inline"], stats.misses)
        yield taken
        yield CounterMetricFamily(
            "cleat_component_instances_made_ahead", "Instances made ahead", value=stats.made
        )
        yield CounterMetricFamily(
            "cleat_component_instances_dropped",
            "Instances made ahead and dropped unused (idle, stop)",
            value=stats.dropped,
        )
        yield CounterMetricFamily(
            "cleat_component_instances_failed",
            "Components that could not be made ahead (made inline until one succeeds)",
            value=stats.failed,
        )
        warmed = runtime.warmed_instances() if runtime is not None else None
        if warmed is not None:
            yield CounterMetricFamily(
                "cleat_component_instances_warmed",
                "Instances whose first call's pages were made private or mapped before a "
                "segment took them (CLEAT_WARM_PAGES; stays 0 where the system cannot)",
                value=warmed,
            )


REGISTRY.register(ReadyInstancesCollector())

# The worker registry (workflows/store/workers.py): a row per live worker, upserted on each
# heartbeat (a third of the lease) and deleted on a clean stop. A row not refreshed for a day
# belongs to a worker that died long ago; each worker clears such rows when it starts.
FORGET_WORKERS_AFTER = timedelta(days=1)


# A connection that answered this recently skips Django's health check (a ``SELECT 1`` round
# trip before the first query after close_old_connections()) on the worker's hot paths. One
# that died in between fails its next statement instead: a segment's load is then read again
# on a new connection (executor._load); a claim fails as a loop error, retried after the
# loop's backoff; close_old_connections() drops the dead connection.
FRESH_CONNECTION_S = 1.0

_fresh = threading.local()


def _tidy_connection(conn: Any) -> None:
    """close_old_connections(), without the health check of this thread's connection
    ``conn`` (``connections[DEFAULT_DB_ALIAS]``, looked up once by the caller: each
    attribute read through Django's ``connection`` proxy looks it up again) when it answered
    less than FRESH_CONNECTION_S ago (see _mark_fresh)."""
    close_old_connections()
    if (
        conn.connection is not None
        and time.monotonic() < getattr(_fresh, "until", 0.0)
        and hasattr(conn, "health_check_done")
    ):
        conn.health_check_done = True


def _mark_fresh(conn: Any) -> None:
    """This thread's connection ``conn`` just answered without an error."""
    if conn.connection is not None and not conn.errors_occurred:
        _fresh.until = time.monotonic() + FRESH_CONNECTION_S
    else:
        _fresh.until = 0.0


# The fleet's clock is the database's. A worker reads the time for its claims, heartbeats,
# reaps, schedule ticks and segments from its own clock corrected by the offset it last
# measured against the database server (one round trip every CLOCK_SYNC_S). Each worker on
# its own clock went wrong as soon as the machines disagreed by about a lease: one whose
# clock ran ahead took every other worker's heartbeats for expired and reaped their live
# runs (and claimed timers early); one behind never saw runs due and never reaped a dead
# worker's (the fault-injection suite's clock-skew scenario). An offset within
# CLOCK_TOLERANCE_S (network latency, NTP's slack) is ignored: the local clock is used as is.
CLOCK_SYNC_S = 30.0
CLOCK_TOLERANCE_S = 1.0


class DatabaseClock:
    """This process's clock, set to the database server's (see CLOCK_SYNC_S)."""

    def __init__(self) -> None:
        self.offset: timedelta | None = None  # None: the local clock as it is
        self._next_sync = 0.0

    def sync(self) -> None:
        """Measure the offset again if it is due (on the loop's thread, its connection)."""
        tick = time.monotonic()
        if tick < self._next_sync:
            return
        self._next_sync = tick + CLOCK_SYNC_S
        before = timezone.now()
        server = database_now()
        after = timezone.now()
        if server is None:
            self.offset = None
            return
        offset = server - (before + (after - before) / 2)
        found = offset if abs(offset.total_seconds()) > CLOCK_TOLERANCE_S else None
        if found is not None and (
            self.offset is None or abs((found - self.offset).total_seconds()) > CLOCK_TOLERANCE_S
        ):
            log.warning(
                "event=clock_offset offset_s=%.3f (this machine's clock disagrees with the "
                "database's; the worker follows the database)",
                offset.total_seconds(),
            )
        self.offset = found

    def now(self) -> datetime:
        offset = self.offset
        return timezone.now() if offset is None else timezone.now() + offset

    def segment_clock(self) -> Callable[[], datetime] | None:
        """The clock a segment runs on: None (the local one) when there is no offset."""
        return None if self.offset is None else self.now


_gc_frozen = False


def freeze_long_lived_objects() -> None:
    """Once per process: move everything alive at the worker's start (Django, the project's
    modules, wasmtime's bindings) out of the cyclic collector's reach (``gc.freeze``). A full
    collection walked them all and paused the segment threads for 40-60 ms in the store
    benchmark; it now walks only what was created since. ``runworker``'s supervisor calls it
    before it forks (a forked worker's call is then a no-op)."""
    global _gc_frozen
    if not _gc_frozen:
        _gc_frozen = True
        gc.collect()
        gc.freeze()


CLAIM_AHEAD_AUTO = "auto"
# The longest queue ahead of the threads under CLAIM_AHEAD_AUTO, in threads: a timer drain
# (bench/waiting_bench.py) spent about a fifth less of the server's CPU a run with a queue of
# three times the threads than with one of the threads, and no less with a longer one.
AUTO_AHEAD_THREADS = 3


def next_claim_ahead(ahead: int, room: int, claimed: int, concurrency: int) -> int:
    """The queue ahead of the threads after a claim, under ``claim_ahead="auto"``: a claim
    that took all the room it had may have left runs due, so the queue grows by the threads
    (up to AUTO_AHEAD_THREADS times them): under a backlog, each claim's fixed cost -- a
    round trip, the function calls, the loads' statements -- is shared by more runs. One
    that came back short took every run due, and the queue halves: a worker with little to
    do claims for its idle threads only, and holds no runs that another worker could run.
    No claim (no room): unchanged."""
    if room <= 0:
        return ahead
    if claimed >= room:
        return min(AUTO_AHEAD_THREADS * concurrency, ahead + concurrency)
    return ahead // 2


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class WorkerOptions:
    worker_id: str = field(default_factory=default_worker_id)
    task_queues: Sequence[str] = ("default",)
    concurrency: int = 4
    tenant: uuid.UUID | None = None
    poll_interval_s: float = 1.0
    lease_s: float = 60.0
    burst: bool = False
    max_segments: int | None = None
    # Runs claimed beyond the threads: a busy worker claims again only once a thread would
    # otherwise have nothing to run, and then fills both its threads and this queue in one
    # claim -- one claim for many runs instead of one for each run or two. CLAIM_AHEAD_AUTO
    # (the default): a queue that follows the backlog (next_claim_ahead); a number: a queue
    # of that many (0: claim only for idle threads); None: as many as the threads.
    claim_ahead: int | str | None = CLAIM_AHEAD_AUTO


class Worker:
    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self._stop = threading.Event()
        # Set by a NOTIFY, stop() and a finished segment that leaves room for a claim: ends
        # the idle sleep.
        self._wake = threading.Event()
        # Set by stop() and a finished segment that leaves room for a claim: ends the sleep
        # of a worker with no free slot.
        self._freed = threading.Event()
        self._inflight: dict[Future[SegmentReport], Claim] = {}
        # The futures done and not yet collected (appended by their callbacks); the runs
        # handed to the pool (written by the loop alone) and, counted by the callbacks, the
        # segments finished: no lock, so that a callback run by stop() in a signal handler
        # never waits for one its own thread holds.
        self._done: deque[Future[SegmentReport]] = deque()
        self._submitted = 0
        self._finished = itertools.count(1)  # next() is atomic
        self.processed = 0
        self._listener: _PgListener | None = None
        self._next_invocation_check = 0.0
        self._clock = DatabaseClock()
        self._ahead = 0  # the queue under claim_ahead="auto" (next_claim_ahead)
        self._started_at: datetime | None = None
        self._steps_total = 0
        self._rate_mark: tuple[float, int] | None = None  # (monotonic, steps) at the last beat
        self._last_error = ""
        self._last_error_at: datetime | None = None
        # The reaper and what the apps above registered (the schedules app's tick, see
        # workflows/duties.py); none when Celery beat runs them (CLEAT_MAINTENANCE_ON_BEAT).
        self._duties = (
            []
            if maintenance_on_beat()
            else duties.start(
                duties.WorkerContext(
                    options.worker_id, options.tenant, options.poll_interval_s, options.lease_s
                )
            )
        )

    def stop(self, *_: Any) -> None:
        if not self._stop.is_set():
            log.info(
                "event=worker_stopping worker=%s inflight=%d",
                self.options.worker_id,
                len(self._inflight),
            )
        self._stop.set()
        # The claimed runs no thread has started stay unstarted (the loop gives them back).
        for future in list(self._inflight):
            future.cancel()
        self._wake.set()
        self._freed.set()

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)

    def run(self) -> int:
        opts = self.options
        log.info(
            "event=worker_started worker=%s queues=%s concurrency=%d tenant=%s burst=%s",
            opts.worker_id,
            ",".join(opts.task_queues),
            opts.concurrency,
            opts.tenant or "all",
            opts.burst,
        )
        freeze_long_lived_objects()
        listen = queries(connection).get("listen_wake")
        if listen is not None and not opts.burst:
            self._listener = _PgListener(connection.get_connection_params, listen, self._wake.set)
            self._listener.start()
        pool = ThreadPoolExecutor(max_workers=opts.concurrency, thread_name_prefix="cleat-segment")
        last_beat = 0.0
        errors = 0
        try:
            while not self._stop.is_set():
                try:
                    # Cleared before the claim: whatever is notified from here on is either
                    # seen by this claim or ends the sleep below at once.
                    self._wake.clear()
                    self._freed.clear()
                    # The segments finished so far, before the free slots are counted: a
                    # finished segment wakes the loop only when the claim has room.
                    self._collect(block=False)
                    _tidy_connection(connections[DEFAULT_DB_ALIAS])
                    self._clock.sync()
                    self._run_duties()  # before `now`: the claim takes the runs they started
                    now = self._clock.now()
                    tick = time.monotonic()
                    if tick - last_beat >= opts.lease_s / 3:
                        if self._inflight:
                            heartbeat_worker(opts.worker_id, now)
                        self._report(now, tick)
                        last_beat = tick
                    free = self._free_slots()
                    # Burst ends only when a claim found nothing due with nothing in flight:
                    # an empty claim for lack of capacity, or while running segments could
                    # still make runs due, is no reason to stop.
                    idle = not self._inflight
                    # The claimed runs' loads come in the claim's message (PostgreSQL): a
                    # segment thread starts on its run at once.
                    claims = claim_ready_instances(
                        opts.worker_id, opts.task_queues, free, now, opts.tenant, load=True
                    )
                    if free > 0:  # the claim asked the database
                        _mark_fresh(connections[DEFAULT_DB_ALIAS])
                    if opts.claim_ahead == CLAIM_AHEAD_AUTO:
                        self._ahead = next_claim_ahead(
                            self._ahead, free, len(claims), opts.concurrency
                        )
                    CLAIMED.inc(len(claims))
                    for claim in claims:
                        self._submitted += 1  # before the submit: its callback may run first
                        try:
                            future = pool.submit(self._execute, claim)
                        except BaseException:
                            self._submitted -= 1
                            raise
                        self._inflight[future] = claim
                        future.add_done_callback(self._segment_finished)
                    INFLIGHT.set(len(self._inflight))
                    self._collect(block=False)
                    errors = 0
                    self._deliver_invocations(now)
                    if opts.max_segments is not None and self.processed >= opts.max_segments:
                        break
                    if opts.burst and idle and not claims and not self._inflight:
                        break
                    # Fewer runs than free slots: nothing else was due at `now`, so sleep (a
                    # run started since then has notified). A full batch: claim again.
                    if len(claims) < free or free <= 0:
                        self._idle(now, claims)
                except Exception as exc:
                    _fresh.until = 0.0
                    errors += 1
                    LOOP_ERRORS.inc()
                    self._note_error(exc)
                    log.exception("event=worker_loop_error worker=%s", opts.worker_id)
                    self._stop.wait(min(30.0, 0.5 * 2 ** min(errors, 6)))
        finally:
            # Stop claiming; give back the runs not started; let segments in flight finish
            # (each is bounded by its deadline).
            self._release_queued()
            self._collect(block=True)
            pool.shutdown(wait=True)
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            self._unregister()
            close_old_connections()
            group, finalizes = group_commit.committer(), group_commit.finalizer()
            suspends = group_commit.suspender()
            log.info(
                "event=worker_stopped worker=%s processed=%d %s",
                opts.worker_id,
                self.processed,
                f"{group.summary()} {finalizes.summary('group_finalize')} "
                f"{suspends.summary('group_suspend')}"
                if group is not None and finalizes is not None and suspends is not None
                else "group_commit=off",
            )
        return self.processed

    def _run_duties(self) -> None:
        """Each registered duty's due work. One that raises is logged and the others (and
        the claim) still run."""
        for name, duty in self._duties:
            try:
                duty.run_due(self._clock.now())
            except Exception as exc:
                LOOP_ERRORS.inc()
                self._note_error(exc)
                log.exception("event=duty_error duty=%s worker=%s", name, self.options.worker_id)

    def _report(self, now: datetime, tick: float) -> None:
        """Upsert this worker's registry row (one statement). A failure is logged and the
        loop goes on: the registry is for people, the leases above are what matter."""
        opts = self.options
        if self._started_at is None:
            self._started_at = now
            with contextlib.suppress(Exception):
                registry.forget_long_gone(now, FORGET_WORKERS_AFTER)
        rate = 0.0
        if self._rate_mark is not None and tick > self._rate_mark[0]:
            rate = (self._steps_total - self._rate_mark[1]) / (tick - self._rate_mark[0])
        self._rate_mark = (tick, self._steps_total)
        host, pid = socket.gethostname(), os.getpid()
        try:
            registry.record_heartbeat(
                registry.WorkerBeat(
                    worker_id=opts.worker_id,
                    host=host,
                    pid=pid,
                    task_queues=list(opts.task_queues),
                    concurrency=opts.concurrency,
                    started_at=self._started_at,
                    heartbeat_interval_s=opts.lease_s / 3,
                    runs_held=len(self._inflight),
                    steps_total=self._steps_total,
                    steps_per_s=rate,
                    last_error=self._last_error,
                    last_error_at=self._last_error_at,
                ),
                now,
            )
        except Exception:
            LOOP_ERRORS.inc()
            log.exception("event=worker_registry_error worker=%s", opts.worker_id)

    def _unregister(self) -> None:
        if self._started_at is None:
            return
        try:
            registry.forget_worker(self.options.worker_id)
        except Exception:
            log.warning(
                "event=worker_registry_error worker=%s (its row stays, and will show stale)",
                self.options.worker_id,
                exc_info=True,
            )

    def _note_error(self, exc: BaseException) -> None:
        """The loop's last error, for the registry row (redacted, cut to a line or two)."""
        self._last_error = redacted_text(f"{type(exc).__name__}: {exc}")[: registry.ERROR_CHARS]
        self._last_error_at = self._clock.now()

    def _deliver_invocations(self, now: Any) -> None:
        """Calls workflows handed to the host (durable_send, durable_schedule_invoke)."""
        if time.monotonic() < self._next_invocation_check:
            return
        due = invocations.claim_due(now, 20)
        for invocation_id, tenant in due:
            invocations.deliver(invocation_id, tenant, get_services(), now)
        # Check again at once while there is a backlog, else every poll interval.
        self._next_invocation_check = (
            0.0 if due else time.monotonic() + self.options.poll_interval_s
        )

    def _free_slots(self) -> int:
        """How many runs the next claim may take (see WorkerOptions.claim_ahead): none while
        claimed runs still wait for a thread, else enough to fill the threads and the queue."""
        return self._free_for(len(self._inflight))

    def _free_for(self, held: int) -> int:
        """:meth:`_free_slots` with ``held`` runs claimed and not finished."""
        opts = self.options
        if opts.claim_ahead == CLAIM_AHEAD_AUTO:
            ahead = self._ahead
        elif opts.claim_ahead is None:
            ahead = opts.concurrency
        else:
            ahead = max(0, int(opts.claim_ahead))
        free = 0 if held > opts.concurrency else opts.concurrency + ahead - held
        if opts.max_segments is not None:
            free = min(free, opts.max_segments - self.processed - held)
        return max(0, free)

    def _release_queued(self) -> None:
        """On stop: give back the claimed runs no thread has started (they would delay the
        stop by whole segments); each is due again at once, its attempt not spent."""
        for future, claim in list(self._inflight.items()):
            if not (future.cancelled() or future.cancel()):
                continue  # running: it finishes, bounded by its deadline
            del self._inflight[future]
            try:
                release(claim.ref(self.options.worker_id))
            except Exception:  # the lease's expiry returns it
                log.exception("event=release_failed run=%s", claim.id)
        INFLIGHT.set(len(self._inflight))

    def _segment_finished(self, future: Future[SegmentReport]) -> None:
        """A segment's end (on its pool thread, or a queued run's cancellation): it is
        collected by the loop, which is woken only when it can act on it -- a claim has room
        now (a slot is free, and the run it finalized may have made others due; the last
        run's end always leaves room), or a segment limit is set. With runs still queued for
        the threads (the claim-ahead), a finished segment frees no room for a claim: waking
        the loop for each of them cost a context switch and a loop pass per run for
        nothing. A count read while the loop submits may be one run behind: the loop is then
        woken once more, never once less."""
        self._done.append(future)
        left = self._submitted - next(self._finished)
        if self.options.max_segments is not None or self._free_for(left) > 0:
            self._freed.set()
            self._wake.set()

    def _execute(self, claim: Claim) -> SegmentReport:
        conn = connections[DEFAULT_DB_ALIAS]  # this thread's, for as long as the thread lives
        _tidy_connection(conn)
        try:
            with SEGMENT_SECONDS.time():
                report = execute_claim(claim, self.options.worker_id, self._clock.segment_clock())
            _mark_fresh(conn)
        except BaseException:
            _fresh.until = 0.0
            raise
        finally:
            close_old_connections()
        return report

    def _collect(self, block: bool) -> None:
        """Count and record the finished segments: those the callbacks queued, and with
        ``block`` every segment in flight once all are done. One at a time off the queue: an
        error while recording one leaves the others queued for the next pass."""
        if not self._inflight:
            return
        if block:
            for future in wait(list(self._inflight), return_when=ALL_COMPLETED).done:
                self._collect_one(future)
        while self._done:
            self._collect_one(self._done.popleft())
        INFLIGHT.set(len(self._inflight))

    def _collect_one(self, future: Future[SegmentReport]) -> None:
        if future.cancelled():
            return  # stopping: _release_queued gives its run back
        claim = self._inflight.pop(future, None)
        if claim is None:
            return  # collected already (listed by the wait and queued by its callback)
        self.processed += 1
        try:
            report = future.result()
        except Exception:
            SEGMENTS.labels("error").inc()
            log.exception("event=segment_crashed run=%s", claim.id)
            return
        record_segment(report)
        self._steps_total += report.steps

    def _idle(self, now: Any, claims: Sequence[Claim] = ()) -> None:
        """Sleep until the next run is due, a NOTIFY arrives, a segment's end leaves room for
        a claim, a duty's next instant, or the poll interval passes -- whichever comes
        first. With no free slot a NOTIFY cannot be acted on: sleep until a segment's end
        leaves room instead (the notified run is claimed then). When the next run falls due
        comes with the claim's message where it can (``Claims.next_due``, PostgreSQL), else
        it is asked here."""
        opts = self.options
        timeout = opts.poll_interval_s
        for name, duty in self._duties:  # wake for a duty's next instant too
            try:
                timeout = min(timeout, duty.seconds_until_due(now))
            except Exception:
                log.exception("event=duty_error duty=%s worker=%s", name, opts.worker_id)
        if self._free_slots() <= 0:
            if timeout > 0:
                self._freed.wait(timeout)
            return
        if opts.burst:
            timeout = min(timeout, 0.05)
        else:
            if isinstance(claims, Claims) and claims.next_due_known:
                due = claims.next_due
            else:
                due = next_due_at(opts.task_queues, opts.tenant)
            # A run already due that this claim left is not claimable now (its tenant is at
            # its running cap or inactive, or another worker holds it): waking for it would
            # spin. A finishing segment (which frees room under a cap) or a NOTIFY wakes us.
            if due is not None and due > now:
                timeout = min(timeout, (due - now).total_seconds())
        if timeout > 0:
            self._wake.wait(timeout)


def record_segment(report: SegmentReport) -> None:
    """A finished segment's metrics and log line (the worker loop's and the Celery
    dispatch's: workflows/dispatch.py)."""
    SEGMENTS.labels(report.outcome).inc()
    STEPS.inc(report.steps)
    log.info(
        "event=segment run=%s outcome=%s status=%s steps=%d replayed=%d ms=%.1f%s",
        report.run_id,
        report.outcome,
        report.status,
        report.steps,
        report.replayed,
        report.elapsed_ms,
        f" detail={report.detail!r}" if report.detail else "",
    )


class _PgListener(threading.Thread):
    """``LISTEN cleat_wake`` on a dedicated autocommit connection, in a thread of its own:
    every notification calls ``wake``, at once. A failed or dropped connection is re-opened
    with backoff; each (re)connection calls ``wake`` too, since notifications sent while it
    was not listening are lost (the loop polls meanwhile)."""

    CHECK_S = 0.5  # how often a quiet listener looks at its closing flag
    BACKOFF_S = (0.5, 30.0)  # first and longest wait before re-connecting

    def __init__(
        self, params: Callable[[], dict[str, Any]], listen: str, wake: Callable[[], None]
    ) -> None:
        super().__init__(name="cleat-listen", daemon=True)
        # Asked at every (re)connection: a password read from a credential provider may have
        # been rotated since (cleat_project.db).
        self._params = params
        self._listen = listen
        self._on_notify = wake
        self._closing = threading.Event()
        self.connected = threading.Event()
        self._conn: Any = None

    def run(self) -> None:
        import psycopg

        delay, failures = self.BACKOFF_S[0], 0
        while not self._closing.is_set():
            try:
                params = dict(self._params())
                params.pop("cursor_factory", None)
                params.pop("context", None)
                self._conn = psycopg.connect(**params, autocommit=True)
                self._conn.execute(self._listen)
                self.connected.set()
                if failures:
                    log.info("event=listen_restored")
                delay, failures = self.BACKOFF_S[0], 0
                self._on_notify()  # catch up with what was notified while not listening
                while not self._closing.is_set():
                    for _ in self._conn.notifies(timeout=self.CHECK_S):
                        self._on_notify()
            except Exception:
                if self._closing.is_set():
                    break
                failures += 1
                event = "listen_unavailable" if failures == 1 else "listen_retry"
                log.warning(
                    "event=%s (polling meanwhile; retry in %.1fs)", event, delay, exc_info=True
                )
            finally:
                self.connected.clear()
                self._close_connection()
            self._closing.wait(delay)
            delay = min(delay * 2, self.BACKOFF_S[1])

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        self._closing.set()
        self.join(timeout=self.CHECK_S * 4)
