"""The workflow context: every host operation as a Python method with JSON values.

Each method is one host call, recorded by the host on first execution and answered from
the history on replay. Values are JSON: requests, results, signal payloads, state values
and inputs are ``json.dumps``-ed on the way out and ``json.loads``-ed on the way back.
Non-OK statuses become exceptions (``_errors``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, NoReturn, TypeVar

from cleat_workflow import _calls, _host, _registry
from cleat_workflow._calls import Call
from cleat_workflow._errors import (
    CANCELLED,
    ERROR,
    NOT_FOUND,
    OK,
    STATUS_LABELS,
    Cancelled,
    LockHeld,
    WorkflowError,
    error_for,
    status_for_label,
)

T = TypeVar("T")
Duration = float | int | timedelta

LOG_LEVELS = {"debug": 0, "info": 1, "warning": 2, "error": 3}


def _ms(duration: Duration | None, *, default: int = -1) -> int:
    """Seconds (or a timedelta) as whole milliseconds; None -> ``default``."""
    if duration is None:
        return default
    seconds = duration.total_seconds() if isinstance(duration, timedelta) else float(duration)
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative ({seconds} s)")
    return round(seconds * 1000)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _loads(text: str) -> Any:
    if text == "":
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _packed(fn: Callable[..., str], *args: Any) -> str:
    """Call a host operation answering ``result<string, call-error>``: the payload, or the
    SDK exception for its status."""
    try:
        return fn(*args)
    except _host.Err as err:
        value = err.value
        raise error_for(int(value.status), str(value.message)) from None


def _packed_or(fn: Callable[..., str], *args: Any, missing: int = NOT_FOUND) -> str | None:
    """Like :func:`_packed`, with ``missing`` (NOT_FOUND by default) answered as None."""
    try:
        return fn(*args)
    except _host.Err as err:
        value = err.value
        if int(value.status) == missing:
            return None
        raise error_for(int(value.status), str(value.message)) from None


@dataclass(frozen=True)
class Signal:
    """A signal the workflow received. ``correlation_id`` is set when its sender waits for
    an answer (``ctx.signal_and_wait``): pass it to ``ctx.reply_to_signal``."""

    name: str
    payload: Any
    correlation_id: str = ""


@dataclass(frozen=True)
class ChildResult:
    """How a child workflow ended. ``status`` is a label: "ok", "error", "permanent", ..."""

    run_id: str
    status: str
    result: Any = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def value(self) -> Any:
        """The child's result, or the SDK exception for how it failed."""
        if self.ok:
            return self.result
        raise error_for(status_for_label(self.status), self.error)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChildResult:
        return cls(
            run_id=str(data.get("run_id", "")),
            status=str(data.get("status", "error")),
            result=data.get("result"),
            error=str(data.get("error", "")),
        )


@dataclass(frozen=True)
class Response:
    """The answer of ``ctx.fetch``."""

    status: int
    headers: dict[str, str]
    body: str

    def json(self) -> Any:
        return json.loads(self.body)


class Logger:
    """``ctx.log``: durable log lines, written once (not again on replay)."""

    def _write(self, level: str, message: str, args: tuple[Any, ...]) -> None:
        text = message % args if args else message
        _host.host.durable_log(LOG_LEVELS[level], text)

    def debug(self, message: str, *args: Any) -> None:
        self._write("debug", message, args)

    def info(self, message: str, *args: Any) -> None:
        self._write("info", message, args)

    def warning(self, message: str, *args: Any) -> None:
        self._write("warning", message, args)

    def error(self, message: str, *args: Any) -> None:
        self._write("error", message, args)


