"""The dispatch worker: claims due runs in batches, executes their segments on a thread pool,
keeps their leases alive, reaps the leases of workers that died, and sleeps until the next
due instant or a PostgreSQL NOTIFY.

The worker owns only the loop. A bad row, a failing workflow or a database blip is logged
and the loop goes on; SIGTERM stops claiming, lets running segments finish (each is bounded
by the segment deadline) and exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import close_old_connections, connection
from django.utils import timezone
from prometheus_client import Counter, Gauge, Histogram

from workflows.executor import SegmentReport, execute_claim, get_services
from workflows.store import invocations, wake
from workflows.store.lifecycle import (
    Claim,
    claim_ready_instances,
    heartbeat_worker,
    next_due_at,
    reap_expired_leases,
)

log = logging.getLogger("cleat.worker")

SEGMENTS = Counter("cleat_segments_total", "Execution segments run", ["outcome"])
STEPS = Counter("cleat_steps_total", "Durable steps recorded")
SEGMENT_SECONDS = Histogram("cleat_segment_seconds", "Wall time of one segment")
CLAIMED = Counter("cleat_claimed_total", "Runs claimed")
REAPED = Counter("cleat_reaped_total", "Expired leases reaped")
LOOP_ERRORS = Counter("cleat_worker_loop_errors_total", "Errors caught by the worker loop")
INFLIGHT = Gauge("cleat_worker_inflight", "Segments running now")


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


class Worker:
    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self._stop = threading.Event()
        self._inflight: dict[Future[SegmentReport], Claim] = {}
        self.processed = 0
        self._listener: _PgListener | None = None
        self._next_invocation_check = 0.0
        # Cron schedules tick from this loop (CLEAT_SCHEDULER_IN_WORKER; see schedules/).
        from schedules.scheduler import ScheduleTicker, scheduler_in_worker

        self._schedules = (
            ScheduleTicker(options.tenant, options.poll_interval_s)
            if scheduler_in_worker()
            else None
        )

    def stop(self, *_: Any) -> None:
        if not self._stop.is_set():
            log.info(
                "event=worker_stopping worker=%s inflight=%d",
                self.options.worker_id,
                len(self._inflight),
            )
        self._stop.set()
        if self._listener is not None:
            self._listener.interrupt()

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
        if connection.vendor == "postgresql" and not opts.burst:
            self._listener = _PgListener.open()
        pool = ThreadPoolExecutor(max_workers=opts.concurrency, thread_name_prefix="cleat-segment")
        lease = timedelta(seconds=opts.lease_s)
        last_beat = last_reap = 0.0
        errors = 0
        try:
            while not self._stop.is_set():
                try:
                    close_old_connections()
                    if self._schedules is not None:  # before `now`: the claim takes what fired
                        self._schedules.run_due(timezone.now())
                    now = timezone.now()
                    tick = time.monotonic()
                    if self._inflight and tick - last_beat >= opts.lease_s / 3:
                        heartbeat_worker(opts.worker_id, now)
                        last_beat = tick
                    if tick - last_reap >= opts.lease_s / 2:
                        reaped = reap_expired_leases(lease, now)
                        if reaped:
                            REAPED.inc(reaped)
                            log.info("event=reaped count=%d", reaped)
                        last_reap = tick
                    free = opts.concurrency - len(self._inflight)
                    if opts.max_segments is not None:
                        free = min(free, opts.max_segments - self.processed - len(self._inflight))
                    # Burst ends only when a claim found nothing due with nothing in flight:
                    # an empty claim for lack of capacity, or while running segments could
                    # still make runs due, is no reason to stop.
                    idle = not self._inflight
                    claims = claim_ready_instances(
                        opts.worker_id, opts.task_queues, free, now, opts.tenant
                    )
                    CLAIMED.inc(len(claims))
                    for claim in claims:
                        self._inflight[pool.submit(self._execute, claim)] = claim
                    INFLIGHT.set(len(self._inflight))
                    self._collect(block=False)
                    errors = 0
                    self._deliver_invocations(now)
                    if opts.max_segments is not None and self.processed >= opts.max_segments:
                        break
                    if opts.burst and idle and not claims and not self._inflight:
                        break
                    if not claims:
                        self._idle(now)
                except Exception:
                    errors += 1
                    LOOP_ERRORS.inc()
                    log.exception("event=worker_loop_error worker=%s", opts.worker_id)
                    self._stop.wait(min(30.0, 0.5 * 2 ** min(errors, 6)))
        finally:
            # Stop claiming; let segments in flight finish (each is bounded by its deadline).
            self._collect(block=True)
            pool.shutdown(wait=True)
            if self._listener is not None:
                self._listener.close()
            close_old_connections()
            log.info("event=worker_stopped worker=%s processed=%d", opts.worker_id, self.processed)
        return self.processed

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

    def _execute(self, claim: Claim) -> SegmentReport:
        close_old_connections()
        try:
            with SEGMENT_SECONDS.time():
                report = execute_claim(claim, self.options.worker_id)
        finally:
            close_old_connections()
        return report

    def _collect(self, block: bool) -> None:
        if not self._inflight:
            return
        done, _ = wait(
            list(self._inflight),
            timeout=None if block else 0,
            return_when=ALL_COMPLETED if block else FIRST_COMPLETED,
        )
        for future in done:
            claim = self._inflight.pop(future)
            self.processed += 1
            try:
                report = future.result()
            except Exception:
                SEGMENTS.labels("error").inc()
                log.exception("event=segment_crashed run=%s", claim.id)
                continue
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
        INFLIGHT.set(len(self._inflight))

    def _idle(self, now: Any) -> None:
        """Sleep until a segment finishes, the next run is due, a NOTIFY arrives, or the poll
        interval passes -- whichever comes first."""
        timeout = self.options.poll_interval_s
        if not self.options.burst:
            due = next_due_at(self.options.task_queues, self.options.tenant)
            if due is not None:
                timeout = max(0.0, min(timeout, (due - now).total_seconds()))
        if self.options.burst:
            timeout = min(timeout, 0.05)
        if self._schedules is not None:  # wake for the next schedule instant too
            timeout = min(timeout, self._schedules.seconds_until_due(now))
        if self._inflight:
            done, _ = wait(list(self._inflight), timeout=timeout, return_when=FIRST_COMPLETED)
            if done:
                return
        elif self._listener is not None:
            self._listener.wait(timeout)
        elif timeout > 0:
            self._stop.wait(timeout)


class _PgListener:
    """A dedicated autocommit connection LISTENing for ``cleat_wake``."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._interrupted = threading.Event()

    @classmethod
    def open(cls) -> _PgListener | None:
        import psycopg

        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        try:
            conn = psycopg.connect(**params, autocommit=True)
            conn.execute(f"LISTEN {wake.NOTIFY_CHANNEL}")
        except Exception:
            log.warning("event=listen_unavailable (falling back to polling)", exc_info=True)
            return None
        return cls(conn)

    def wait(self, timeout: float) -> None:
        if timeout <= 0 or self._interrupted.is_set():
            return
        try:
            for _ in self._conn.notifies(timeout=timeout, stop_after=1):
                pass
        except Exception:
            log.warning("event=listen_failed", exc_info=True)
            time.sleep(min(timeout, 1.0))

    def interrupt(self) -> None:
        self._interrupted.set()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()
