"""The fleet's pace readings, by peer group: what the pace rule (pace.py) needs of every target's peers.

The poller hands each target's snapshot in after its poll (`observe`); the tracker keeps each
unit's readings within `pace.window`, its measure, and which targets are peers, and answers the
target's `Pace` by the pure rule. No I/O, no clock of its own: `now` comes in. A target removed
from the store is forgotten (`forget`), so it is nobody's peer any more.
"""

from __future__ import annotations

from llm_vitals.exporter.engines import PageReading
from llm_vitals.exporter.pace import Measure, Pace, PaceRules, Reading, add_reading, judge_pace, measure


def unit_readings(snapshot: PageReading, now: float) -> dict[str, Reading]:
    """The snapshot's pace readings by unit: each data-parallel unit that carries its own, else the whole server ('')."""
    units = {unit.name: Reading(now, *unit.pace) for unit in snapshot.units if unit.pace is not None}
    if units:
        return units
    return {"": Reading(now, *snapshot.pace)} if snapshot.pace is not None else {}


_NEVER: tuple[float, tuple[Measure, ...]] = (float("-inf"), ())
READS_PER_WINDOW = 6


class PaceTracker:
    """Every target's pace readings and measures, and its peer group."""

    def __init__(self) -> None:
        self._group: dict[str, str] = {}  # target -> its peer group
        self._members: dict[str, set[str]] = {}  # peer group -> its targets
        self._readings: dict[str, dict[str, tuple[Reading, ...]]] = {}  # target -> unit -> readings in the window
        self._measures: dict[str, tuple[float, tuple[Measure, ...]]] = {}  # target -> (last read at, its units' measures)

    def observe(self, name: str, group: str, snapshot: PageReading | None, now: float, rules: PaceRules,
                previous: Pace) -> Pace:
        """Take in a poll of target `name` (None: no snapshot: a failed read, a proxy) and judge its pace now.

        A poll without a snapshot is no evidence: the judgement stays as it was, and the target's
        measure ages out of its peers' view once its last reading is older than the window.
        """
        if self._group.get(name) != group:
            self._join(name, group)
        if snapshot is None:
            return previous
        window = rules.window
        # A pace over a window needs no reading every poll: one per sixth of the window (20 s of the
        # 2-minute default, one poll in four at 5 s) judges as well, at a quarter of the cost.
        last = self._measures.get(name)
        if last is not None and now - last[0] < window / READS_PER_WINDOW:
            return previous
        kept = self._readings.get(name)
        if kept is None:
            kept = self._readings[name] = {}
        if snapshot.units or snapshot.pace is None:
            readings = unit_readings(snapshot, now)
            for unit in [unit for unit in kept if unit not in readings]:
                del kept[unit]
            for unit, reading in readings.items():
                kept[unit] = add_reading(kept.get(unit, ()), reading, window)
        else:  # one server, one pace: the common case, without the per-unit dicts
            if len(kept) != 1 or "" not in kept:
                kept.clear()
            kept[""] = add_reading(kept.get("", ()), Reading(now, *snapshot.pace), window)
        mine = [(unit, measure(values)) for unit, values in kept.items()]
        self._measures[name] = (now, tuple(m for _, m in mine))
        if not mine:
            return judge_pace([], previous, now, rules)
        others: list[Measure] = []
        for peer in self._members[group]:
            if peer != name:
                at, measures = self._measures.get(peer, _NEVER)
                if now - at <= window:
                    others.extend(measures)
        if len(mine) == 1:
            return judge_pace([("", mine[0][1], others)], previous, now, rules)
        return judge_pace([(unit, own, others + [m for other, m in mine if other != unit]) for unit, own in mine],
                          previous, now, rules)

    def _join(self, name: str, group: str) -> None:
        before = self._group.get(name)
        if before is not None:
            self._members[before].discard(name)
        self._group[name] = group
        self._members.setdefault(group, set()).add(name)

    def forget(self, name: str) -> None:
        """The target is gone: its readings and its place among its peers."""
        group = self._group.pop(name, None)
        if group is not None:
            members = self._members[group]
            members.discard(name)
            if not members:
                del self._members[group]
        self._readings.pop(name, None)
        self._measures.pop(name, None)