class State(MutableMapping[str, Any]):
    """``ctx.state``: the workflow's durable key-value state (JSON values).

    Reads and writes are host calls: recorded, replayed, and visible through the API.
    ``set_scope`` points it at a virtual object's state shared across workflows.
    """

    def __getitem__(self, key: str) -> Any:
        text = _packed_or(_host.host.get_state, key)
        if text is None:
            raise KeyError(key)
        return _loads(text)

    def __setitem__(self, key: str, value: Any) -> None:
        _host.host.set_state(key, _dumps(value))

    def __delitem__(self, key: str) -> None:
        if not _host.host.delete_state(key):
            raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and bool(_host.host.has_state(key))

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys_with_prefix(""))

    def __len__(self) -> int:
        return len(self.keys_with_prefix(""))

    def get(self, key: str, default: Any = None) -> Any:
        text = _packed_or(_host.host.get_state, key)
        return default if text is None else _loads(text)

    def pop(self, key: str, *default: Any) -> Any:
        text = _packed_or(_host.host.get_state, key)
        if text is None:
            if default:
                return default[0]
            raise KeyError(key)
        _host.host.delete_state(key)
        return _loads(text)

    def incr(self, key: str, delta: int = 1) -> int:
        """Add ``delta`` to an integer value (0 when absent) and return the new value."""
        return int(_host.host.incr_state(key, int(delta)))

    def keys_with_prefix(self, prefix: str) -> list[str]:
        """The keys starting with ``prefix``, sorted."""
        keys: list[str] = json.loads(_packed(_host.host.list_state, prefix))
        return keys


class Lock:
    """``with ctx.lock(key, ttl):`` holds a lock shared by every workflow of the tenant."""

    def __init__(self, key: str, ttl_ms: int) -> None:
        self.key = key
        self.ttl_ms = ttl_ms
        self.held = False

    def acquire(self) -> bool:
        self.held = bool(_host.host.acquire_lock(self.key, self.ttl_ms))
        return self.held

    def release(self) -> None:
        if self.held:
            _host.host.release_lock(self.key)
            self.held = False

    def __enter__(self) -> Lock:
        if not self.held and not self.acquire():
            raise LockHeld(f"lock {self.key!r} is held by another workflow")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class Promise:
    """A durable promise: resolved or rejected from outside (API) or by another workflow."""

    def __init__(self, context: Context, promise_id: str, name: str = "") -> None:
        self._context = context
        self.id = promise_id
        self.name = name

    def wait(self, timeout: Duration | None = None) -> Any:
        """The value; raises CallFailed with the rejection message, or Timeout."""
        self._context._before_blocking()
        return _loads(_packed(_host.host.await_promise, self.id, _ms(timeout)))

    def resolve(self, value: Any = None) -> None:
        _packed(_host.host.resolve_promise, self.id, _dumps(value))

    def reject(self, message: str) -> None:
        _packed(_host.host.reject_promise, self.id, message)


