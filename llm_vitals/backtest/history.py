"""Raw samples of one target, as Prometheus holds them, turned into the reads the exporter would have made. Pure.

A read happens at each point of a grid `step` apart. It sees the target's latest scrape within
`(at - step, at]`: every series of that scrape, written back as the lines of a `/metrics` page, so
the engine's own adapter (exporter/engines/) parses it into its Snapshot, exactly as the exporter
would have. No scrape within the window is a missed read (the exporter's rule for a read that
failed: evidence of nothing, `down` only after `down_after`).

What Prometheus adds to a series (the target labels: job, instance, pod, ...) is not on the page;
two series that differ only in those, seen at one scrape, are the same page line twice (a relabel
that duplicated them): the first is kept and the duplicate is reported, never summed.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

# Labels Prometheus (service discovery, relabelling, federation) puts on a series, never the engine.
TARGET_LABELS = frozenset({
    "__name__", "instance", "job", "namespace", "pod", "service", "endpoint", "container", "node",
    "prometheus", "prometheus_replica", "workload",
})


@dataclass(frozen=True, slots=True)
class Series:
    """One series of one family over one chunk of the window: its labels (no `__name__`) and raw samples."""

    name: str
    labels: Mapping[str, str]
    times: Sequence[float]
    values: Sequence[float]


@dataclass(frozen=True, slots=True)
class Read:
    """One read the exporter would have made at `at`: a page, or None when no scrape fell in its window.

    `extra` holds the scrape's lines of families the engine's adapter does not read (the watchdog's
    queue-time histogram), by page line prefix: kept off the page the adapter scans.
    """

    at: float
    page: str | None
    scraped_at: float | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


def escape(value: str) -> str:
    """A label value as the text format writes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def line_prefix(series: Series) -> str:
    """`name{labels}` of the page line a series is, target labels left out (sorted, escaped)."""
    labels = sorted((k, v) for k, v in series.labels.items() if k not in TARGET_LABELS)
    if not labels:
        return series.name
    return series.name + "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels) + "}"


_SPECIAL = {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}


def format_value(value: float) -> str:
    """A sample value as the text format writes it (NaN and ±Inf included: the adapter decides on them)."""
    text = repr(value)
    return _SPECIAL.get(text, text)


@dataclass
class Scrapes:
    """One target's scrapes over one chunk: scrape time -> the page lines of that scrape, in order."""

    times: list[float] = field(default_factory=list)
    # Per scrape: its page lines (prefix -> the whole line) and the lines kept off the page (prefix -> value).
    lines: list[dict[str, str]] = field(default_factory=list)
    extras: list[dict[str, str]] = field(default_factory=list)
    duplicates: set[str] = field(default_factory=set)  # page lines two series wrote at one scrape

    @classmethod
    def of(cls, series: Iterable[Series], extra_names: Iterable[str] = ()) -> Scrapes:
        """Gather the series of one target by scrape time (every series of one scrape shares its timestamp);
        series of `extra_names` are kept off the page (Read.extra)."""
        off_page = frozenset(extra_names)
        rows: dict[float, tuple[dict[str, str], dict[str, str]]] = {}
        duplicates: set[str] = set()
        for one in series:
            prefix = line_prefix(one)
            extra = one.name in off_page
            for at, value in zip(one.times, one.values, strict=True):
                row = rows.get(at)
                if row is None:
                    row = rows[at] = ({}, {})
                kept = row[1] if extra else row[0]
                if prefix in kept:
                    duplicates.add(prefix)
                    continue
                kept[prefix] = format_value(value) if extra else f"{prefix} {format_value(value)}\n"
        times = sorted(rows)
        return cls(times, [rows[at][0] for at in times], [rows[at][1] for at in times], duplicates)

    def read_at(self, at: float, step: float) -> Read:
        """The read at `at`: the latest scrape within `(at - step, at]`, as a page; or a missed read."""
        index = bisect.bisect_right(self.times, at) - 1
        if index < 0 or self.times[index] <= at - step:
            return Read(at, None)
        page = self.lines[index]
        # A scrape with nothing of the engine's (only `up`, at 0: Prometheus's scrape failed) is no page.
        return Read(at, "".join(page.values()) if page else None, self.times[index], self.extras[index])


def grid(start: float, end: float, step: float) -> Iterator[float]:
    """The read times from `start` to `end` inclusive, `step` apart (computed, not summed: no drift)."""
    count = math.floor((end - start) / step + 1e-9)
    for k in range(count + 1):
        yield start + k * step


def scrape_interval(times: Sequence[float]) -> float | None:
    """The median gap between a target's scrapes, or None with fewer than two."""
    gaps = sorted(b - a for a, b in itertools.pairwise(times) if b > a)
    return gaps[len(gaps) // 2] if gaps else None
