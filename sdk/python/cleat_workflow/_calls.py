"""Several durable calls from one workflow at once: ``ctx.gather(Call(...), Call(...))``.

Design note
-----------
ABI v1 (fixed) has no call that starts without answering: ``durable_call`` returns its
response within the host call, ``durable_send`` and ``durable_schedule_invoke`` return no
response, and a promise is settled from outside the run. So a gather cannot overlap the
calls' own network time inside one instance; what it can do, and does, is run the calls as
one group over the ABI's building blocks (``durable_call`` and ``durable_sleep``):

* every call's first attempt is made in the order the calls are given, one recorded step
  each, whatever the others answer -- a failing call does not keep the next one from being
  made, and nothing depends on timing, so a replay makes the same steps in the same order;
* the calls whose attempt failed retryably wait for their backoff **together**: one durable
  timer, to the earliest due retry, after which every due call is tried again in the given
  order. Three calls that each need a 10 s backoff cost one 10 s wait, not three;
* the results come back in the given order; the first failure is raised after every call has
  finished (or, with ``return_exceptions=True``, each failure is returned in its place, as
  ``asyncio.gather`` does).

Child workflows (``ctx.child`` + ``ctx.gather_children``) were the other way to overlap calls;
they cost a run per call and are what ``gather`` exists to avoid. Starting the calls with
``durable_schedule_invoke`` and collecting their responses through promises was dropped: an
invocation's response is not given back to the run, and settling a promise needs someone
outside the run to do it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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

    def attempt(self, ctx: Context) -> None:
        self.attempts += 1
        try:
            response = ctx.call(self.call.service, self.call.operation, self.call.request)
            self.value = self.call.decode(response) if self.call.decode else response
        except WorkflowError as exc:
            if self.policy.retries(exc, self.attempts):
                self.due_ms = ctx.now_ms() + self.policy.delay_ms(self.attempts)
                return
            self.error = exc
            if self.policy.max_attempts > 1 and isinstance(exc, CallFailed):
                self.error = RetriesExhausted(
                    f"{self.call.name}: {self.attempts} attempt(s) failed, the last: {exc.message}"
                )
        self.done = True


def gather(ctx: Context, calls: Iterable[Call], *, return_exceptions: bool = False) -> list[Any]:
    """See :meth:`Context.gather`."""
    pending = [_Pending(call) for call in calls]
    for item in pending:
        if not isinstance(item.call, Call):
            raise TypeError(f"gather takes Call values, not {type(item.call).__name__}")
    for item in pending:
        item.attempt(ctx)
    while True:
        waiting = [item for item in pending if not item.done]
        if not waiting:
            break
        wake_ms = min(item.due_ms for item in waiting)
        now = ctx.now_ms()
        if wake_ms > now:
            ctx.sleep(timedelta(milliseconds=wake_ms - now))
        now = ctx.now_ms()
        for item in waiting:
            if item.due_ms <= now:
                item.attempt(ctx)
    if not return_exceptions:
        for item in pending:
            if item.error is not None:
                raise item.error
    return [item.error if item.error is not None else item.value for item in pending]
