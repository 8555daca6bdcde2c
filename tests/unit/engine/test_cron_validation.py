"""Validation of cron expressions and time zones (engine/cron.py): what the scheduler could
not interpret is refused with a message naming the offending field."""

from __future__ import annotations

import pytest

from engine.cron import cron_error, expand, timezone_error


@pytest.mark.parametrize(
    ("expr", "field", "detail"),
    [
        ("abc * * * *", "minute field 'abc'", "not a number"),
        ("61 * * * *", "minute field '61'", "outside 0-59"),
        ("0 24 * * *", "hour field '24'", "outside 0-23"),
        ("0 0 0 * *", "day of month field '0'", "outside 1-31"),
        ("0 0 32 * *", "day of month field '32'", "outside 1-31"),
        ("0 0 * 13 *", "month field '13'", "outside 1-12"),
        ("0 0 * * 8", "day of week field '8'", "outside 0-7"),
        ("0 0 1 foo *", "month field 'foo'", "not a number"),
        ("mon * * * *", "minute field 'mon'", "not a number"),  # names only where they belong
        ("0 0 jan * *", "day of month field 'jan'", "not a number"),
        ("0 0 * * mon-xyz", "day of week field 'mon-xyz'", "'xyz' is not a number"),
        ("1,,2 * * * *", "minute field '1,,2'", "not a number"),
    ],
)
def test_bad_values_are_refused_naming_the_field(expr: str, field: str, detail: str) -> None:
    error = cron_error(expr)
    assert error is not None, f"{expr!r} should be refused"
    assert field in error
    assert detail in error


@pytest.mark.parametrize(
    ("expr", "step"),
    [("*/0 * * * *", "'0'"), ("*/x * * * *", "'x'"), ("0 */-1 * * *", "'-1'")],
)
def test_bad_steps_are_refused(expr: str, step: str) -> None:
    """A step must be a positive integer."""
    error = cron_error(expr)
    assert error is not None
    assert f"step {step} must be a positive integer" in error


@pytest.mark.parametrize("expr", ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 6,9,11 *"])
def test_expressions_that_never_fire_are_refused(expr: str) -> None:
    """Valid fields that no date satisfies (February 30th) would make a dead schedule."""
    error = cron_error(expr)
    assert error is not None
    assert "never fires" in error


@pytest.mark.parametrize("expr", ["0 0 29 2 *", "0 0 31 1,4 *"])
def test_rare_but_possible_dates_are_accepted(expr: str) -> None:
    """February 29th fires in leap years; the 31st fires in the months that have one."""
    assert cron_error(expr) is None


@pytest.mark.parametrize(
    ("macro", "equivalent"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@HOURLY", "0 * * * *"),
    ],
)
def test_macros_are_accepted_and_expand(macro: str, equivalent: str) -> None:
    assert cron_error(macro) is None
    assert expand(macro) == equivalent


def test_unknown_macro_is_refused_listing_the_known_ones() -> None:
    error = cron_error("@reboot")
    assert error is not None
    assert "@reboot" in error
    assert "@hourly" in error


@pytest.mark.parametrize(("expr", "count"), [("* * * *", 4), ("* * * * * *", 6), ("*", 1)])
def test_wrong_field_counts_are_refused(expr: str, count: int) -> None:
    error = cron_error(expr)
    assert error is not None
    assert "5 fields" in error
    assert f"not {count}" in error


@pytest.mark.parametrize("expr", ["", "   "])
def test_empty_expression_is_refused(expr: str) -> None:
    assert cron_error(expr) == "the cron expression is empty"


@pytest.mark.parametrize(
    "expr",
    [
        "0 9 * * mon-fri",
        "0 9 * * MON-FRI",
        "0 0 * * sun,sat",
        "0 0 1 jan *",
        "0 0 1 jan-mar *",
        "*/15 * * * *",
        "1-5/2 * * * *",
        "0 0 * * 7",  # Sunday, as 7
        "  0   0  * * *",  # extra spaces are normalised
    ],
)
def test_valid_expressions_are_accepted(expr: str) -> None:
    assert cron_error(expr) is None


def test_unsupported_syntax_is_refused_not_crashing() -> None:
    """Syntax croniter itself rejects surfaces as a message, never as an exception."""
    error = cron_error("1-2-3 * * * *")
    assert error is not None
    assert "1-2-3" in error


# --- time zones ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Mars/Olympus", "Europe/London ", "../../etc/passwd", "GMT+99"])
def test_unknown_time_zones_are_refused(name: str) -> None:
    error = timezone_error(name)
    assert error is not None
    assert repr(name) in error
    assert "IANA" in error


def test_empty_time_zone_is_refused() -> None:
    assert timezone_error("") == "the time zone is empty"


@pytest.mark.parametrize(
    "name", ["Asia/Kathmandu", "UTC", "America/St_Johns", "Australia/Lord_Howe"]
)
def test_iana_time_zones_are_accepted(name: str) -> None:
    """Including the odd offsets (+05:45, -03:30, a 30-minute DST shift)."""
    assert timezone_error(name) is None


def test_a_zone_directory_name_is_refused_not_raised() -> None:
    """ "Europe" is a directory in the tzdata tree, not a zone: a message, not an OSError."""
    from engine.cron import timezone_error

    problem = timezone_error("Europe")
    assert problem is not None and "Europe" in problem
