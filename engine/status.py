"""ABI v1 status codes: the first byte of every packed buffer (ABI.md section 2).

Codes are wire ABI: a member may be added, an existing value never changes.
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


# The engine's own modules say ``Status``: nothing else in the engine has a status. Outside the
# engine, where a run has a status too (``workflows.models.RunStatus``), say ``AbiStatus``.
Status = AbiStatus


def status_from_byte(value: int) -> AbiStatus | None:
    """The status for a byte a guest returned, or None for a code this host does not know."""
    try:
        return AbiStatus(value)
    except ValueError:
        return None
