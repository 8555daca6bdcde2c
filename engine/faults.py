"""Fault injection for tests: named crash points where a test makes the process die hard.

A crash point is a line in the worker, the store or the scheduler where a process could
die in production -- between a service's answer and its event's commit, between an append
and the guest seeing its reply, inside the finalize, a continue-as-new, a child start, a
schedule's firing, between a satisfying commit and its wake of the waiting run.
``crash_point(name)`` does nothing unless the process was armed with :func:`arm`
(``workflows.apps`` arms it from the test-only setting ``CLEAT_TEST_CRASH_AT``, which
defaults to empty): the check is one module-level ``None`` comparison, so production
pays nothing for it. Armed with ``name`` (or ``name:N``), the N-th time (default: the first)
the process reaches that point it calls ``os._exit`` -- no ``finally``, no ``atexit``, no
rollback sent, no socket closed politely: what a machine losing power looks like to the
database and the services.

Why ``os._exit`` and not an exception: an exception unwinds through the engine's and
Django's handlers (a rolled-back transaction, a released run), which is the path the rest
of the suite already covers. A crash skips all of it; only the database's own recovery
(an aborted transaction, a lease that expires) and the next worker's replay remain.

The points (``POINTS``) are documented where they are placed. ``purge_batch`` is reserved
for the retention purge (between two batches); ``rotate_batch`` sits inside each batch of a
payload-key rotation (workflows/rotation.py), its rows re-sealed and not yet committed.
"""

from __future__ import annotations

import os
import sys
import threading

# Where each point sits (the call sites say the same next to the call).
POINTS: dict[str, str] = {
    "after_call": "a service call has returned; its event is not yet committed",
    "after_append": "an append committed; the reply has not yet reached the guest",
    "finalize": "inside the segment's fenced finalize transaction, before it commits",
    "continue_as_new": "inside the finalize, the successor run created, not yet committed",
    "child_start": "inside the start's transaction, the child run created, not committed",
    "schedule_fire": "a schedule's run started for an instant, the firing not committed",
    "before_wake": "a child's end, a signal, an update, a promise or a task outcome committed; "
    "the waiting run not yet woken",
    # Reserved: placed by the retention purge when it lands.
    "purge_batch": "between two batches of the retention purge",
    "rotate_batch": "inside a batch of a payload-key rotation, its rows re-sealed, not committed",
}

EXIT_CODE = 70  # what a crashed process exits with (tests tell it from other failures)

# None: disarmed (production). Else point name -> hits left before the crash.
_armed: dict[str, int] | None = None
_lock = threading.Lock()


class FaultSpecError(ValueError):
    """A crash specification that names no known point or has a bad count."""


def parse(spec: str) -> dict[str, int]:
    """``"point"``, ``"point:N"``, several separated by commas -> {point: N}."""
    found: dict[str, int] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, _, count = part.partition(":")
        if name not in POINTS:
            raise FaultSpecError(
                f"unknown crash point {name!r} (known: {', '.join(sorted(POINTS))})"
            )
        try:
            hits = int(count) if count else 1
        except ValueError:
            raise FaultSpecError(f"crash point {name!r}: {count!r} is not a count") from None
        if hits < 1:
            raise FaultSpecError(f"crash point {name!r}: the count must be at least 1")
        found[name] = hits
    return found


def arm(spec: str) -> None:
    """Arm the crash points ``spec`` names (see :func:`parse`); an empty spec disarms."""
    global _armed
    points = parse(spec)
    with _lock:
        _armed = points or None


def crash_point(name: str) -> None:
    """Die here (``os._exit``) if the process was armed for ``name`` and this is the hit it
    was armed for; otherwise nothing."""
    if _armed is None:
        return
    _reached(name)


def _reached(name: str) -> None:
    with _lock:
        if _armed is None or name not in _armed:
            return
        _armed[name] -= 1
        if _armed[name] > 0:
            return
    # Flushed by hand: os._exit skips the interpreter's shutdown, and the test reads the log.
    sys.stderr.write(f"event=crash_point point={name} pid={os.getpid()}\n")
    sys.stderr.flush()
    os._exit(EXIT_CODE)
