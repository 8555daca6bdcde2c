"""Errors of the engine package, and the error codes a failed workflow carries.

One root exception (:class:`EngineError`); wasmtime's errors are translated at the boundary
(``runtime.py``) and never leak out of the package.
"""

from __future__ import annotations

import enum
import re

from engine.status import AbiStatus


class ErrorCode(enum.StrEnum):
    """Why a workflow failed. Stored in the instance's ``error_code`` column; defined once here."""

    # The guest's entry point returned a non-OK status.
    ERROR = "error"  # retryable or unknown
    PERMANENT = "permanent"
    AMBIGUOUS = "ambiguous"
    TIMEOUT = "timeout"  # also: the segment deadline (epoch interruption) passed
    CANCELLED = "cancelled"
    RETRIES_EXHAUSTED = "retries_exhausted"
    NOT_FOUND = "not_found"
    DENIED = "denied"
    # Raised by the host.
    RESOURCE_LIMIT = "resource_limit"  # memory, fuel, tables, instances
    GUEST_FAULT = "guest_fault"  # bad pointer, invalid UTF-8, oversized string, forbidden call
    PANIC = "panic"  # any other trap: unreachable, division by zero, ...
    NONDETERMINISM = "nondeterminism"  # replay diverged from the recorded history
    HISTORY_CORRUPT = "history_corrupt"  # an event's checksum does not match its content
    INVALID_MODULE = "invalid_module"  # the module cannot be loaded or lacks an export
    TERMINATED = "terminated"  # an operator terminated the run
    INTERNAL = "internal"  # the host failed (storage down, bug); the run is retried
    # A stored payload's encryption key is not configured (or does not open it).
    ENCRYPTION_KEY_MISSING = "encryption_key_missing"


# Codes worth another attempt with the same code: the failure may not repeat.
RETRYABLE_CODES = frozenset(
    {ErrorCode.ERROR, ErrorCode.TIMEOUT, ErrorCode.PANIC, ErrorCode.AMBIGUOUS, ErrorCode.INTERNAL}
)


class EngineError(Exception):
    """Root of every exception this package raises."""


class InvalidModule(EngineError):
    """The bytes are not a module this host can run; the message is wasmtime's or ours."""


class UnsupportedAbiVersion(InvalidModule):
    """The module declares an ABI version this host does not serve."""


class FenceLost(EngineError):
    """Another worker owns the instance now (generation moved on); drop the segment quietly."""


class StorageError(EngineError):
    """Storage failed for a reason unrelated to the workflow (database down, bug)."""


class Refused(EngineError):
    """Storage refused an operation for a reason the workflow is told about (a status code).

    For example an unknown child definition (``NOT_FOUND``), a quota (``DENIED``), an invalid
    cron expression (``PERMANENT``). The session records the refusal as the call's outcome.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Denied(Refused):
    """A policy refused the operation (``DENIED``): signal authorization, a quota. Stores
    keep an audit row of it after the refused change has rolled back; ``detail`` says what
    was refused."""

    def __init__(self, message: str, action: str, **detail: str) -> None:
        super().__init__(AbiStatus.DENIED, message)
        self.action = action
        self.detail = detail


class PermanentError(Exception):
    """Raise from a Python service to fail the call with ``PERMANENT`` (do not retry).

    Any other exception from a service maps to ``ERROR`` (retryable).
    """


class WorkflowExit(EngineError):
    """Base of the exceptions that end an execution segment from inside a host function."""


class GuestFault(WorkflowExit):
    """The guest broke the ABI contract; the workflow fails with ``guest_fault``."""

    def __init__(self, function: str, fault: str) -> None:
        super().__init__(f"{function}: {fault}")
        self.function = function
        self.fault = fault


class QuotaExceeded(WorkflowExit):
    """A host call that answers a plain number (``acquire_lock``) went over a quota: the
    run fails with ``denied`` and the quota's message (there is no status to answer)."""


class NondeterminismError(WorkflowExit):
    """Replay asked a different question than the history recorded at this step."""

    def __init__(self, step: int, recorded: str, attempted: str) -> None:
        super().__init__(
            f"non-determinism at step {step}: the history recorded {recorded}, "
            f"but the workflow now calls {attempted}"
        )
        self.step = step
        self.recorded = recorded
        self.attempted = attempted

    @classmethod
    def from_message(cls, message: str) -> NondeterminismError | None:
        """The error a ``nondeterminism`` failure's message was made from (the message is
        all a finished segment keeps of it), or None for a message not of that form."""
        found = _NONDETERMINISM_MESSAGE.fullmatch(message)
        if found is None:
            return None
        return cls(int(found["step"]), found["recorded"], found["attempted"])


_NONDETERMINISM_MESSAGE = re.compile(
    r"non-determinism at step (?P<step>\d+): the history recorded (?P<recorded>.*?), "
    r"but the workflow now calls (?P<attempted>.*)",
    re.DOTALL,
)


class HistoryCorrupt(WorkflowExit):
    """An event's checksum does not match its content."""