class Context:
    """What a workflow function receives: ``def order(ctx: Context, input): ...``."""

    def __init__(self, entry: str, input: Any = None) -> None:
        self.entry = entry
        self.input = input
        self.state = State()
        self.log = Logger()
        self._in_update = False

    # --- identity, time, randomness -------------------------------------------------------

    @property
    def workflow_id(self) -> str:
        return _packed(_host.host.workflow_id)

    @property
    def run_id(self) -> str:
        return _packed(_host.host.run_id)

    @property
    def version(self) -> int:
        """The definition version this run executes."""
        return int(_host.host.version())

    @property
    def min_version(self) -> int:
        return int(_host.host.min_version())

    def now(self) -> datetime:
        """The workflow's virtual time (UTC). ``datetime.now()`` and ``time.time()`` agree
        with it: the host serves the run's clock to WASI as well."""
        return datetime.fromtimestamp(self.now_ms() / 1000, UTC)

    def now_ms(self) -> int:
        return int(_host.host.now())

    def random(self) -> int:
        """A random signed 64-bit integer from the run's replay-safe stream."""
        return int(_host.host.random())

    def uuid(self, seed: str = "") -> str:
        """A UUID, the same on every replay of this step."""
        return _packed(_host.host.uuid, seed)

    def side_effect(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (JSON-serialisable result) and record its value; a replay returns the
        recorded value (``fn`` runs again, but its new value is discarded)."""
        value: T = _loads(_packed(_host.host.side_effect, _dumps(fn())))
        return value

    # --- calls ------------------------------------------------------------------------------

    def call(self, service: str, operation: str, request: Any = None) -> Any:
        """Call ``service.operation`` once; the response JSON, or CallFailed /
        PermanentError / Ambiguous."""
        return _loads(_packed(_host.host.durable_call, service, operation, _dumps(request)))

    def gather(self, *calls: Call, return_exceptions: bool = False) -> list[Any]:
        """Make several durable calls as one group and return their results in order::

            quote, stock = ctx.gather(
                Call("pricing", "quote", {"sku": sku}),
                Call("inventory", "check", {"sku": sku}, retry=Retry(max_attempts=5)),
            )

        Every call's first attempt is made before any failure is raised: together, through
        the host's ``durable_call_many`` (an optional extension of ABI v1), so their network
        times overlap. Calls with a ``retry`` that fail wait for their backoffs together (one
        durable timer to the earliest), then are tried again together. The first failure is
        raised once every call has finished, unless ``return_exceptions`` returns each
        failure in its place. Each attempt is one recorded step, in the given order, so a
        replay makes the same steps in the same order. See ``_calls``."""
        return _calls.gather(self, calls, return_exceptions=return_exceptions)

    def call_with_retry(
        self,
        service: str,
        operation: str,
        request: Any = None,
        *,
        max_attempts: int = 3,
        initial_interval: Duration = 1.0,
        backoff: float = 2.0,
        max_interval: Duration = 60.0,
        non_retryable: Iterable[str] = (),
    ) -> Any:
        """Call with durable retries (the waits between attempts are durable timers); raises
        RetriesExhausted with the last error, or PermanentError at once."""
        self._before_blocking()
        return _loads(
            _packed(
                _host.host.durable_call_with_retry,
                service,
                operation,
                _dumps(request),
                int(max_attempts),
                _ms(initial_interval),
                round(backoff * 100),
                _ms(max_interval),
                _dumps(list(non_retryable)),
            )
        )

    def call_with_heartbeat(
        self, service: str, operation: str, request: Any = None, *, heartbeat: Duration = 10.0
    ) -> Any:
        """A long call during which the host keeps the run's lease alive."""
        return _loads(
            _packed(
                _host.host.durable_call_with_heartbeat,
                service,
                operation,
                _dumps(request),
                _ms(heartbeat),
            )
        )

    def send(self, service: str, operation: str, request: Any = None) -> None:
        """Fire and forget, delivered at least once."""
        _packed(_host.host.durable_send, service, operation, _dumps(request))

    def schedule_invoke(
        self, service: str, operation: str, request: Any = None, *, delay: Duration
    ) -> str:
        """Call ``service.operation`` after ``delay``, even if the workflow has ended."""
        return _packed(
            _host.host.durable_schedule_invoke, service, operation, _dumps(request), _ms(delay)
        )

    def fetch(
        self,
        url: str,
        *,
        method: str = "GET",
        headers: dict[str, str] | None = None,
        body: str = "",
    ) -> Response:
        """An HTTP request through the host's allow-list (Denied for a refused URL)."""
        data = json.loads(_packed(_host.host.fetch, method, url, _dumps(headers or {}), body))
        return Response(int(data["status"]), dict(data.get("headers", {})), str(data["body"]))

    def plugin(self, plugin: str, function: str, input: Any = None) -> Any:
        return _loads(_packed(_host.host.plugin_call, plugin, function, _dumps(input)))

    def plugin_stream(self, plugin: str, function: str, input: Any = None) -> list[Any]:
        """A streaming plugin call (``plugin_call_streaming``): the chunks, in order, each
        recorded as it arrived, so a replay answers the same list without calling again."""
        chunks = _loads(_packed(_host.host.plugin_call_streaming, plugin, function, _dumps(input)))
        return list(chunks or [])

    # --- timers, signals ------------------------------------------------------------------

    def sleep(self, duration: Duration) -> None:
        """A durable timer: the run is unloaded and resumes, on any worker, when it fires.
        Raises Cancelled if the run is cancelled meanwhile."""
        self._before_blocking()
        if int(_host.host.durable_sleep(_ms(duration))) == CANCELLED:
            raise Cancelled("the workflow was cancelled while it slept")

    def wait_for_signal(self, *names: str, timeout: Duration | None = None) -> Signal:
        """The first signal named one of ``names``; raises Timeout or Cancelled."""
        if not names:
            raise ValueError("wait_for_signal needs at least one signal name")
        self._before_blocking()
        data = json.loads(
            _packed(_host.host.durable_await_signals, _dumps(list(names)), _ms(timeout))
        )
        return Signal(str(data["name"]), data.get("payload"), str(data.get("correlation_id", "")))

    def poll_signal(self, name: str) -> Signal | None:
        """A signal ``name`` if one has arrived, else None (never waits)."""
        text = _packed_or(_host.host.poll_signal, name)
        return None if text is None else Signal(name, _loads(text))

    def signal(self, target_id: str, name: str, payload: Any = None) -> None:
        """Signal another workflow (NotFound, Denied)."""
        _packed(_host.host.signal_workflow, target_id, name, _dumps(payload))

    def signal_and_wait(
        self, target_id: str, name: str, payload: Any = None, *, timeout: Duration | None = None
    ) -> Any:
        """Signal another workflow and wait for its ``reply_to_signal``; raises Timeout."""
        self._before_blocking()
        return _loads(
            _packed(_host.host.send_signal_and_wait, target_id, name, _dumps(payload), _ms(timeout))
        )

    def reply_to_signal(self, correlation_id: str, response: Any = None) -> None:
        _packed(_host.host.reply_to_signal, correlation_id, _dumps(response))

    def cancellation_requested(self) -> str | None:
        """The reason if cancellation was requested, else None."""
        return _packed_or(_host.host.poll_cancellation)

    # --- promises, updates, queries ---------------------------------------------------------

    def promise(self, name: str = "") -> Promise:
        return Promise(self, _packed(_host.host.create_promise, name), name)

    def on_update(self, handler: Callable[[Context, Any], Any] | str) -> None:
        """Accept updates named after ``handler`` (an ``@handler`` function or its name).
        Updates are applied when the workflow next blocks (sleep, signal, child, ...)."""
        name = _handler_name(handler)
        _host.host.register_update_handler(name)

    def set_query(self, key: str, value: Any) -> None:
        """Publish ``value`` (JSON) under ``key``: readable through the API while the run
        goes on and after it ends."""
        _host.host.set_query_state(key, _dumps(value))

    # --- children, continue-as-new, defers ----------------------------------------------------

    def child(
        self,
        name: str,
        input: Any = None,
        *,
        version: int = 0,
        priority: int = 0,
        parent_close_policy: str = "",
    ) -> str:
        """Start a child workflow; returns its run id (await it with ``await_child``)."""
        return _packed(
            _host.host.child_workflow_with_options,
            name,
            _dumps(input),
            int(version),
            int(priority),
            parent_close_policy,
        )

    def await_child(self, run_id: str) -> Any:
        """The child's result, or the SDK exception for how it failed."""
        self._before_blocking()
        return _loads(_packed(_host.host.await_child, run_id))

    def gather_children(self, run_ids: Iterable[str]) -> list[ChildResult]:
        """Wait for every child; their outcomes in the given order."""
        self._before_blocking()
        data = json.loads(_packed(_host.host.await_all_children, _dumps(list(run_ids))))
        return [ChildResult.from_json(entry) for entry in data]

    def await_any_child(self, run_ids: Iterable[str]) -> ChildResult:
        """The first of the children to finish."""
        self._before_blocking()
        return ChildResult.from_json(
            json.loads(_packed(_host.host.await_any_child, _dumps(list(run_ids))))
        )

    def poll_child(self, run_id: str) -> ChildResult | None:
        """The child's outcome if it has finished, else None (never waits)."""
        try:
            text = _host.host.poll_child(run_id)
        except _host.Err as err:
            value = err.value
            if int(value.status) == NOT_FOUND:
                return None
            label = STATUS_LABELS.get(int(value.status), "error")
            return ChildResult(run_id, label, None, str(value.message))
        return ChildResult(run_id, "ok", _loads(text))

    def run_detached(self, name: str, input: Any = None) -> str:
        """Start an independent workflow (no parent link); returns its run id."""
        return _packed(_host.host.run_detached, name, _dumps(input))

    def continue_as_new(self, input: Any = None, *, version: int | None = None) -> NoReturn:
        """End this run and start a new one of the same workflow with ``input``, atomically.
        Never returns."""
        if version is None:
            _host.host.continue_as_new(_dumps(input))
        else:
            _host.host.continue_as_new_with_version(_dumps(input), int(version))
        raise RuntimeError("continue_as_new returned")  # the host never lets it

    def defer(self, handler: Callable[[Context, Any], Any] | str) -> str:
        """Run ``handler`` (an ``@handler`` function) when the workflow ends, whatever the
        outcome; defers run last-in first-out with ``{"defer_id","status","result"|"error"}``.
        Returns the defer id."""
        return _packed(_host.host.durable_defer, _handler_name(handler))

    # --- state, scopes, locks, schedules ----------------------------------------------------

    def set_scope(self, object_type: str, instance_key: str) -> dict[str, str]:
        """Address the state of the virtual object ``object_type/instance_key`` from now on
        (shared across workflows); returns the previous scope."""
        scope: dict[str, str] = json.loads(_packed(_host.host.set_scope, object_type, instance_key))
        return scope

    def scope(self) -> dict[str, str]:
        scope: dict[str, str] = json.loads(_packed(_host.host.get_scope))
        return scope

    def lock(self, key: str, ttl: Duration) -> Lock:
        """A lock for ``with``: raises LockHeld if another workflow holds ``key``."""
        return Lock(key, _ms(ttl))

    def try_lock(self, key: str, ttl: Duration) -> bool:
        return bool(_host.host.acquire_lock(key, _ms(ttl)))

    def release_lock(self, key: str) -> None:
        _host.host.release_lock(key)

    def schedule_cron(
        self, workflow: str, cron: str, *, timezone: str = "UTC", input: Any = None
    ) -> str:
        """Start ``workflow`` on a cron schedule; returns the schedule id. PermanentError for
        an invalid expression or zone, Denied over the tenant's quota."""
        return _packed(_host.host.schedule_cron, workflow, cron, timezone, _dumps(input))

    def delete_cron(self, schedule_id: str) -> None:
        _packed(_host.host.delete_cron, schedule_id)

    def list_crons(self) -> list[dict[str, Any]]:
        crons: list[dict[str, Any]] = json.loads(_packed(_host.host.list_crons))
        return crons

    # --- updates --------------------------------------------------------------------------

    def _before_blocking(self) -> None:
        """Apply the updates due at this point (see ``updates`` in the WIT file): the host
        cannot call into the guest while it is inside a host call, so the guest asks."""
        if self._in_update:
            return
        while True:
            request = _host.updates.take()
            if request is None:
                return
            status, payload = OK, ""
            fn = _registry.handlers.get(request.name)
            self._in_update = True
            try:
                if fn is None:
                    raise error_for(NOT_FOUND, f"no update handler named {request.name!r}")
                payload = _dumps(fn(self, _loads(request.payload)))
            except WorkflowError as exc:
                status, payload = exc.status, exc.message
            except Exception as exc:
                status, payload = ERROR, f"{type(exc).__name__}: {exc}"
            finally:
                self._in_update = False
            _host.updates.complete(request.update_id, status, payload)


def _handler_name(handler: Callable[..., Any] | str) -> str:
    if isinstance(handler, str):
        return handler
    name = getattr(handler, "__cleat_handler__", None)
    if not isinstance(name, str):
        raise TypeError(
            f"{getattr(handler, '__name__', handler)!r} is not registered: decorate it with "
            "@cleat_workflow.handler"
        )
    return name


__all__ = [
    "ChildResult",
    "Context",
    "Lock",
    "Logger",
    "Promise",
    "Response",
    "Signal",
    "State",
]
