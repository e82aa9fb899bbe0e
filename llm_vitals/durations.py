"""Durations as users write them in YAML: `30s`, `5m`, `1h`, `250ms` or plain seconds; and back.

`parse_duration` reads what a config says; `format_duration` writes seconds the way the docs show
a default and the way Prometheus and Alertmanager read a duration (`for:`, `scrape_interval`).
`PositiveDuration` is the field type of every timeout and interval: zero or less is refused with
one message, whatever the key (a canary timeout of 0 fails every canary; a refresh interval of 0 spins).
NaN is refused by both with a message of its own (YAML's `.nan`): every comparison with NaN is
false, so `stuck_after: .nan` would never be reached and the target never read stuck.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# Largest first, in milliseconds: what format_duration tries in turn.
_WHOLE_UNITS_MS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000))
# No duration means more than a century; beyond, a time plus the duration can pass any date (and overflow).
MAX_SECONDS = 100 * 365 * 86400.0
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


NAN_MESSAGE = "not a duration: NaN (a duration must be a number of seconds)"


def parse_duration(value: object) -> float:
    """Return seconds. Raises ValueError with the offending text for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    try:
        if isinstance(value, (int, float)):
            seconds = float(value)
        elif isinstance(value, str):
            match = _PATTERN.match(value)
            if not match and _PATTERN.match(value.strip().removeprefix("-")):
                # `-1m` is a duration, a negative one: said as a negative number is (one wording for both).
                raise ValueError(f"duration must not be negative: {value!r}")
            if not match:
                raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 5m, 1h or plain seconds)")
            seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
        else:
            raise ValueError(f"not a duration: {value!r}")
    except OverflowError:  # an integer past any float: a ValueError, so that a config error says so
        raise ValueError(f"duration too large: {str(value)[:40]!r}") from None
    if math.isnan(seconds):
        raise ValueError(NAN_MESSAGE)
    if not math.isfinite(seconds) or seconds > MAX_SECONDS:
        raise ValueError(f"duration too large: {str(value)[:40]!r} (at most 100 years)")
    if seconds < 0:
        raise ValueError(f"duration must not be negative: {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """`seconds` in its largest whole unit (`30d`, `1h`, `90s`, `250ms`; `0s`), to the millisecond.

    Both `parse_duration` and Prometheus's duration parser read it back. Raises ValueError when negative.
    """
    millis = round(seconds * 1000)
    if millis < 0:
        raise ValueError(f"duration must not be negative: {seconds!r}")
    if millis == 0:
        return "0s"
    for unit, size in _WHOLE_UNITS_MS:
        if millis % size == 0:
            return f"{millis // size}{unit}"
    return f"{millis}ms"


POSITIVE_MESSAGE = "must be > 0"


def parse_positive_duration(value: object) -> float:
    """Seconds above 0; ValueError(POSITIVE_MESSAGE) for zero or a negative duration, one message for both."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
        raise ValueError(POSITIVE_MESSAGE)
    if isinstance(value, str) and value.strip().startswith("-"):
        raise ValueError(POSITIVE_MESSAGE)
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(POSITIVE_MESSAGE)
    return seconds


# Pydantic field types: `poll_interval: PositiveDuration = 5.0` accepts "5s", "1m", 5, and refuses 0.
Duration = Annotated[float, BeforeValidator(parse_duration)]
PositiveDuration = Annotated[float, BeforeValidator(parse_positive_duration)]
