"""Histories for the backtest's tests and bench, made of the real vLLM page in tests/fixtures/.

Each scrape is the real busy page's series (its labels, its start time, its KV usage), with the
counters moved as the phase says:

    saturated  2 running, 6 waiting (the page's own), steps and tokens moving every scrape, one
               request finished a minute, each after queueing 300 s (the queue-time histogram)
    hang       nothing moves; running and waiting stay as they were
    gap        no scrape at all for the phase's length
    restart    a new process (start time = now), every counter from 0; then as `saturated`
    idle       nothing running or waiting, nothing moving

A history is written out as `Series` (the in-memory `MemorySource`, below the HTTP layer) or as
OpenMetrics for `promtool tsdb create-blocks-from openmetrics` (a real Prometheus).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llm_vitals.backtest.history import Series
from llm_vitals.backtest.replay import QUEUE_TIME_FAMILIES
from llm_vitals.exporter.engines import vllm
from llm_vitals.exporter.engines.scan import Scanner
from llm_vitals.targets import UNHEALTHY_STATES

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm" / "vllm-0.32.0-cpu-metrics-busy.txt"
WANTED = (*vllm.SCANNER.names, *QUEUE_TIME_FAMILIES)
COUNTERS = {vllm.STEPS: 30.0, vllm.GENERATION_TOKENS: 60.0, vllm.PROMPT_TOKENS: 5.0}
QUEUED_FOR = 300.0  # seconds each finished request waited in the queue while saturated


@dataclass(frozen=True)
class Phase:
    kind: str  # saturated | hang | gap | restart | idle
    seconds: float = 0.0


def _template() -> list[tuple[str, dict[str, str], float]]:
    found = Scanner(WANTED).scan(FIXTURE.read_text())
    return [(name, dict(s.labels()), s.value) for name in WANTED for s in found.get(name, [])]


def scrapes(start: float, phases: Sequence[Phase], interval: float = 15.0) -> list[tuple[float, list[tuple[str, dict[str, str], float]]]]:
    """Every scrape of one target: (time, [(name, labels, value)]) by the phases' script."""
    template = _template()
    values = {(name, tuple(sorted(labels.items()))): value for name, labels, value in template}
    out: list[tuple[float, list[tuple[str, dict[str, str], float]]]] = []
    at = start
    scrape_index = 0
    # The process started a minute before the history does.
    values.update({key: start - 60.0 for key in values if key[0] == vllm.START_TIME})

    def set_all(name: str, value_of) -> None:
        for key in list(values):
            if key[0] == name:
                values[key] = value_of(key, values[key])

    for phase in phases:
        if phase.kind == "restart":
            for key in values:
                if key[0] in (*COUNTERS, vllm.FINISHED, *QUEUE_TIME_FAMILIES):
                    values[key] = 0.0
            set_all(vllm.START_TIME, lambda key, old, now=at: float(int(now)))
            continue
        end = at + phase.seconds
        while at < end:
            if phase.kind == "gap":
                at += interval
                continue
            if phase.kind in ("saturated", "idle"):
                busy = phase.kind == "saturated"
                set_all(vllm.RUNNING, lambda key, old, busy=busy: 2.0 if busy else 0.0)
                set_all(vllm.WAITING, lambda key, old, busy=busy: 6.0 if busy else 0.0)
            if phase.kind == "saturated":
                for name, per_scrape in COUNTERS.items():
                    set_all(name, lambda key, old, d=per_scrape: old + d)
                if scrape_index % 4 == 0:  # one request a minute
                    set_all(vllm.FINISHED, lambda key, old: old + (1 if dict(key[1]).get("finished_reason") == "length" else 0))
                    set_all(QUEUE_TIME_FAMILIES[1], lambda key, old: old + 1)
                    set_all(QUEUE_TIME_FAMILIES[0], lambda key, old: old + (1 if float(dict(key[1])["le"]) >= QUEUED_FOR else 0))
            out.append((at, [(name, dict(labels), value) for (name, labels), value in values.items()]))
            scrape_index += 1
            at += interval
    return out


def as_series(instance: str, history: Iterable[tuple[float, list[tuple[str, dict[str, str], float]]]],
              job: str = "vllm", extra: dict[str, str] | None = None) -> list[Series]:
    """The history as Prometheus would hold it: one Series per name and label set, with instance and job."""
    by_key: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[list[float], list[float]]] = {}
    for at, samples in history:
        for name, labels, value in samples:
            full = {**labels, "instance": instance, "job": job, **(extra or {})}
            times, values = by_key.setdefault((name, tuple(sorted(full.items()))), ([], []))
            times.append(at)
            values.append(value)
    return [Series(name, dict(labels), times, values) for (name, labels), (times, values) in by_key.items()]


def openmetrics(series: Iterable[Series]) -> str:
    """OpenMetrics text for `promtool tsdb create-blocks-from openmetrics`: each family's lines together."""
    by_name: dict[str, list[Series]] = {}
    for one in series:
        by_name.setdefault(one.name, []).append(one)
    lines: list[str] = []
    for name, group in sorted(by_name.items()):
        lines.append(f"# TYPE {name} gauge")
        for one in group:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(one.labels.items()))
            for at, value in zip(one.times, one.values, strict=True):
                lines.append(f"{name}{{{labels}}} {value!r} {at:.3f}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


_NAMES = re.compile(r'__name__(=~?)"([^"]*)"')
_OTHER = re.compile(r'([a-zA-Z_]+)="([^"]*)"')


class MemorySource:
    """The backtest's Source over series in memory: the same pass as against Prometheus, below the HTTP layer."""

    def __init__(self, series: Iterable[Series]) -> None:
        self.by_name: dict[str, list[Series]] = {}
        for one in series:
            self.by_name.setdefault(one.name, []).append(one)
        self.queries = 0

    @staticmethod
    def _parse(selector: str) -> tuple[set[str], dict[str, str]]:
        match = _NAMES.search(selector)
        assert match is not None, selector
        names = set(match.group(2).split("|")) if match.group(1) == "=~" else {match.group(2)}
        rest = selector[:match.start()] + selector[match.end():]
        return names, dict(_OTHER.findall(rest))

    def _matching(self, selector: str) -> Iterable[Series]:
        names, matchers = self._parse(selector)
        for name in names:
            for one in self.by_name.get(name, []):
                if all(one.labels.get(k) == v for k, v in matchers.items()):
                    yield one

    def series(self, selector: str, start: float, end: float) -> list[dict[str, str]]:
        self.queries += 1
        return [{"__name__": one.name, **one.labels} for one in self._matching(selector)
                if any(start <= t <= end for t in one.times)]

    def samples(self, selector: str, start: float, end: float) -> list[Series]:
        import bisect

        self.queries += 1
        out = []
        for one in self._matching(selector):
            low, high = bisect.bisect_right(one.times, start), bisect.bisect_right(one.times, end)
            if high > low:
                out.append(Series(one.name, one.labels, one.times[low:high], one.values[low:high]))
        return out


def unhealthy(episodes: Iterable[dict]) -> list[str]:
    """The states of the episodes that are unhealthy (stuck, unresponsive, down), in order: what a test
    asserts exactly, whatever the verdict calls the first read after a restart (busy or starting)."""
    return [e["state"] for e in episodes if e["state"] in UNHEALTHY_STATES]
