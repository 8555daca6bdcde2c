"""Runs one claimed segment: load, execute on the engine, finalize. Shared by the worker and
by anything else that executes runs (tests, the Celery dispatch mode)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connection
from opentelemetry.trace import Span, Status, StatusCode

from engine.compaction import CompactionCorrupt
from engine.errors import ErrorCode, FenceLost, InvalidModule
from engine.lifecycle import outcome_kind
from engine.runtime import WasmRuntime
from engine.services import UNVERSIONED, Services
from engine.session import (
    Failed,
    RunInfo,
    SegmentResult,
    failed,
)
from engine.storage import RunRef
from engine.tracing import segment_span
from workflows import faults
from workflows.conf import cleat_settings
from workflows.crypto import EncryptionKeyMissing, unopened
from workflows.models import WorkflowInstance
from workflows.store.lifecycle import (
    Claim,
    Finalized,
    LoadedRun,
    finalize_segment,
    load_run,
    load_wasm,
    pinned_plugin_versions,
    release,
)
from workflows.store.storage import DjangoStorage
from workflows.tenancy import tenant_context

log = logging.getLogger("cleat.worker")

HOST_FAILURE_BACKOFF_S = 5.0

# The connection to the database broke (killed backend, failover, network) or the server
# gave up on the statement: the host's trouble, never the guest's. A run that meets one is
# released on a new connection -- not finalized as failed, so it costs no attempt -- and is
# due again after DATABASE_LOST_BACKOFF_S (not at once: a server that keeps refusing must not
# spin the worker). The release itself is retried on a new connection after each pause of
# RELEASE_RETRY_S; if the database stays away that long, the lease's expiry returns the run.
DATABASE_LOST = (InterfaceError, OperationalError)
DATABASE_LOST_BACKOFF_S = 1.0
RELEASE_RETRY_S = (0.0, 0.2, 0.5, 1.0, 2.0)

_runtime: WasmRuntime | None = None
_services: Services | None = None
_lock = threading.Lock()


def get_runtime() -> WasmRuntime:
    """The process's wasmtime runtime (one engine, one epoch ticker, one module cache)."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = WasmRuntime(cleat_settings().engine)
            from workflows import artifacts

            if artifacts.enabled():
                _runtime.modules.shared = artifacts.DatabaseArtifacts()
        return _runtime


def runtime_if_made() -> WasmRuntime | None:
    """The process's runtime if something already made it (metrics read it, never make it)."""
    return _runtime


def get_services() -> Services:
    global _services
    with _lock:
        if _services is None:
            _services = cleat_settings().build_services()
        return _services


def _plugin_versions(loaded: Any) -> dict[str, str]:
    """The plugin versions the run's definition pinned at deploy (read only when some
    configured plugin has versions to choose from)."""
    versions = get_services().plugins.versions().values()
    if all(list(v) == [UNVERSIONED] for v in versions):
        return {}
    return pinned_plugin_versions(loaded.claim.tenant_id, loaded.definition_id)


def set_services(services: Services | None) -> None:
    """Replace the services (tests, benchmarks)."""
    global _services
    with _lock:
        _services = services


@dataclass(frozen=True)
class SegmentReport:
    run_id: str
    # completed, failed, suspended, continued, fence_lost, gone; released, release_failed
    # (the database connection was lost: see DATABASE_LOST)
    outcome: str
    status: str
    steps: int
    replayed: int
    elapsed_ms: float
    detail: str = ""


def execute_claim(
    claim: Claim, worker_id: str, clock: Callable[[], datetime] | None = None
) -> SegmentReport:
    """Run one claimed segment. ``clock`` replaces the wall clock (tests with virtual time).

    A lost database connection anywhere in it (load, segment, finalize) releases the run on
    a new connection instead of raising (see DATABASE_LOST)."""
    started = time.monotonic()
    # A process on a skewed clock (the fault-injection tests) gives it to the engine too.
    clock = clock or faults.skewed_clock()
    try:
        return _execute_claim(claim, worker_id, clock, started)
    except DATABASE_LOST as exc:
        return _release_after_database_loss(claim, worker_id, exc, started)


