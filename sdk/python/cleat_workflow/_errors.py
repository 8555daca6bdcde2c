"""Exceptions of the SDK: one per ABI status code a host operation can answer with."""

from __future__ import annotations

from typing import ClassVar

# ABI v1 status codes (ABI.md section 2). Wire values: they never change.
OK = 0
ERROR = 1
PERMANENT = 2
AMBIGUOUS = 3
TIMEOUT = 4
CANCELLED = 5
RETRIES_EXHAUSTED = 6
NOT_FOUND = 7
DENIED = 8


class WorkflowError(Exception):
    """Root of the SDK's exceptions. ``status`` is the ABI status code it stands for.

    Raised out of a workflow, it fails the run with that status's error code (``error`` is
    retried by the worker, ``permanent`` is not); raise it yourself to choose the class.
    """

    status: ClassVar[int] = ERROR

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


class CallFailed(WorkflowError):
    """A call failed and may succeed if retried (status ERROR)."""

    status = ERROR


class PermanentError(WorkflowError):
    """Failed, do not retry: bad input, a 4xx, a non-retryable error (status PERMANENT)."""

    status = PERMANENT


class Ambiguous(WorkflowError):
    """A call was dispatched before a crash and its outcome is unknown (status AMBIGUOUS)."""

    status = AMBIGUOUS


class Timeout(WorkflowError):
    """A wait or a call timed out (status TIMEOUT)."""

    status = TIMEOUT


class Cancelled(WorkflowError):
    """The workflow was cancelled while it waited (status CANCELLED)."""

    status = CANCELLED


class RetriesExhausted(CallFailed):
    """Every attempt of a retried call failed; the message is the last error."""

    status = RETRIES_EXHAUSTED


class NotFound(WorkflowError):
    """Nothing there: no such state key, child, promise or definition (status NOT_FOUND)."""

    status = NOT_FOUND


class Denied(WorkflowError):
    """Refused by policy: a quota, signal authorization, the fetch allow-list (DENIED)."""

    status = DENIED


class LockHeld(CallFailed):
    """``ctx.lock`` could not take the lock: another workflow holds it."""


_BY_STATUS: dict[int, type[WorkflowError]] = {
    ERROR: CallFailed,
    PERMANENT: PermanentError,
    AMBIGUOUS: Ambiguous,
    TIMEOUT: Timeout,
    CANCELLED: Cancelled,
    RETRIES_EXHAUSTED: RetriesExhausted,
    NOT_FOUND: NotFound,
    DENIED: Denied,
}

STATUS_LABELS = {
    OK: "ok",
    ERROR: "error",
    PERMANENT: "permanent",
    AMBIGUOUS: "ambiguous",
    TIMEOUT: "timeout",
    CANCELLED: "cancelled",
    RETRIES_EXHAUSTED: "retries_exhausted",
    NOT_FOUND: "not_found",
    DENIED: "denied",
}
_BY_LABEL = {label: status for status, label in STATUS_LABELS.items()}


def error_for(status: int, message: str) -> WorkflowError:
    """The exception for a non-OK ABI status (an unknown code is a CallFailed)."""
    cls = _BY_STATUS.get(status, CallFailed)
    return cls(message)


def status_for_label(label: str) -> int:
    """``"permanent"`` -> 2: the statuses of child results are reported by label."""
    return _BY_LABEL.get(label, ERROR)
