"""The operator's own incidents (`--incidents FILE`) and how each policy scored on them. Pure but for reading the file.

An incident names a target (its `instance`) or a selector over the targets' labels, a start, an
end, a kind (`hang`, `slow`, `down`) and a note. Each policy's alarms are scored against them:

- llm-vitals: each firing alert of a replayed rule whose severity is `critical` or `warning` (an
  `info` alert, LLMServerSaturated, is a dashboard notice: no alarm), from the time its `for:`
  elapsed to its end; and each restart the gate would have allowed (a point).
- the request watchdog: each of its restart periods (docs/backtest.md, "The watchdog column").

Per target, a policy's overlapping alarms are one alarm episode (an alert and the restart it led
to are one alarm, not two). Then:

- caught: some alarm episode of the policy on a target the incident matches overlaps
  [start, end]; its lead time is the first such episode's start minus the incident's start
  (negative: the policy alarmed before the start written down);
- missed: an incident within the window that no alarm episode overlaps;
- false alarm: an alarm episode that overlaps no incident of its target (whatever the kind).

Incidents entirely outside the window, or matching no target in the history, are not scored: each
is a note.
"""

from __future__ import annotations

import csv
import io
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

KINDS = ("hang", "slow", "down")
ALARM_SEVERITIES = frozenset({"critical", "warning"})
POLICIES = ("llm-vitals", "watchdog")
FIELDS = ("target", "selector", "start", "end", "kind", "note")

_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


class IncidentsError(ValueError):
    """An incidents file that cannot be read; the message names the file, the entry and the field."""


def timestamp(text: str) -> float:
    """Unix seconds, or RFC 3339 (`2026-12-05T06:00:00Z`, with an offset or Z); ValueError otherwise."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        raise ValueError(f"not Unix seconds nor RFC 3339: {text!r}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"RFC 3339 needs an offset or Z: {text!r}")
    return parsed.timestamp()


@dataclass(frozen=True, slots=True)
class Matcher:
    label: str
    op: str  # = != =~ !~
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        have = labels.get(self.label, "")
        if self.op in ("=", "!="):
            return (have == self.value) == (self.op == "=")
        # PromQL's regex matchers are anchored.
        return (re.fullmatch(self.value, have) is not None) == (self.op == "=~")


def parse_selector(text: str) -> tuple[Matcher, ...]:
    """`{job="vllm",pod=~"llama-.*"}` -> its matchers; ValueError when it is not one."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError(f"a selector is label matchers in braces, like '{{job=\"vllm\"}}': {text!r}")
    inner, position, found = body[1:-1].strip(), 0, []
    while position < len(inner):
        match = _MATCHER.match(inner, position)
        if match is None:
            raise ValueError(f"cannot read the matchers of {text!r} from {inner[position:][:40]!r}")
        value = match.group(3).replace('\\"', '"').replace("\\\\", "\\")
        if match.group(2) in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"bad regex {value!r} in {text!r}: {exc}") from None
        found.append(Matcher(match.group(1), match.group(2), value))
        position = match.end()
    if not found:
        raise ValueError(f"a selector needs at least one matcher: {text!r}")
    return tuple(found)


@dataclass(frozen=True, slots=True)
class Incident:
    """One incident the operator remembers."""

    start: float
    end: float
    kind: str
    note: str = ""
    target: str | None = None  # an instance, exactly
    selector: str | None = None  # or label matchers over the targets' labels
    matchers: tuple[Matcher, ...] = ()

    @property
    def what(self) -> str:
        return self.target if self.target is not None else str(self.selector)

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if self.target is not None:
            return name == self.target
        return all(m.matches({**labels, "instance": name}) for m in self.matchers)


def load_incidents(path: Path) -> list[Incident]:
    """The incidents of a YAML (a list, or `incidents:` holding one) or CSV file (a header row naming the fields)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise IncidentsError(f"cannot read the incidents file {path}: {exc}") from None
    return parse_incidents(text, str(path), csv_format=path.suffix.lower() == ".csv")


def parse_incidents(text: str, source: str = "incidents", *, csv_format: bool = False) -> list[Incident]:
    """The incidents in a file's text (CSV when `csv_format`, else YAML); IncidentsError naming what is wrong."""
    rows: list[Any]
    if csv_format:
        reader = csv.DictReader(io.StringIO(text))
        unknown = sorted(set(reader.fieldnames or ()) - set(FIELDS))
        if unknown:
            raise IncidentsError(f"{source}: unknown column(s) {', '.join(unknown)} (the columns: {', '.join(FIELDS)})")
        rows = [{k: v for k, v in row.items() if v not in (None, "")} for row in reader]
    else:
        try:
            data: Any = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise IncidentsError(f"{source}: not YAML: {exc}") from None
        if isinstance(data, dict) and set(data) == {"incidents"}:
            data = data["incidents"]
        if not isinstance(data, list):
            raise IncidentsError(f"{source}: expected a list of incidents (or `incidents:` holding one)")
        rows = data
    return [_incident(row, f"{source}: incident {number}") for number, row in enumerate(rows, 1)]


