"""The /metrics page from text kept per target: each target's samples are rendered when its reading
changes (a poll, a canary, a drain), kept on its own record, and a scrape only joins them.

Why: at 5,000 targets the page is ~120,000 lines, and rendering it whole on every scrape held the
event loop for ~0.2 s, while each target's lines change only when that target is polled. A target
dropped from the store takes its text with it, since the text lives on its record.

A scrape still reads every target once (`current`): when anything the page shows differs from what
the kept text was rendered from (a writer that did not re-render, or a value that depends on the
scrape's `now`: stuck seconds, readiness freshness, liveness budget), that target is rendered
again from one fresh reading. The page is byte for byte what `collector.render_vitals` writes
(tests/test_page_cache.py checks it over many readings).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from llm_vitals.exporter.collector import (
    FAMILIES,
    TARGETS_HELP,
    TARGETS_NAME,
    Reading,
    _around_target,
    _escape_label,
    _help_line,
    _number,
    read,
)
from llm_vitals.exporter.state import TargetRecord

# Each family's HELP and TYPE lines, written once per process.
_HEADS = tuple(_help_line(family.name, family.kind, family.help).encode() for family in FAMILIES)


@dataclass(frozen=True, slots=True)
class Rendered:
    """One target's lines, one piece per family of FAMILIES (maybe empty), and what they were rendered from."""

    reading: Reading
    stuck: float  # the verdict's stuck seconds at the `now` of the render
    texts: tuple[bytes, ...]

    def shows(self, record: TargetRecord, now: float) -> bool:
        """Whether these lines are still what a fresh reading of `record` at `now` would render.

        Compares every input of Reading (the verdict by identity: a poll replaces it, never edits
        it), and the three values that move with `now` alone.
        """
        kept = self.reading
        verdict = record.verdict
        return (
            kept.verdict is verdict
            and kept.settings is record.settings
            and kept.draining == record.draining
            and kept.gpu_fault == (record.gpu_fault is not None)
            and kept.poll_duration == record.poll_duration
            and kept.poll_errors == record.poll_errors
            and kept.canaries == record.canaries
            and self.stuck == verdict.stuck_for(now)
            and kept.ready == record.ready(now)
            and kept.live == record.live(now)
        )


def render_target(reading: Reading, now: float) -> Rendered:
    """The lines of one target for every family, as `collector.render_families` writes them."""
    target = f'target="{_escape_label(reading.name)}"'
    texts = []
    for family in FAMILIES:
        name = family.name
        if not family.more_labels:
            lines = [f"{name}{{{target}}} {_number(value)}\n" for _, value in family.rows(reading, now)]
        else:
            lines = []
            for more, value in family.rows(reading, now):
                before, after = _around_target(family.labels, more)
                lines.append(f"{name}{{{before}{target}{after}}} {_number(value)}\n")
        texts.append("".join(lines).encode())
    return Rendered(reading, reading.verdict.stuck_for(now), tuple(texts))


def refresh(record: TargetRecord, now: float) -> None:
    """Render `record` again from one reading now: called by whatever just changed it."""
    record.rendered = render_target(read(record, now), now)


def current(record: TargetRecord, now: float) -> Rendered:
    """The record's kept lines when they still hold at `now`, else rendered again (and kept)."""
    kept = record.rendered
    if kept is None or not kept.shows(record, now):
        kept = record.rendered = render_target(read(record, now), now)
    return kept


def page_pieces(
    records: Sequence[TargetRecord],
    now: float,
    *,
    budget: float = 0.0005,
    group: int = 1000,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[bytes]:
    """The page, in pieces; between two pieces the caller may hand the event loop back.

    First every target is read once (`current`), at most `budget` seconds of it per step (an
    empty piece marks a step's end); then each family's lines are joined `group` targets at a
    time. Every line comes from that one reading of each target, whatever runs between steps.
    """
    kept: list[Rendered] = []
    started = clock()
    for index, record in enumerate(records):
        kept.append(current(record, now))
        if index % 32 == 31 and clock() - started > budget:
            yield b""
            started = clock()
    for family_index, head in enumerate(_HEADS):
        yield head
        for start in range(0, len(kept), group):
            joined = b"".join([entry.texts[family_index] for entry in kept[start:start + group]])
            if joined:  # (a family with no sample for these targets, e.g. requests_running when all are down)
                yield joined
    yield (_help_line(TARGETS_NAME, "gauge", TARGETS_HELP) + f"{TARGETS_NAME} {_number(len(kept))}\n").encode()


def render_page(records: Sequence[TargetRecord], now: float) -> bytes:
    """The whole page at once (see page_pieces)."""
    return b"".join(page_pieces(records, now))
