"""Raw samples of one target, as Prometheus holds them, turned into the reads the exporter would have made. Pure.

A read happens at each point of a grid `step` apart. It sees the target's latest scrape within
`(at - step, at]`: every series of that scrape, written back as the lines of a `/metrics` page, so
the engine's own adapter (exporter/engines/) parses it into its PageReading, exactly as the exporter
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
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from llm_vitals.exporter.engines.scan import Sample

_new_sample = tuple.__new__  # a Sample without NamedTuple's __new__ in Python (as the scanner makes them)

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


@dataclass(slots=True)
class Read:
    """One read the exporter would have made at `at`: a page, or None when no scrape fell in its window.

    `extra` holds the scrape's values of families the engine's adapter does not read (the watchdog's
    queue-time histogram, Prometheus's `up`), by page line prefix: kept off the page the adapter scans.
    """

    at: float
    page: str | None
    scraped_at: float | None = None
    extra: Mapping[str, float] = field(default_factory=dict)
    # The fast path (`Columns`): the samples the adapter's scanner would have found on the page,
    # instead of the page, and what makes two reads' scrapes the same (equal keys: equal samples).
    found: Mapping[str, list[Sample]] | None = None
    key: object = None

    @property
    def scraped(self) -> bool:
        """A scrape with the engine's samples fell within this read's window."""
        return self.page is not None or self.found is not None


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
    extras: list[dict[str, float]] = field(default_factory=list)
    duplicates: set[str] = field(default_factory=set)  # page lines two series wrote at one scrape

    @classmethod
    def of(cls, series: Iterable[Series], extra_names: Iterable[str] = ()) -> Scrapes:
        """Gather the series of one target by scrape time (every series of one scrape shares its timestamp);
        series of `extra_names` are kept off the page (Read.extra)."""
        off_page = frozenset(extra_names)
        rows: dict[float, tuple[dict[str, str], dict[str, float]]] = {}
        duplicates: set[str] = set()
        for one in series:
            prefix = line_prefix(one)
            extra = one.name in off_page
            for at, value in zip(one.times, one.values, strict=True):
                row = rows.get(at)
                if row is None:
                    row = rows[at] = ({}, {})
                if prefix in row[extra]:
                    duplicates.add(prefix)
                elif extra:
                    row[1][prefix] = value
                else:
                    row[0][prefix] = f"{prefix} {format_value(value)}\n"
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


@dataclass(frozen=True, slots=True)
class Column:
    """One page line of a target's scrapes over one chunk: a series (or its relabelled duplicates)."""

    name: str
    label_text: str  # `{a="x"}` as the page writes it, '' for none: what the scanner's Sample holds
    off_page: bool  # a family the adapter does not read (Read.extra)

    @property
    def prefix(self) -> str:
        return self.name + self.label_text


# Columns._layout: the families' lines (label set, column), the off-page lines (prefix, column).
Layout = tuple[list[tuple[str, list[tuple[str, int]]]], list[tuple[str, int]]]
# Columns._make: the families' names; per scrape, each family's samples; the off-page prefixes; per scrape, their values.
# Columns._make: the families in page order (those whose lines held, with their samples); the families of one
# line that moved (name, label set, column); those of several lines, one of which moved, each line's (label set,
# column, its sample where it held); the off-page lines; the scrapes that left a line out (None in their row),
# whose samples are made as each is read.
Made = tuple[dict[str, list[Sample]], list[tuple[str, str, int]], list[tuple[str, list[tuple[str, int, Sample | None]]]],
             list[tuple[str, int]], frozenset[int]] | tuple[()]


@dataclass
class Columns:
    """One target's scrapes over one chunk as columns of samples: the fast form of `Scrapes`.

    The same reads as `Scrapes.read_at`, without writing a page and scanning it back: each read
    carries the samples the scanner would have found (`Read.found`), built once per distinct scrape
    (a run of identical scrapes, an idle or hung server's, is one set of samples and one key).
    tests/test_backtest_fast.py holds the two forms to the same result on hostile histories.
    """

    columns: tuple[Column, ...]
    times: list[float]
    rows: list[tuple[float | None, ...]]  # per scrape, per column: its value, None where it wrote none
    duplicates: set[str] = field(default_factory=set)
    complete: bool = False  # every scrape wrote every line (no None in any row)
    # The last scrape built: (its index, its row, key, samples, off-page lines).
    _last: tuple[int, tuple[float | None, ...], object, Mapping[str, list[Sample]] | None, dict[str, float]] | None = None
    _groups: Layout | None = None
    _made: Made | None = None  # what the chunk's scrapes share (`_make`)

    @classmethod
    def of(cls, series: Sequence[Series], extra_names: Iterable[str] = ()) -> Columns:
        """Gather the series of one target into columns by page line, rows by scrape time (as `Scrapes.of`)."""
        off_page = frozenset(extra_names)
        index: dict[str, int] = {}
        columns: list[Column] = []
        members: list[list[Series]] = []
        for one in series:
            if not one.times:
                continue  # a series with no sample in this chunk writes no line: no column
            prefix = line_prefix(one)
            place = index.get(prefix)
            if place is None:
                index[prefix] = len(columns)
                columns.append(Column(one.name, prefix[len(one.name):], one.name in off_page))
                members.append([one])
            else:
                members[place].append(one)
        first = members[0][0].times if members else ()
        duplicates: set[str] = set()
        if all(len(group) == 1 and group[0].times == first for group in members):
            # The common case: every series was scraped at every scrape (arrays compare in C).
            times = list(first)
            rows = list(zip(*(group[0].values for group in members), strict=True)) if members else []
            complete = True
        else:
            times = sorted({at for group in members for one in group for at in one.times})
            where = {at: i for i, at in enumerate(times)}
            table: list[list[float | None]] = []
            for group in members:
                values: list[float | None] = [None] * len(times)
                for one in group:
                    for at, value in zip(one.times, one.values, strict=True):
                        row = where[at]
                        if values[row] is not None:
                            duplicates.add(columns[len(table)].prefix)  # the first series of the line wins
                            continue
                        values[row] = value
                table.append(values)
            rows = list(zip(*table, strict=True)) if table else []
            complete = all(None not in values for values in table)
        return cls(tuple(columns), times, rows, duplicates, complete)

    def read_at(self, at: float, step: float, start: int = 0) -> tuple[Read, int]:
        """The read at `at` and the scrape index to start the next read's search from (reads come in order)."""
        index = bisect.bisect_right(self.times, at, start) - 1
        if index < 0 or self.times[index] <= at - step:
            return Read(at, None), max(start, index)
        last = self._last
        if last is None or last[0] != index:
            row = self.rows[index]
            # A scrape equal to the last one built (an idle or hung server's) keeps its samples and key:
            # the same objects, so what is read of them (the snapshot) is read once per run.
            same = last is not None and (last[1] is row or last[1] == row)
            self._last = last = (index, *last[1:]) if same and last is not None else (index, row, *self._found(index))
        _, _, key, found_now, extra_now = last
        # A scrape with nothing of the engine's (only `up`, at 0: Prometheus's scrape failed) is no page.
        return Read(at, None, self.times[index], extra_now, found_now, key), index

    def _found(self, index: int) -> tuple[object, Mapping[str, list[Sample]] | None, dict[str, float]]:
        """(key, the samples by family the scanner would have found, the off-page lines) of one scrape."""
        row = self.rows[index]
        made = self._made if self._made is not None else self._make()
        if made and index not in made[4]:
            # Every line present (the common scrape): the lines that held over the chunk are shared, only
            # the families that moved are made (in page order: their place in the dict is kept).
            held, moving_lines, moving, off_page, _ = made
            found = held.copy()
            for name, label_text, i in moving_lines:
                found[name] = [_new_sample(Sample, (label_text, row[i]))]
            for name, lines in moving:
                found[name] = [_new_sample(Sample, (label_text, row[i])) if sample is None else sample
                               for label_text, i, sample in lines]
            # A complete row has no None: what mypy cannot know of the row's type.
            return (self.columns, row), found, {prefix: row[i] for prefix, i in off_page}  # type: ignore[misc]
        groups, off_page = self._layout()
        found = {}
        for name, members in groups:
            some = [_new_sample(Sample, (label_text, row[i])) for label_text, i in members if row[i] is not None]
            if some:
                found[name] = some
        extra = {prefix: value for prefix, i in off_page if (value := row[i]) is not None}
        return ((self.columns, row) if found else None), (found or None), extra

    def _make(self) -> Made:
        """What every scrape of the chunk that wrote every line shares: the samples of the lines whose value held
        over the whole chunk (a gauge at rest, a counter that did not move, a sleep state: one sample, and one
        list for a family of them, for all), and the families with a line that moved, made at each scrape.
        () where a family has no line (no scrape is a page): each scrape's samples are made as it is read."""
        groups, off_page = self._layout()
        rows = self.rows
        if not groups or not rows:
            self._made = ()
            return ()
        partial = frozenset() if self.complete else frozenset(i for i, row in enumerate(rows) if None in row)
        columns = list(zip(*rows, strict=True))  # per line, its value at each scrape
        held: dict[str, list[Sample]] = {}
        moving_lines: list[tuple[str, str, int]] = []
        moving: list[tuple[str, list[tuple[str, int, Sample | None]]]] = []
        for name, members in groups:
            shared = [_held(label_text, columns[i], partial) for label_text, i in members]
            if all(sample is not None for sample in shared):
                held[name] = shared  # type: ignore[assignment]
            else:
                held[name] = []  # its place in page order; each scrape's own list replaces it
                if len(members) == 1:
                    moving_lines.append((name, *members[0]))
                    continue
                moving.append((name, [(label_text, i, sample) for (label_text, i), sample in zip(members, shared, strict=True)]))
        self._made = (held, moving_lines, moving, off_page, partial)
        return self._made

    def _layout(self) -> Layout:
        # The page's families in page order, each with its lines' (label set, column); the off-page lines.
        if self._groups is None:
            groups: dict[str, list[tuple[str, int]]] = {}
            for i, column in enumerate(self.columns):
                if not column.off_page:
                    groups.setdefault(column.name, []).append((column.label_text, i))
            self._groups = (list(groups.items()), [(c.prefix, i) for i, c in enumerate(self.columns) if c.off_page])
        return self._groups

    def page_names(self) -> frozenset[str]:
        """The families of the engine's own on this target's page."""
        return frozenset(column.name for column in self.columns if not column.off_page)


def _held(label_text: str, values: Sequence[float | None], partial: frozenset[int]) -> Sample | None:
    """The one sample of a line whose value held over every scrape that wrote every line, else None.

    Held means the same float, bit for bit: 0.0 and -0.0 are written apart on the page ("-0.0"), and a
    NaN, equal to nothing, is a sample of its own at each scrape."""
    whole = [value for k, value in enumerate(values) if k not in partial] if partial else values
    if not whole:
        return None
    first = whole[0]
    # list.count matches by identity or ==: a NaN other than the first object never counts.
    if first is None or whole.count(first) != len(whole):
        return None
    if not first and array("d", cast("Sequence[float]", whole)).tobytes() != array("d", (first,)).tobytes() * len(whole):
        return None
    return _new_sample(Sample, (label_text, first))
