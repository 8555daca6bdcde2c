"""ABI v1 status codes: the first byte of every packed buffer (ABI.md section 2).

Codes are wire ABI: a member may be added, an existing value never changes.
"""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
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
        """Lower-case name, as used for error codes (``Status.PERMANENT.label == "permanent"``)."""
        return self.name.lower()


def status_from_byte(value: int) -> Status | None:
    """The status for a byte a guest returned, or None for a code this host does not know."""
    try:
        return Status(value)
    except ValueError:
        return None