def _execute_claim(
    claim: Claim, worker_id: str, clock: Callable[[], datetime] | None, started: float
) -> SegmentReport:
    try:
        loaded = _load(claim, worker_id)
    except EncryptionKeyMissing as exc:
        return _fail_key_missing(claim, worker_id, exc, clock, started)
    except CompactionCorrupt as exc:
        # A checkpoint that does not read back is a corrupt history like a bad checksum.
        log.error("event=history_corrupt run=%s detail=%s", claim.id, exc)
        outcome = failed(ErrorCode.HISTORY_CORRUPT, str(exc))
        return _fail_unloaded(claim, worker_id, outcome, clock, started)
    if loaded is None:
        return SegmentReport(str(claim.id), "gone", "", 0, 0, 0.0)
    missing = unopened(loaded.instance)
    if missing is not None:
        return _fail_key_missing(claim, worker_id, missing, clock, started)
    runtime = get_runtime()
    try:
        # The bytes are read only when the module is not in memory, by one thread at a time.
        module = runtime.load_once(
            loaded.sha256, lambda: load_wasm(claim.tenant_id, loaded.definition_id)
        )
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
        start_ms=instance.start_ms,
        entry_point=instance.entry_point,
        min_version=loaded.min_version,
        max_history_events=loaded.max_history_length or None,
        plugin_versions=_plugin_versions(loaded),
    )
    storage = _WatchedStorage(DjangoStorage(claim.tenant_id, clock, loaded.interrupts))
    engine_clock = (lambda: int(clock().timestamp() * 1000)) if clock else None
    services = get_services()
    tracer = services.tracer
    span_scope: contextlib.AbstractContextManager[Span | None] = contextlib.nullcontext()
    if tracer is not None:
        if instance.trace_parent:
            span_scope = segment_span(tracer, instance.trace_parent, _segment_attributes(loaded))
        else:  # started while tracing was off: its calls make no orphan spans either
            services = _untraced(services)
    try:
        with span_scope as span:
            try:
                result = runtime.run_segment(
                    module, run, loaded.history, storage, services, engine_clock
                )
                if storage.lost is not None and _host_failure(result):
                    # The engine reports a storage exception as the run's `internal` failure;
                    # when it was the connection, the run is released instead (no attempt
                    # spent).
                    raise storage.lost
                if storage.key_missing is not None and _host_failure(result):
                    # A payload the segment read (a signal, a state value...) does not open:
                    # the run fails with its own code, not as a retryable host failure.
                    result = dataclasses.replace(
                        result, outcome=_key_missing_outcome(storage.key_missing)
                    )
                if span is not None:
                    _describe_segment(span, result)
                finalized = _finalize(loaded.ref, result, clock() if clock else None)
            except FenceLost:
                if span is not None:  # another worker owns the run: this work is dropped
                    span.set_attribute("cleat.outcome", "fence_lost")
                raise
    except FenceLost as exc:
        log.info("event=fence_lost run=%s detail=%s", claim.id, exc)
        return SegmentReport(str(claim.id), "fence_lost", "", 0, 0, _ms(started), str(exc))
    except DATABASE_LOST:
        raise  # released on a new connection by execute_claim
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


def _segment_attributes(loaded: LoadedRun) -> dict[str, Any]:
    instance = loaded.instance
    return {
        "cleat.tenant": str(instance.tenant_id),
        "cleat.workflow_id": instance.workflow_id,
        "cleat.run_id": str(instance.id),
        "cleat.definition": instance.definition_name,
        "cleat.version": instance.definition_version,
        "cleat.attempt": instance.attempt,
        "cleat.generation": loaded.claim.generation,
    }


def _describe_segment(span: Span, result: SegmentResult) -> None:
    kind, detail = outcome_kind(result.outcome)
    span.set_attribute("cleat.outcome", kind)
    span.set_attribute("cleat.recorded_steps", len(result.recorded))
    span.set_attribute("cleat.replayed_steps", result.replayed_steps)
    if isinstance(result.outcome, Failed):
        span.set_attribute("cleat.error_code", result.outcome.code.value)
        span.set_status(Status(StatusCode.ERROR, detail[:200]))


_untraced_services: tuple[Services, Services] | None = None


def _untraced(services: Services) -> Services:
    """``services`` without the tracer (made once per services object)."""
    global _untraced_services
    cached = _untraced_services
    if cached is None or cached[0] is not services:
        cached = _untraced_services = (services, dataclasses.replace(services, tracer=None))
    return cached[1]


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


class _WatchedStorage:
    """The run's storage, remembering a lost connection that passed through it (the engine
    turns any storage exception into an ``internal`` failure and keeps no trace of it)."""

    def __init__(self, storage: DjangoStorage) -> None:
        self._storage = storage
        self.lost: DatabaseError | None = None
        self.key_missing: EncryptionKeyMissing | None = None

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._storage, name)
        if not callable(found):
            return found

        def watched(*args: Any, **kwargs: Any) -> Any:
            try:
                return found(*args, **kwargs)
            except DATABASE_LOST as exc:
                self.lost = exc
                raise
            except EncryptionKeyMissing as exc:
                self.key_missing = exc
                raise

        return watched


def _host_failure(result: SegmentResult) -> bool:
    outcome = result.outcome
    return isinstance(outcome, Failed) and outcome.code is ErrorCode.INTERNAL


