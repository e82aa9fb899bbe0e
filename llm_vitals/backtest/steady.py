"""A run of identical reads: when judging each read again cannot change the verdict but for its time. Pure.

An idle server's scrapes are the same scrape after scrape: the same snapshot, read over and over.
The verdict code (`verdict.judge`) is the only rule: it is never copied here. What is worked out
here is when a call of it may be left out, from two of its own answers in a row:

- the last two reads were judged on the very same snapshot (one object: the same samples);
- the second verdict is the first with every field that held the first read's time now holding
  the second's (`last_poll`, `snapshot_at`, ...: the "shifted" fields), every other field equal
  (state, reason, detail, counts, clocks; a count that grows, a clock that runs, a detail that
  says for how long: not steady).

Then the next read of that snapshot, as far from the last as the last was from the one before,
is judged the same once more, its shifted fields moved on to its time, unless a deadline falls
between the two reads: judge compares the time only with the verdict's own fields (shifted ones,
a constant distance away) and with constants (`since`, `first_seen`, `operation_since`, ...) plus
a duration of the settings (`stuck_after`, `down_after`, `startup_grace`, `pause_budget`, ...). Every
constant field plus every such duration is a deadline; a read at or past the next one is judged again, and the run goes on from its answer.

tests/test_backtest_steady.py holds the replay with these reads left out to the one that judges
every read: the same verdict at the end, the same state at every read, the same episodes and alerts.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import Verdict

# Times a read of a run may differ by from its deadline and from the run's spacing (the grid's float
# rounding is far below it; a scrape interval far above it).
SLACK = 1e-3


@dataclasses.dataclass(slots=True)
class Steady:
    """A verdict that each further read of `snapshot` gives again, its `shifted` fields moved to the read's time."""

    verdict: Verdict  # as judged at `judged_at`
    shifted: tuple[str, ...]
    judged_at: float
    spacing: float  # the time between the two reads that showed it steady
    deadlines: tuple[float, ...]  # sorted
    at: float = dataclasses.field(init=False)  # the last read it covers

    def __post_init__(self) -> None:
        self.at = self.judged_at

    def covers(self, at: float) -> bool:
        """A read at `at` (of the same snapshot) gives the verdict again: as far from the last read as the run's
        spacing, and no deadline from the last read to this one. Then it is the last read covered."""
        if abs(at - self.at - self.spacing) > SLACK:
            return False
        index = bisect.bisect_left(self.deadlines, self.at - SLACK)
        if index < len(self.deadlines) and self.deadlines[index] <= at + SLACK:
            return False
        self.at = at
        return True

    def current(self) -> Verdict:
        """The verdict of the last read covered: the judged one, its shifted fields at that read's time."""
        if self.at == self.judged_at:
            return self.verdict
        moved: dict[str, Any] = dict.fromkeys(self.shifted, self.at)
        return dataclasses.replace(self.verdict, **moved)


def steady(before: Verdict | None, before_at: float | None, after: Verdict, at: float,
           settings: TargetSettings) -> Steady | None:
    """The run `after` starts, when it is `before` (judged at `before_at` on the same snapshot) moved on in time only."""
    if before is None or before_at is None or type(before) is not Verdict or type(after) is not Verdict:
        return None  # a verdict of another shape (a test's stand-in): judged read by read
    shifted: list[str] = []
    constants: list[float] = []
    for name in _FIELDS:
        old, new = getattr(before, name), getattr(after, name)
        if old is new or old == new:
            if isinstance(new, float) and not isinstance(new, bool):
                constants.append(new)
        elif old == before_at and new == at:
            shifted.append(name)
        else:
            return None
    if not shifted or not all(math.isfinite(c) for c in constants):
        return None
    if after.snapshot is not None and after.snapshot.process_start_time is not None:
        constants.append(after.snapshot.process_start_time)
    deadlines = sorted({c + d for c in constants for d in durations(settings)})
    return Steady(after, tuple(shifted), at, at - before_at, tuple(deadlines))


_FIELDS = tuple(f.name for f in dataclasses.fields(Verdict))


def durations(settings: TargetSettings) -> tuple[float, ...]:
    """Every time span judge may compare a verdict's field with: 0 and each duration of the settings (the canary's
    included). judge compares the time with a field plus one setting (`now - since >= pause_budget`,
    `now - last_progress >= stuck_after`, `now - first_seen < startup_grace`, ...), never with a multiple."""
    known = _DURATIONS.get(id(settings))
    if known is None or known[0] is not settings:
        known = _DURATIONS[id(settings)] = (settings, _durations(settings))
    return known[1]


# Per settings object (a frozen model, shared by every replay judged with it): its durations.
_DURATIONS: dict[int, tuple[TargetSettings, tuple[float, ...]]] = {}


def _durations(settings: TargetSettings) -> tuple[float, ...]:
    single = {v for v in _numbers(settings.model_dump()) if math.isfinite(v) and v >= 0} | {settings.canary.freshness}
    return tuple(sorted({0.0} | single))


def _numbers(value: object) -> Iterable[float]:
    """The durations among a settings document's values: its floats (counts and flags are ints and bools)."""
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _numbers(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _numbers(item)
