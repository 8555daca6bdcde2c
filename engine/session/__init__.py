"""The execution session: record on first execution, replay from history afterwards.

``replay`` holds the core every host operation is built from (match, record, apply, finish;
its design note describes record and replay); the host operations are grouped by domain in
``ops_calls`` (calls and fetch), ``ops_time`` (time, signals and promises), ``ops_children``
(updates, defers, children and continue-as-new) and ``ops_state`` (state, locks and crons).
:class:`ExecutionSession` combines them as mixins over :class:`ReplayCore`: a host function
still finds the method of its own name with one attribute lookup (the type's method cache
answers it whatever the depth of the class hierarchy), so the rooms cost nothing per call.
"""

from __future__ import annotations

from engine.outcomes import (
    AppliedUpdate,
    Completed,
    ContinueAsNew,
    ContinuedAsNew,
    Failed,
    Outcome,
    SegmentResult,
    Suspend,
    Suspended,
    WaitCondition,
    WaitKind,
    failed,
)
from engine.session.ops_calls import CallOps
from engine.session.ops_children import ChildOps
from engine.session.ops_state import StateOps
from engine.session.ops_time import TimeOps
from engine.session.replay import OK_EMPTY, GuestBackend, ReplayCore, Reply, RunInfo


class ExecutionSession(CallOps, TimeOps, ChildOps, StateOps):
    """One execution segment of one run. Not thread-safe: a segment runs on one thread.

    Host operations. Strings arrive decoded; ``Reply`` is a packed buffer, ``int`` a scalar.
    """


# The outcome types live in engine.outcomes; they are re-exported here for the stores and
# the testing environment, which import them from the session.
__all__ = [
    "OK_EMPTY",
    "AppliedUpdate",
    "Completed",
    "ContinueAsNew",
    "ContinuedAsNew",
    "ExecutionSession",
    "Failed",
    "GuestBackend",
    "Outcome",
    "ReplayCore",
    "Reply",
    "RunInfo",
    "SegmentResult",
    "Suspend",
    "Suspended",
    "WaitCondition",
    "WaitKind",
    "failed",
]