def _release_after_database_loss(
    claim: Claim, worker_id: str, exc: DatabaseError, started: float
) -> SegmentReport:
    """Give the run back on a new connection (the thread's one is dead), retried a few
    times; the run keeps its attempt count."""
    log.warning("event=database_lost run=%s detail=%r (releasing the run)", claim.id, str(exc))
    ref = claim.ref(worker_id)
    detail = f"database connection lost: {exc}"[:300]
    for pause in RELEASE_RETRY_S:
        time.sleep(pause)
        _drop_connection()
        try:
            released = release(ref, delay_s=DATABASE_LOST_BACKOFF_S)
        except DATABASE_LOST as again:
            log.warning("event=release_retry run=%s detail=%r", claim.id, str(again))
            continue
        if not released:  # reaped or closed meanwhile: someone else's now
            return SegmentReport(str(claim.id), "fence_lost", "", 0, 0, _ms(started), detail)
        return SegmentReport(str(claim.id), "released", "ready", 0, 0, _ms(started), detail)
    log.error("event=release_error run=%s (database still away; its lease returns it)", claim.id)
    _drop_connection()
    return SegmentReport(str(claim.id), "release_failed", "", 0, 0, _ms(started), detail)


def _drop_connection() -> None:
    """Close this thread's connection so the next query opens a new one (outside a
    transaction only: inside one, Django must unwind it first)."""
    if not connection.in_atomic_block:
        with contextlib.suppress(DatabaseError):
            connection.close()


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
        finalized = _finalize(loaded.ref, result, clock() if clock else None)
    except FenceLost as lost:
        log.info("event=fence_lost run=%s detail=%s", loaded.claim.id, lost)
        return SegmentReport(str(loaded.claim.id), "fence_lost", "", 0, 0, _ms(started), str(lost))
    return SegmentReport(str(loaded.claim.id), kind, finalized.status, 0, 0, _ms(started), detail)


def _key_missing_outcome(exc: EncryptionKeyMissing) -> Failed:
    return failed(ErrorCode.ENCRYPTION_KEY_MISSING, exc.message)


def _fail_key_missing(
    claim: Claim,
    worker_id: str,
    exc: EncryptionKeyMissing,
    clock: Callable[[], datetime] | None,
    started: float,
) -> SegmentReport:
    """Fail a run one of whose stored payloads does not open (its key is not configured,
    or is not the key it was sealed with): ``encryption_key_missing``, naming the key id.
    The run keeps what it stored (an operator who restores the key can retry it)."""
    log.error("event=encryption_key_missing run=%s key=%s", claim.id, exc.key_id)
    return _fail_unloaded(claim, worker_id, _key_missing_outcome(exc), clock, started)


def _fail_unloaded(
    claim: Claim,
    worker_id: str,
    outcome: Failed,
    clock: Callable[[], datetime] | None,
    started: float,
) -> SegmentReport:
    """Fail a claimed run whose load failed with ``outcome``."""
    ref = claim.ref(worker_id)
    with tenant_context(claim.tenant_id):
        # As stored: opened, or kept sealed (the finalize writes it back unchanged).
        query_state = (
            WorkflowInstance.objects.filter(id=claim.id).only("id", "tenant_id", "query_state")
        ).first()
    state = query_state.query_state if query_state is not None else {}
    result = SegmentResult(outcome, (), (), state, 0, 0)
    kind, detail = outcome_kind(outcome)
    try:
        finalized = _finalize(ref, result, clock() if clock else None)
    except FenceLost as lost:
        log.info("event=fence_lost run=%s detail=%s", claim.id, lost)
        return SegmentReport(str(claim.id), "fence_lost", "", 0, 0, _ms(started), str(lost))
    return SegmentReport(str(claim.id), kind, finalized.status, 0, 0, _ms(started), detail)


# A deadlock victim's transaction is rolled back whole (InnoDB 1213, PostgreSQL 40P01), so the
# fenced finalize, whose inputs are all in memory, can simply run again. On MariaDB a
# finalize's row update and the heartbeat's UPDATE of the worker's rows (or a claim's locking
# read) can deadlock under REPEATABLE READ's next-key locks; without this the run was released
# and its segment made again.
FINALIZE_DEADLOCK_RETRIES = 3


def _finalize(ref: RunRef, result: SegmentResult, now: datetime | None) -> Finalized:
    for attempt in range(FINALIZE_DEADLOCK_RETRIES + 1):
        try:
            return finalize_segment(ref, result, now)
        except OperationalError as exc:
            if (
                not is_deadlock(exc)
                or connection.in_atomic_block
                or attempt == FINALIZE_DEADLOCK_RETRIES
            ):
                raise
            log.warning("event=finalize_deadlock run=%s attempt=%d", ref.run_id, attempt + 1)
            time.sleep(0.02 * (attempt + 1))
    raise AssertionError("unreachable")  # the loop returns or raises


def is_deadlock(exc: BaseException) -> bool:
    """True for a deadlock the database resolved by rolling this transaction back."""
    if exc.args and exc.args[0] == 1213:  # MySQL / MariaDB: ER_LOCK_DEADLOCK
        return True
    return getattr(exc.__cause__, "sqlstate", None) == "40P01"  # PostgreSQL


def _ms(started: float) -> float:
    return (time.monotonic() - started) * 1000
