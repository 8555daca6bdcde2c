"""Task calls: durable calls that run as tasks elsewhere (Celery), and what becomes of an
outcome their worker reports.

A task call's record (made with the call's write-ahead intent, ``DispatchTask``) goes
through these states:

* ``pending``: sent (or about to be), no outcome yet;
* ``reported``: the task's worker reported an outcome; the run was woken to take it;
* ``settled``: the run wrote the call's outcome into its history (the reported one, or
  TIMEOUT / CANCELLED it decided itself);
* ``abandoned``: the run ended from outside (terminated, force-completed) while it waited.

Delivery is at least once: a task re-delivered after its worker died runs again with the
same idempotency key and reports again. :func:`disposition` is the one rule for what a
report does, for every store. Pure code.
"""

from __future__ import annotations

from enum import StrEnum


class TaskCallState(StrEnum):
    PENDING = "pending"
    REPORTED = "reported"
    SETTLED = "settled"
    ABANDONED = "abandoned"


class Disposition(StrEnum):
    RECORDED = "recorded"  # the outcome is the call's; wake the run
    DUPLICATE = "duplicate"  # an outcome was already recorded: nothing is written again
    STALE = "stale"  # the run no longer waits for it (moved on, ended, a newer call): dropped
    REFUSED = "refused"  # the token does not match: not the call's worker


def disposition(
    state: str | None, token_matches: bool, *, had_outcome: bool, run_ended: bool
) -> Disposition:
    """What a reported outcome does to the record in ``state`` (None: no such record).

    ``had_outcome``: the record already holds a reported outcome (``reported``, or
    ``settled`` from one). A duplicate of that outcome records nothing twice; an outcome
    for a call the run closed itself (timed out, cancelled) or for a run that ended is
    stale."""
    if state is None:
        return Disposition.STALE
    if not token_matches:
        return Disposition.REFUSED
    if had_outcome:
        return Disposition.DUPLICATE
    if state != TaskCallState.PENDING or run_ended:
        return Disposition.STALE
    return Disposition.RECORDED
