"""`max_unhealthy`: how many of the fleet may be unhealthy at once and still get a restart (the fleet gate).

One rule, read by the settings (validation, and the count over the static targets) and by the
gate (the count over the fleet at decision time, templates' targets included). The value is a
count (`2`) or a percentage of the fleet (`"40%"`). A percentage rounds down, as Cluster API's
maxUnhealthy does, but never below one: with one or two targets a single stuck server says
nothing about a fault elsewhere. An explicit count of 0 turns restarts off.
"""

from __future__ import annotations

import math
import re

_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def parse_max_unhealthy(value: int | str) -> int | str:
    """A configured value, checked: a count (an int, or a string of digits) or a percentage `"N%"` up to 100%.

    Raises ValueError saying what is wrong.
    """
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    if percent := _PERCENT.match(value):
        if float(percent.group(1)) > 100:
            raise ValueError("a percentage must be at most 100%")
        return value.strip()
    if value.strip().isdigit():
        return int(value)
    raise ValueError('must be a count (2) or a percentage ("40%")')


def percent_of(value: int | str) -> float | None:
    """The percentage a checked value names (`"40%"` -> 40.0); None for a count."""
    match = _PERCENT.match(value) if isinstance(value, str) else None
    return float(match.group(1)) if match else None


def unhealthy_limit(count: int, percent: float | None, fleet_size: int) -> int:
    """How many of `fleet_size` targets may be unhealthy at once: `percent` of them when set, else `count`."""
    if percent is None:
        return count
    # + 1e-9: a product that lands a hair below a whole count still counts as that count.
    return max(1, math.floor(percent * fleet_size / 100.0 + 1e-9))
