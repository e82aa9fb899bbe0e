"""Durations (llm_vitals/durations.py): what a config says, read; and seconds written back the same way."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm_vitals.durations import format_duration, parse_duration, parse_positive_duration


@pytest.mark.parametrize("text, seconds", [("250ms", 0.25), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0),
                                           ("30d", 2_592_000.0), (" 1.5 s ", 1.5), ("42", 42.0), (7, 7.0)])
def test_a_duration_reads_as_seconds(text, seconds) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("value", ["5 minutes", "-1s", "1w", "", True, None, -3])
def test_anything_else_is_refused(value) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize("value", [10**400, -(10**400), "9" * 400, "1e999", 1e300, float("inf"), float("nan"),
                                   "36501d"], ids=["huge int", "huge negative int", "huge digits", "exponent",
                                                   "huge float", "inf", "nan", "past a century"])
def test_a_duration_too_large_for_any_clock_is_a_clear_error_not_an_overflow(value) -> None:
    with pytest.raises(ValueError, match=r"not a duration|duration too large"):
        parse_duration(value)


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (0.25, "250ms"), (1.5, "1500ms"), (30, "30s"), (90, "90s"),
                                           (300, "5m"), (3600, "1h"), (5400, "90m"), (2_592_000, "30d")])
def test_seconds_are_written_in_their_largest_whole_unit(seconds, text) -> None:
    assert format_duration(seconds) == text


def test_a_negative_duration_is_not_written() -> None:
    with pytest.raises(ValueError, match="negative"):
        format_duration(-1)


@given(st.integers(min_value=0, max_value=10**12))
def test_what_is_written_reads_back_to_the_millisecond(millis) -> None:
    assert round(parse_duration(format_duration(millis / 1000)) * 1000) == millis


@pytest.mark.parametrize("parse", [parse_duration, parse_positive_duration])
def test_nan_is_refused_with_a_message_of_its_own(parse) -> None:
    # NaN compares false with everything: `stuck_after: .nan` would never be reached (issue 29).
    with pytest.raises(ValueError, match=r"^not a duration: NaN \(a duration must be a number of seconds\)$"):
        parse(float("nan"))


@pytest.mark.parametrize("value", [float("inf"), 10**400, "9" * 400, "9" * 308 + "d"])
def test_infinity_and_past_a_float_are_refused(value) -> None:
    with pytest.raises(ValueError, match=r"^duration too large"):
        parse_duration(value)


@pytest.mark.parametrize("value", ["-1m", " -30s", "-5", -60, -0.5])
def test_a_negative_duration_is_worded_the_same_written_or_numeric(value):
    """Issue 31: `-1m` read `not a duration` where -60 read `must not be negative`."""
    with pytest.raises(ValueError, match=r"^duration must not be negative: "):
        parse_duration(value)
