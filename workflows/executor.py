"""Runs one claimed segment: load, execute on the engine, finalize. Shared by the worker and
by anything else that executes runs (tests, the Celery dispatch mode)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.db import InterfaceError, OperationalError, connection

from engine.errors import ErrorCode, FenceLost, InvalidModule
from engine.lifecycle import outcome_kind
from engine.runtime import WasmRuntime
from engine.services import Services
from engine.session import RunInfo, SegmentResult, failed
from workflows.conf import cleat_settings
from workflows.store.lifecycle import (
    Claim,
    LoadedRun,
    finalize_segment,
    load_run,
    load_wasm,
    release,
)
from workflows.store.storage import DjangoStorage

log = logging.getLogger("cleat.worker")

HOST_FAILURE_BACKOFF_S = 5.0

_runtime: WasmRuntime | None = None
_services: Services | None = None
_lock = threading.Lock()


def get_runtime() -> WasmRuntime:
    """The process's wasmtime runtime (one engine, one epoch ticker, one module cache)."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = WasmRuntime(cleat_settings().engine)
        return _runtime


def get_services() -> Services:
    global _services
    with _lock:
        if _services is None:
            _services = cleat_settings().build_services()
        return _services


def set_services(services: Services | None) -> None:
    """Replace the services (tests, benchmarks)."""
    global _services
    with _lock:
        _services = services


@dataclass(frozen=True)
class SegmentReport:
    run_id: str
    outcome: str  # completed, failed, suspended, continued, fence_lost, gone
    status: str
    steps: int
    replayed: int
    elapsed_ms: float
    detail: str = ""


def execute_claim(
    claim: Claim, worker_id: str, clock: Callable[[], datetime] | None = None
) -> SegmentReport:
    """Run one claimed segment. ``clock`` replaces the wall clock (tests with virtual time)."""
    started = time.monotonic()
    loaded = _load(claim, worker_id)
    if loaded is None:
        return SegmentReport(str(claim.id), "gone", "", 0, 0, 0.0)
    runtime = get_runtime()
    module = runtime.modules.peek(loaded.sha256)
    if module is None:
        try:
            module = runtime.load(load_wasm(claim.tenant_id, loaded.definition_id), loaded.sha256)
        except InvalidModule as exc:
            # Stored bytes that do not load (a corrupted row) fail this run with a clear code,
            # instead of crashing the segment and leaving the run `running` until its lease
            # expires -- and then again after every reap.
            return _fail_unloadable(loaded, exc, clock, started)
    instance = loaded.instance
    run = RunInfo(
        ref=loaded.ref,
        definition=instance.definition_name,
        version=instance.definition_version,
        input=instance.input,
        start_ms=int(instance.created_at.timestamp() * 1000),
        entry_point=instance.entry_point,
        min_version=loaded.min_version,
        max_history_events=loaded.max_history_length or None,
    )
    storage = DjangoStorage(claim.tenant_id, clock)
    engine_clock = (lambda: int(clock().timestamp() * 1000)) if clock else None
    try:
        result = runtime.run_segment(
            module, run, loaded.history, storage, get_services(), engine_clock
        )
        finalized = finalize_segment(loaded.ref, result, clock() if clock else None)
    except FenceLost as exc:
        log.info("event=fence_lost run=%s detail=%s", claim.id, exc)
        return SegmentReport(str(claim.id), "fence_lost", "", 0, 0, _ms(started), str(exc))
    except Exception:
        log.exception("event=segment_error run=%s", claim.id)
        try:
            # Not at once: a failure around the segment (database, bug) would come straight
            # back and spin the worker.
            release(loaded.ref, delay_s=HOST_FAILURE_BACKOFF_S)
        except Exception:
            log.exception("event=release_error run=%s", claim.id)
        raise
    kind, detail = outcome_kind(result.outcome)
    return SegmentReport(
        str(claim.id),
        kind,
        finalized.status,
        len(result.recorded),
        result.replayed_steps,
        _ms(started),
        detail,
    )


def _load(claim: Claim, worker_id: str) -> LoadedRun | None:
    """:func:`load_run`, once more on a new connection when the thread's connection turns out
    to be dead (the worker skips the health check of one that answered a moment ago; the
    load only reads, so reading again is safe)."""
    try:
        return load_run(claim, worker_id)
    except (InterfaceError, OperationalError):
        if connection.in_atomic_block or connection.is_usable():
            raise
        log.warning("event=reconnect run=%s (the connection was dead)", claim.id)
        connection.close()
        return load_run(claim, worker_id)


def _fail_unloadable(
    loaded: LoadedRun,
    exc: InvalidModule,
    clock: Callable[[], datetime] | None,
    started: float,
) -> SegmentReport:
    outcome = failed(ErrorCode.INVALID_MODULE, f"the stored module cannot be loaded: {exc}")
    kind, detail = outcome_kind(outcome)
    result = SegmentResult(outcome, (), (), dict(loaded.instance.query_state or {}), 0, 0)
    try:
        finalized = finalize_segment(loaded.ref, result, clock() if clock else None)
    except FenceLost as lost:
        log.info("event=fence_lost run=%s detail=%s", loaded.claim.id, lost)
        return SegmentReport(str(loaded.claim.id), "fence_lost", "", 0, 0, _ms(started), str(lost))
    return SegmentReport(str(loaded.claim.id), kind, finalized.status, 0, 0, _ms(started), detail)


def _ms(started: float) -> float:
    return (time.monotonic() - started) * 1000
