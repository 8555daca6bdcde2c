"""The engine's statuses, each defined once: the ABI v1 status codes (the first byte of
every packed buffer, ABI.md section 2) and the statuses a run moves through.

ABI codes are wire ABI: a member may be added, an existing value never changes. Run statuses
are stored (``workflows.models.RunStatus`` is built from :class:`RunStatus`), so a value
never changes either.
"""

from __future__ import annotations

import enum


class AbiStatus(enum.IntEnum):
    OK = 0
    ERROR = 1
    PERMANENT = 2
    AMBIGUOUS = 3
    TIMEOUT = 4
    CANCELLED = 5
    RETRIES_EXHAUSTED = 6
    NOT_FOUND = 7
    DENIED = 8

    @property
    def label(self) -> str:
        """Lower-case name, as used for error codes (``AbiStatus.PERMANENT.label`` is
        ``"permanent"``)."""
        return self.name.lower()


def status_from_byte(value: int) -> AbiStatus | None:
    """The status for a byte a guest returned, or None for a code this host does not know."""
    try:
        return AbiStatus(value)
    except ValueError:
        return None


class RunStatus(enum.StrEnum):
    """Where a run is in its lifecycle (:mod:`engine.lifecycle` moves it). A member is its
    stored string: ``RunStatus.READY == "ready"``, and reads as it in a message."""

    READY = "ready"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    TERMINATED = "terminated"
    PAUSED = "paused"

    @property
    def label(self) -> str:
        """The status as a person reads it (``"dead-lettered"``)."""
        return self.value.replace("_", "-")


# A run in one of these has ended: its end closed its children, failed its pending updates
# and released its locks (engine.lifecycle).
TERMINAL_STATUSES = frozenset(
    {RunStatus.DONE, RunStatus.FAILED, RunStatus.DEAD_LETTERED, RunStatus.TERMINATED}
)
