"""Durations as users write them in YAML: `30s`, `5m`, `1h`, `250ms` or plain seconds."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(value: object) -> float:
    """Return seconds. Raises ValueError with the offending text for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        match = _PATTERN.match(value)
        if not match:
            raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 5m, 1h or plain seconds)")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    else:
        raise ValueError(f"not a duration: {value!r}")
    if seconds < 0:
        raise ValueError(f"duration must not be negative: {value!r}")
    return seconds


# A pydantic field type: `poll_interval: Duration = 5.0` accepts "5s", "1m", 5.
Duration = Annotated[float, BeforeValidator(parse_duration)]
