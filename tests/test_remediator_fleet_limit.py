"""`max_unhealthy` (llm_vitals/remediator/fleet_limit.py): the one rule the settings and the gate share."""

from __future__ import annotations

import pytest

from llm_vitals.remediator.fleet_limit import parse_max_unhealthy, percent_of, unhealthy_limit


@pytest.mark.parametrize(
    "count, percent, fleet, limit",
    [(2, None, 10, 2), (0, None, 3, 0), (0, 40.0, 5, 2), (0, 40.0, 4, 1), (0, 40.0, 1, 1), (0, 40.0, 0, 1),
     (0, 100.0, 3, 3), (0, 33.3, 9, 2), (7, 50.0, 10, 5)],
)
def test_a_percentage_rounds_down_but_never_below_one_and_a_count_is_itself(count, percent, fleet, limit) -> None:
    assert unhealthy_limit(count, percent, fleet) == limit


@pytest.mark.parametrize("value, parsed, percent", [(2, 2, None), ("3", 3, None), (" 40% ", "40%", 40.0),
                                                    ("12.5%", "12.5%", 12.5), ("100%", "100%", 100.0)])
def test_a_value_is_a_count_or_a_percentage(value, parsed, percent) -> None:
    assert parse_max_unhealthy(value) == parsed
    assert percent_of(parsed) == percent


@pytest.mark.parametrize("value, message", [(-1, "must not be negative"), ("101%", "at most 100%"),
                                            ("two", "must be a count"), ("40 %%", "must be a count")])
def test_a_bad_value_says_what_is_wrong(value, message) -> None:
    with pytest.raises(ValueError, match=message):
        parse_max_unhealthy(value)
