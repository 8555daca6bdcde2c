"""Several durable calls from one workflow at once: ``ctx.gather(Call(...), Call(...))``.

Design note
-----------
ABI v1 (fixed) has no call that starts without answering: ``durable_call`` returns its
response within the host call. The host offers an optional extension for this,
``durable_call_many`` (the ``batch`` interface of the ``workflow-batch`` world, see
docs/abi.md): it makes a list of calls concurrently and records one call event per call, in
the order given, the same events the calls made one by one would record. A gather is built
on it and on ``durable_sleep``:

* every call's first attempt is made in one batch, in the order the calls are given, one
  recorded step each, whatever the others answer -- a failing call does not keep the next
  one from being made, and nothing depends on timing, so a replay makes the same steps in
  the same order (and answers them from the history without calling anything);
* the calls whose attempt failed retryably wait for their backoff **together**: one durable
  timer, to the earliest due retry, after which every due call is tried again, again as one
  batch in the given order. Three calls that each need a 10 s backoff cost one 10 s wait;
* the results come back in the given order; the first failure is raised after every call has
  finished (or, with ``return_exceptions=True``, each failure is returned in its place, as
  ``asyncio.gather`` does).

A round of a single call is a plain ``durable_call``. Calls to a service bound to Celery, and
write-ahead calls, are made one at a time by the host even inside a batch (docs/abi.md).

Child workflows (``ctx.child`` + ``ctx.gather_children``) were the other way to overlap calls;
they cost a run per call and are what ``gather`` exists to avoid. Starting the calls with
``durable_schedule_invoke`` and collecting their responses through promises was dropped: an
invocation's response is not given back to the run, and settling a promise needs someone
outside the run to do it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from cleat_workflow._errors import (
    Ambiguous,
    CallFailed,
    Cancelled,
    Denied,
    NotFound,
    PermanentError,
    RetriesExhausted,
    WorkflowError,
    error_for,
)

if TYPE_CHECKING:
    from cleat_workflow._context import Context

Duration = float | int | timedelta

# Failures that another attempt cannot change.
_FINAL = (PermanentError, Ambiguous, Cancelled, Denied, NotFound, RetriesExhausted)


def _seconds(value: Duration) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


@dataclass(frozen=True)
class Retry:
    """How a call in a gather is retried: ``max_attempts`` in all, waiting
    ``initial_interval`` seconds after the first failure, times ``backoff`` after each
    further one, at most ``max_interval``. A failure whose message contains one of
    ``non_retryable`` is not retried; neither are permanent, ambiguous and denied ones."""

    max_attempts: int = 3
    initial_interval: Duration = 1.0
    backoff: float = 2.0
    max_interval: Duration = 60.0
    non_retryable: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= 100:
            raise ValueError(f"max_attempts must be 1-100, not {self.max_attempts}")
        if _seconds(self.initial_interval) < 0 or _seconds(self.max_interval) < 0:
            raise ValueError("retry intervals cannot be negative")
        if self.backoff < 1:
            raise ValueError(f"backoff must be at least 1, not {self.backoff}")

    def delay_ms(self, failures: int) -> int:
        """The wait after the ``failures``-th failed attempt."""
        seconds = _seconds(self.initial_interval) * self.backoff ** (failures - 1)
        return round(min(seconds, _seconds(self.max_interval)) * 1000)

    def retries(self, error: WorkflowError, attempts: int) -> bool:
        if attempts >= self.max_attempts or isinstance(error, _FINAL):
            return False
        return not any(part in error.message for part in self.non_retryable)


@dataclass(frozen=True)
class Call:
    """One durable call, made when it is gathered: ``Call("inventory", "reserve", {...})``.

    ``retry`` retries it within the gather (once by default); ``decode`` turns the response
    into the value the gather returns (typed services set it, see ``Service``)."""

    service: str
    operation: str
    request: Any = None
    retry: Retry | None = None
    decode: Callable[[Any], Any] | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        return f"{self.service}.{self.operation}"


class _Pending:
    """One call of a gather while it runs."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.policy = call.retry or Retry(max_attempts=1)
        self.attempts = 0
        self.due_ms = 0
        self.done = False
        self.value: Any = None
        self.error: WorkflowError | None = None

    def settle(self, ctx: Context, outcome: Any) -> None:
        """Take one attempt's outcome: a response, or the WorkflowError it failed with."""
        self.attempts += 1
        if not isinstance(outcome, WorkflowError):
            self.value = self.call.decode(outcome) if self.call.decode else outcome
            self.done = True
            return
        if self.policy.retries(outcome, self.attempts):
            self.due_ms = ctx.now_ms() + self.policy.delay_ms(self.attempts)
            return
        self.error = outcome
        if self.policy.max_attempts > 1 and isinstance(outcome, CallFailed):
            self.error = RetriesExhausted(
                f"{self.call.name}: {self.attempts} attempt(s) failed, the last: {outcome.message}"
            )
        self.done = True


def call_many(ctx: Context, calls: Sequence[Call]) -> list[Any]:
    """One attempt of each call, made together: each response, or the WorkflowError it
    failed with, in order. One call is a plain ``durable_call``."""
    from cleat_workflow import _host
    from cleat_workflow._context import _dumps, _loads, _packed

    if len(calls) == 1:
        only = calls[0]
        try:
            return [ctx.call(only.service, only.operation, only.request)]
        except WorkflowError as exc:
            return [exc]
    requests = [
        {"service": c.service, "operation": c.operation, "request": _dumps(c.request)}
        for c in calls
    ]
    answers = json.loads(_packed(_host.batch.durable_call_many, _dumps(requests)))
    return [
        _loads(answer["payload"])
        if answer["status"] == 0
        else error_for(int(answer["status"]), answer["payload"])
        for answer in answers
    ]


def _attempt(ctx: Context, items: Sequence[_Pending]) -> None:
    for item, outcome in zip(items, call_many(ctx, [i.call for i in items]), strict=True):
        item.settle(ctx, outcome)


def gather(ctx: Context, calls: Iterable[Call], *, return_exceptions: bool = False) -> list[Any]:
    """See :meth:`Context.gather`."""
    pending = [_Pending(call) for call in calls]
    for item in pending:
        if not isinstance(item.call, Call):
            raise TypeError(f"gather takes Call values, not {type(item.call).__name__}")
    if pending:
        _attempt(ctx, pending)
    while True:
        waiting = [item for item in pending if not item.done]
        if not waiting:
            break
        wake_ms = min(item.due_ms for item in waiting)
        now = ctx.now_ms()
        if wake_ms > now:
            ctx.sleep(timedelta(milliseconds=wake_ms - now))
        now = ctx.now_ms()
        _attempt(ctx, [item for item in waiting if item.due_ms <= now])
    if not return_exceptions:
        for item in pending:
            if item.error is not None:
                raise item.error
    return [item.error if item.error is not None else item.value for item in pending]
