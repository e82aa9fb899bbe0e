"""The /metrics page from text kept per target, rendered only when read: a scrape renders again the
targets that changed since the scrape before, keeps their lines, and joins every target's lines.

Why: at 5,000 targets the page is ~120,000 lines, and rendering it whole on every scrape held the
event loop for ~0.2 s. Rendering each target at its poll instead made a scrape cheap but every
poll dearer, while polls come every few seconds and scrapes every 15-60 s. So a change only bumps
the record's version (llm_vitals/exporter/state.py), and the next scrape renders each target whose
version moved, at most once, in slices that hand the loop back.

A target's lines also change with the scrape's `now` alone (stuck seconds, readiness freshness,
liveness budget, the backstop's mode): the scrape compares those four too. The page is byte for byte what the page
rendered whole from the same store writes (tests/test_page_cache.py checks it over many histories).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from llm_vitals.exporter.collector import FAMILY_HEADS, read, target_texts, targets_text
from llm_vitals.exporter.state import TargetRecord


@dataclass(frozen=True, slots=True)
class Rendered:
    """One target's lines, one piece per family of FAMILIES (maybe empty), and what they were rendered from."""

    version: int  # the record's version
    stuck: float  # the three values that move with `now` alone, at the render's `now`
    ready: bool
    live: bool
    texts: tuple[bytes, ...]
    backstop: str | None = None  # the backstop's mode, which moves with `now` too (silence arms it)

    def shows(self, record: TargetRecord, now: float) -> bool:
        """Whether these lines are still what a render of `record` at `now` would write."""
        return (
            self.version == record.version
            and self.stuck == record.verdict.stuck_for(now)
            and self.ready == record.ready(now)
            and self.live == record.live(now)
            and self.backstop == _mode(record, now)
        )


def _mode(record: TargetRecord, now: float) -> str | None:
    backstop = record.backstop(now)
    return None if backstop is None else f"{backstop.mode}:{backstop.reason}:{record.held_back(now)}"


def render_target(record: TargetRecord, now: float, wall: float | None = None) -> Rendered:
    """The lines of one target for every family, from one reading of it at `now` (monotonic; `wall`: the same in Unix time)."""
    reading = read(record, now, wall)
    return Rendered(record.version, reading.verdict.stuck_for(now), reading.ready, reading.live, target_texts(reading, now),
                    _mode(record, now))


class PageCache:
    """Each target's lines as the last scrape rendered them, by record.

    Keyed by the record itself, not its name: a target replaced by discovery or a reload is a new
    record, rendered afresh. A record dropped from the store is forgotten at the next scrape.
    """

    def __init__(self) -> None:
        self._kept: dict[TargetRecord, Rendered] = {}
        self.renders = 0  # targets rendered since the start

    def kept(self, record: TargetRecord) -> Rendered | None:
        """The lines kept for `record`, None when none are."""
        return self._kept.get(record)

    def current(self, record: TargetRecord, now: float, wall: float | None = None) -> Rendered:
        """The record's kept lines when they still hold at `now`, else rendered again (and kept)."""
        kept = self._kept.get(record)
        if kept is None or not kept.shows(record, now):
            kept = self._kept[record] = render_target(record, now, wall)
            self.renders += 1
        return kept

    def pieces(
        self,
        records: Sequence[TargetRecord],
        now: float,
        *,
        wall: float | None = None,
        budget: float = 0.0005,
        group: int = 1000,
        clock: Callable[[], float] = time.perf_counter,
    ) -> Iterator[bytes]:
        """The page, in pieces; between two pieces the caller may hand the event loop back.

        First every target is read once (`current`: rendered again only when it changed), the clock
        looked at every 8 targets and a step ended (an empty piece) once `budget` seconds are
        spent; then each family's lines are joined `group` targets at a time. Every line comes from
        that one reading of each target, whatever runs between steps. `now` is monotonic, `wall`
        the same instant in Unix time for the timestamps shown (`now` when not given).
        """
        kept: list[Rendered] = []
        started = clock()
        for index, record in enumerate(records):
            kept.append(self.current(record, now, wall))
            if index % 8 == 7 and clock() - started > budget:
                yield b""
                started = clock()
        if len(self._kept) > len(records):  # some target left the store: forget its lines
            self._kept = {record: self._kept[record] for record in records if record in self._kept}
        for family_index, head in enumerate(FAMILY_HEADS):
            yield head
            for start in range(0, len(kept), group):
                joined = b"".join([entry.texts[family_index] for entry in kept[start:start + group]])
                if joined:  # (a family with no sample for these targets, e.g. requests_running when all are down)
                    yield joined
        yield targets_text(len(kept))

    def page(self, records: Sequence[TargetRecord], now: float, wall: float | None = None) -> bytes:
        """The whole page at once (see pieces)."""
        return b"".join(self.pieces(records, now, wall=wall))
