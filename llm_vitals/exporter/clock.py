"""The exporter's two clocks, read together: monotonic for every duration, wall for the timestamps shown.

Stuck seconds, liveness, the canary's interval, `down_after` and every other span the verdict
measures are differences of monotonic readings, so an NTP step (or a person setting the clock)
changes none of them. Wall-clock time is only what the API, `/metrics` and the status page show
(`since`, `last_poll`, `last_restart_at`, ...): an instant kept as a monotonic reading is shown as
the wall time it corresponds to now (`Instant.shown`), which after a clock step is that event in
the corrected clock, the one Alertmanager's `startsAt` is read against.

A test injects one plain function (a fake time it advances): it is then both clocks, and every
shown timestamp is the fake time itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Instant:
    """One moment on both clocks: `mono` for durations, `wall` (Unix seconds) for what is shown."""

    mono: float
    wall: float

    def shown(self, mono: float | None) -> float | None:
        """The Unix time of an earlier monotonic reading `mono`, as the wall clock reads now (None stays None)."""
        return None if mono is None else mono + (self.wall - self.mono)


class Clock:
    """Reads both clocks at once; `Clock()` is the real pair."""

    def __init__(self, mono: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.mono = mono
        self.wall = wall

    def now(self) -> Instant:
        return Instant(self.mono(), self.wall())


def as_clock(clock: Clock | Callable[[], float]) -> Clock:
    """A Clock as given, or one plain function (a test's fake time) serving as both clocks."""
    return clock if isinstance(clock, Clock) else Clock(clock, clock)
