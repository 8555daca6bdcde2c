"""The crash points' arming (engine.faults): off by default, specs checked, a hit counted."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine import faults


def test_a_spec_names_known_points_with_positive_counts() -> None:
    """A typo must not silently arm nothing: the error lists the known points."""
    with pytest.raises(faults.FaultSpecError, match="unknown crash point 'after_cal'"):
        faults.parse("after_cal")
    with pytest.raises(faults.FaultSpecError, match="at least 1"):
        faults.parse("finalize:0")
    with pytest.raises(faults.FaultSpecError, match="not a count"):
        faults.parse("finalize:x")
    assert faults.parse("finalize:2, after_call") == {"finalize": 2, "after_call": 1}
    assert faults.parse("") == {}


def test_disarmed_points_do_nothing_and_an_armed_one_exits_on_its_hit() -> None:
    faults.crash_point("finalize")  # disarmed (the default): returns
    script = (
        "from engine import faults\n"
        "faults.arm('finalize:2')\n"
        "faults.crash_point('after_call')\n"  # another point: nothing
        "faults.crash_point('finalize')\n"  # the first hit: nothing yet
        "print('survived one', flush=True)\n"
        "faults.crash_point('finalize')\n"  # the second: exit
        "print('survived two', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == faults.EXIT_CODE, done.stderr
    assert done.stdout == "survived one\n"
    assert "event=crash_point point=finalize" in done.stderr
