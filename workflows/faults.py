"""The test-only fault settings, applied once per process (``WorkflowsConfig.ready``).

* ``CLEAT_TEST_CRASH_AT``: crash points to arm (``engine.faults``), e.g. ``after_call:3``.
* ``CLEAT_TEST_CLOCK_OFFSET_SECONDS``: this process's clock runs that far ahead (negative:
  behind) of the real one, as on a machine whose clock drifted. Every reading the worker,
  the store and the scheduler take goes through ``django.utils.timezone.now`` (the worker
  passes ``now`` down; the stores default to it), so that function is replaced by a skewed
  one, and the executor hands the same clock to the engine (whose own default reads
  ``time.time``). Field defaults bound to ``timezone.now`` when the models were defined keep
  the real clock; every row the worker writes that matters to scheduling (wake times,
  heartbeats, created_at of children and successors) gets an explicit ``now``.

Both default to off; production never sets them, and when off nothing is replaced and
:func:`skewed_clock` is a ``None`` check.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from django.utils import timezone

from engine import faults

log = logging.getLogger("cleat.faults")

_skewed: Callable[[], datetime] | None = None


def install(crash_at: str, clock_offset_s: float) -> None:
    """Arm the crash points and skew the clock as the settings say (both empty: nothing)."""
    global _skewed
    if crash_at:
        faults.arm(crash_at)
        log.warning("event=faults_armed crash_at=%s", crash_at)
    if clock_offset_s and _skewed is None:
        offset = timedelta(seconds=clock_offset_s)
        real = timezone.now

        def skewed() -> datetime:
            return real() + offset

        timezone.now = skewed
        _skewed = skewed
        log.warning("event=clock_skewed offset_s=%s", clock_offset_s)


def skewed_clock() -> Callable[[], datetime] | None:
    """The skewed clock when the process runs on one, else None."""
    return _skewed