def _incident(row: Any, where: str) -> Incident:
    if not isinstance(row, dict):
        raise IncidentsError(f"{where}: expected a mapping with {', '.join(FIELDS)}")
    unknown = sorted(set(map(str, row)) - set(FIELDS))
    if unknown:
        raise IncidentsError(f"{where}: unknown field(s) {', '.join(unknown)} (the fields: {', '.join(FIELDS)})")
    target, selector = row.get("target"), row.get("selector")
    if (target is None) == (selector is None):
        raise IncidentsError(f"{where}: give a target or a selector, exactly one")
    times: dict[str, float] = {}
    for key in ("start", "end"):
        value = row.get(key)
        if value is None:
            raise IncidentsError(f"{where}: no {key}")
        try:
            # YAML reads an unquoted RFC 3339 time as a datetime.
            times[key] = value.timestamp() if isinstance(value, datetime) else timestamp(str(value))
        except ValueError as exc:
            raise IncidentsError(f"{where}: {key}: {exc}") from None
        if isinstance(value, datetime) and value.tzinfo is None:
            raise IncidentsError(f"{where}: {key}: RFC 3339 needs an offset or Z: {value}")
    if times["end"] <= times["start"]:
        raise IncidentsError(f"{where}: end must be after start")
    kind = str(row.get("kind", ""))
    if kind not in KINDS:
        raise IncidentsError(f"{where}: kind must be one of {', '.join(KINDS)}, not {kind!r}")
    matchers: tuple[Matcher, ...] = ()
    if selector is not None:
        try:
            matchers = parse_selector(str(selector))
        except ValueError as exc:
            raise IncidentsError(f"{where}: selector: {exc}") from None
    return Incident(times["start"], times["end"], kind, str(row.get("note") or ""),
                    str(target) if target is not None else None, str(selector) if selector is not None else None,
                    matchers)


@dataclass(frozen=True, slots=True)
class Alarm:
    """One alarm episode of one policy on one target: overlapping alarms merged; `what` names them."""

    policy: str
    target: str
    start: float
    end: float
    what: str


def merge(alarms: Iterable[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Overlapping (start, end, what) intervals of one target as one, their whats joined."""
    merged: list[tuple[float, float, list[str]]] = []
    for start, end, what in sorted(alarms):
        if merged and start <= merged[-1][1]:
            last = merged[-1]
            merged[-1] = (last[0], max(last[1], end), last[2] + ([what] if what not in last[2] else []))
        else:
            merged.append((start, end, [what]))
    return [(start, end, ", ".join(whats)) for start, end, whats in merged]


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one policy did on one incident."""

    caught: bool
    first_alarm: float | None = None
    lead_time: float | None = None  # first alarm minus the incident's start
    target: str | None = None  # the target the first alarm was on


@dataclass
class Score:
    """One policy's totals over the incidents."""

    caught: int = 0
    missed: int = 0
    false_alarms: int = 0
    lead_times: list[float] = field(default_factory=list)

    @property
    def median_lead_time(self) -> float | None:
        return statistics.median(self.lead_times) if self.lead_times else None


@dataclass
class Scored:
    """The incidents scored: per incident each policy's outcome, per policy its totals and false alarms."""

    incidents: list[tuple[Incident, tuple[str, ...], dict[str, Outcome]]]  # the incident, its targets, outcomes
    scores: dict[str, Score]
    false_alarms: list[Alarm]
    unscored: list[tuple[Incident, str]]  # the incident and why it was not scored


def score(incidents: Sequence[Incident], alarms: Sequence[Alarm], targets: Mapping[str, Mapping[str, str]],
          window: tuple[float, float]) -> Scored:
    """Each incident against each policy's alarm episodes; `targets` maps each target to its labels."""
    scores = {policy: Score() for policy in POLICIES}
    scored: list[tuple[Incident, tuple[str, ...], dict[str, Outcome]]] = []
    unscored: list[tuple[Incident, str]] = []
    covered: dict[str, list[Incident]] = {}
    for incident in incidents:
        if incident.end < window[0] or incident.start > window[1]:
            unscored.append((incident, "outside the backtest's window"))
            continue
        names = tuple(name for name, labels in targets.items() if incident.matches(name, labels))
        if not names:
            unscored.append((incident, "matches no target in the history"))
            continue
        for name in names:
            covered.setdefault(name, []).append(incident)
        outcomes: dict[str, Outcome] = {}
        for policy in POLICIES:
            hits = [a for a in alarms if a.policy == policy and a.target in names
                    and a.start <= incident.end and a.end >= incident.start]
            if hits:
                first = min(hits, key=lambda a: a.start)
                outcomes[policy] = Outcome(True, first.start, first.start - incident.start, first.target)
                scores[policy].caught += 1
                scores[policy].lead_times.append(first.start - incident.start)
            else:
                outcomes[policy] = Outcome(False)
                scores[policy].missed += 1
        scored.append((incident, names, outcomes))
    false_alarms = [a for a in alarms
                    if not any(i.start <= a.end and a.start <= i.end for i in covered.get(a.target, ()))]
    for alarm in false_alarms:
        scores[alarm.policy].false_alarms += 1
    return Scored(scored, scores, false_alarms, unscored)
