"""One backtest pass: find the engines in the history, read it chunk by chunk, feed each target's replay, then the gate.

It reads through a `Source` (prometheus.Prometheus, or an in-memory one for the bench), so the same
pass runs below the HTTP layer. It keeps at most one chunk of samples at a time: each target's
replay carries its state (the verdict, the open episode, the alert rules) from chunk to chunk.

What cannot be read is said, never filled in: a chunk Prometheus did not answer is a span where
nothing is judged (no reads: no `down` invented), a target that appears mid-window starts at its
first scrape, a target whose scrapes stop has missed reads (down after `down_after`, the exporter's rule).
"""

from __future__ import annotations

import functools
import importlib
import re
import statistics
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from typing import Protocol

from llm_vitals.backtest.history import Columns, Read, Scrapes, Series, grid, scrape_interval
from llm_vitals.backtest.incidents import ALARM_SEVERITIES, Alarm, Incident, Scored, merge, score
from llm_vitals.backtest.live import LIVE_STATE, TARGET_INFO, Agreement, compare, live_timelines, match_targets, target_urls
from llm_vitals.backtest.prometheus import CHUNK_POINTS, PrometheusError, name_selector
from llm_vitals.backtest.replay import (
    QUEUE_TIME_BUCKET,
    QUEUE_TIME_COUNT,
    QUEUE_TIME_FAMILIES,
    UP,
    GateDecision,
    Note,
    TargetReplay,
    default_policy,
    found_parser,
    gate_replay,
)
from llm_vitals.backtest.rules import AlertRule
from llm_vitals.exporter.engines import Engine
from llm_vitals.exporter.engines.scan import Scanner
from llm_vitals.exporter.engines.table import ENGINES
from llm_vitals.exporter.settings import ExporterSettings, TargetSettings


class Source(Protocol):
    """Where the history is read from: Prometheus's API, or memory."""

    def series(self, selector: str, start: float, end: float) -> list[dict[str, str]]: ...

    def samples(self, selector: str, start: float, end: float) -> list[Series]: ...


# Groups of targets per reading process (run.py's --jobs): each process reads one group after another.
GROUPS_PER_JOB = 4


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    end: float
    step: float


@dataclass(frozen=True)
class Options:
    rules: tuple[AlertRule, ...]
    matchers: str = ""  # inside the --selector's braces
    watchdog_timeout: float = 10.0
    config: ExporterSettings | None = None
    trace: bool = False  # keep every read's state and load (the HTML page)
    chunk_points: int = CHUNK_POINTS
    progress: Callable[[str], None] | None = None
    # Processes reading and replaying groups of targets, each from its own source_factory() (picklable).
    jobs: int = 1
    source_factory: Callable[[], Source] | None = None
    # Read the samples directly where the adapter can (history.Columns); False: write each scrape as a
    # page and scan it back (history.Scrapes), the reference the fast path is tested against.
    fast: bool = True
    # Reads of one snapshot that judge would answer alike but for the time are not judged again
    # (steady.py); False: every read judged, the reference the skipping is tested against.
    skip: bool = True
    # Queries of one chunk in flight at once (one per family).
    concurrency: int = 4
    # --compare-live: the exporter's own llm_vitals_state in the same Prometheus, against the replay.
    compare_live: bool = False
    # --incidents: the operator's own incidents, each policy scored against them.
    incidents: Sequence[Incident] | None = None


@dataclass
class Result:
    window: Window
    targets: dict[str, TargetReplay]
    decisions: list[GateDecision] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)  # about the whole history (not one target)
    chunks: int = 0
    chunks_read: int = 0
    scored: Scored | None = None  # --incidents
    live: list[Agreement] | None = None  # --compare-live

    @property
    def read_anything(self) -> bool:
        return self.chunks_read > 0 and bool(self.targets)

    def would_restart(self, target: str) -> list[GateDecision]:
        """The restarts the gate would have allowed for `target`."""
        return [d for d in self.decisions if d.target == target and d.allowed]


def families(entry: Engine) -> tuple[str, ...]:
    """The sample names an engine's adapter reads (its scanner's), i.e. what to ask Prometheus for."""
    if entry.parse is None:
        return ()
    module = importlib.import_module(entry.parse.__module__)
    scanner = getattr(module, "SCANNER", None) or getattr(module, "_SCANNER", None)
    return scanner.names if isinstance(scanner, Scanner) else ()


def engine_of_names(names: Iterable[str]) -> str | None:
    """The engine whose signature prefix the families present carry (as table.identify reads a page)."""
    present = set(names)
    for name, entry in ENGINES.items():
        if entry.signature is not None and any(n.startswith(entry.signature) for n in present):
            return name
    return None


_DEPLOYMENT_POD = re.compile(r"^(.+)-[a-z0-9]{6,10}-[a-z0-9]{5}$")
_STATEFULSET_POD = re.compile(r"^(.+)-\d+$")


def workload_of(labels: Mapping[str, str], instance: str) -> str:
    """What a budget counts for a target: a `workload` label, else the owner its pod name shows, else the instance.

    A pod name is a hint, not an identity (the remediator reads owners from the API server); it is
    what the history keeps.
    """
    if labels.get("workload"):
        return labels["workload"]
    namespace, pod = labels.get("namespace"), labels.get("pod")
    if namespace and pod:
        if match := _DEPLOYMENT_POD.match(pod):
            return f"Deployment/{namespace}/{match.group(1)}"
        if match := _STATEFULSET_POD.match(pod):
            return f"StatefulSet/{namespace}/{match.group(1)}"
    return instance


def _default_settings(engine: str) -> TargetSettings:
    # judge reads only the timings, the engine and the canary's settings: the name and url are placeholders.
    return TargetSettings.model_validate({"name": "backtest", "url": "http://backtest.invalid", "engine": engine})


def discover(source: Source, window: Window, options: Options) -> tuple[dict[str, TargetReplay], list[Note], str | None]:
    """The targets in the history (by `instance`), their engine and settings; and the queue-time bucket to read."""
    notes: list[Note] = []
    wanted = {name: families(entry) for name, entry in ENGINES.items() if families(entry)}
    all_names = sorted({f for names in wanted.values() for f in names} | {QUEUE_TIME_BUCKET})
    label_sets = source.series(name_selector(all_names, options.matchers), window.start - 2 * window.step, window.end)
    by_instance: dict[str, set[str]] = defaultdict(set)
    first_labels: dict[str, dict[str, str]] = {}
    buckets: set[str] = set()
    for labels in label_sets:
        instance = labels.get("instance", "")
        if not instance:
            continue
        by_instance[instance].add(labels.get("__name__", ""))
        if labels.get("__name__") == QUEUE_TIME_BUCKET and labels.get("le"):
            buckets.add(labels["le"])
        if not labels.get("__name__", "").startswith("process_"):
            first_labels.setdefault(instance, labels)
    configured = {t.name: t for t in options.config.targets} if options.config is not None else {}
    targets: dict[str, TargetReplay] = {}
    for instance in sorted(by_instance):
        detected = engine_of_names(by_instance[instance])
        settings = configured.get(instance)
        engine = settings.engine if settings is not None else detected
        if engine is None:
            continue  # only a process_* family: some other process, not an engine
        if settings is None:
            settings = _default_settings(engine)
            if configured:
                notes.append(Note(None, f"{instance}: not in the config, judged with the exporter's defaults ({engine})"))
        targets[instance] = TargetReplay(
            instance, ENGINES[engine], settings, options.rules, watchdog_timeout=options.watchdog_timeout,
            step=window.step, workload=workload_of(first_labels.get(instance, {}), instance)
            if settings.workload is None else settings.workload, trace=options.trace, record_from=window.start,
            labels={k: v for k, v in first_labels.get(instance, {}).items() if k != "__name__"}, skip=options.skip)
    for name in sorted(set(configured) - set(targets)):
        notes.append(Note(None, f"{name}: in the config, but no series with instance=\"{name}\" in the window"))
    le = _bound_at_or_above(buckets, options.watchdog_timeout)
    return targets, notes, le


def _bound_at_or_above(bounds: Iterable[str], timeout: float) -> str | None:
    best: tuple[float, str] | None = None
    for text in bounds:
        try:
            value = float(text)
        except ValueError:
            continue
        if value >= timeout and (best is None or value < best[0]):
            best = (value, text)
    return best[1] if best else None


def backtest(source: Source, window: Window, options: Options) -> Result:
    """The whole pass; PrometheusError only when not even the list of series could be read.

    With `options.jobs` > 1 the targets are split into GROUPS_PER_JOB groups per job, each read and
    replayed in one of `options.jobs` processes from its own `options.source_factory()` (a target's
    replay needs no other's); the gate then runs over all of them, in this process, in time order.
    """
    targets, notes, le = discover(source, window, options)
    result = Result(window, targets, notes=notes)
    if not targets:
        result.notes.append(Note(None, "no engine series in the window (check --selector, --start/--end, and that "
                                       "Prometheus scrapes the engines' /metrics)"))
        return result
    queries: list[tuple[str, tuple[str, ...]]] = []
    engines = sorted({t.engine.name for t in targets.values()})
    for engine in engines:
        queries += [(name, ()) for name in families(ENGINES[engine])]
    if le is not None and "vllm" in engines:
        queries += [(QUEUE_TIME_COUNT, ()), (QUEUE_TIME_BUCKET, (f'le="{le}"',))]
    # Prometheus's own `up`: a scrape that failed (0) is a missed read; no sample at all, a target gone.
    queries.append((UP, ()))
    jobs = min(options.jobs, len(targets))
    if jobs <= 1 or options.source_factory is None:
        read = read_history(source, window, options, targets, queries)
    else:
        read = _read_in_processes(options.source_factory, window, options, targets, queries, jobs)
        result.targets = targets = read.targets
    result.chunks, result.chunks_read = read.chunks, read.chunks_read
    result.notes += read.notes
    for replay in targets.values():
        replay.finish(window.end)
    policy = default_policy(targets)
    result.decisions = gate_replay(targets, policy)
    if options.compare_live:
        result.live = compare_live(source, window, targets, result.notes)
    if options.incidents is not None:
        result.scored = score(options.incidents, alarms(result, options.rules),
                              {name: replay.labels for name, replay in targets.items()}, (window.start, window.end))
    return result


def compare_live(source: Source, window: Window, targets: Mapping[str, TargetReplay], notes: list[Note]) -> list[Agreement]:
    """--compare-live: the exporter's own `llm_vitals_state` read back, chunk by chunk, against each replay."""
    series: list[Series] = []
    span = window.step * CHUNK_POINTS
    low = window.start
    try:
        urls = target_urls(source.series(name_selector([TARGET_INFO], ""), window.start, window.end))
        while low < window.end:
            high = min(window.end, low + span)
            series += source.samples(name_selector([LIVE_STATE], ""), low, high)
            low = high
    except PrometheusError as exc:
        notes.append(Note(None, f"--compare-live: the exporter's llm_vitals_state could not be read: {exc}"))
        return []
    timelines = live_timelines(series)
    if not timelines:
        notes.append(Note(None, "--compare-live: no llm_vitals_state series in the window (does this Prometheus "
                                "scrape the exporter?)"))
        return []
    matched = match_targets(timelines, targets, urls)
    unmatched = sorted(set(timelines) - set(matched.values()))
    if unmatched:
        notes.append(Note(None, f"--compare-live: the exporter's target(s) {', '.join(unmatched)} match no replayed "
                                f"instance (by name or by the host:port of their url)"))
    return [compare(name, matched[name], timelines[matched[name]], targets[name].state_at, (window.start, window.end))
            for name in targets if name in matched]


def alarms(result: Result, rules: Sequence[AlertRule]) -> list[Alarm]:
    """Each policy's alarm episodes per target (incidents.py says what counts)."""
    severity = {rule.name: rule.severity for rule in rules}
    found: list[Alarm] = []
    for name, replay in result.targets.items():
        vitals = [(a.start, a.end, a.alert) for a in replay.alerts if severity.get(a.alert) in ALARM_SEVERITIES]
        vitals += [(d.at, d.at, "would-be restart") for d in result.would_restart(name)]
        found += [Alarm("llm-vitals", name, start, end, what) for start, end, what in merge(vitals)]
        watchdog = [(start, end if end is not None else start, "watchdog restart")
                    for start, end in replay.watchdog.periods]
        found += [Alarm("watchdog", name, start, end, what) for start, end, what in merge(watchdog)]
    return found


@dataclass
class HistoryRead:
    """What reading the history for a group of targets gave: their replays, fed; chunk counts; notes."""

    targets: dict[str, TargetReplay]
    chunks: int = 0
    chunks_read: int = 0
    scored: Scored | None = None  # --incidents
    live: list[Agreement] | None = None  # --compare-live
    notes: list[Note] = field(default_factory=list)


def instance_matcher(names: Iterable[str]) -> str:
    """`instance=~"a|b"`, each name matched literally (RE2 takes a backslash before any punctuation)."""
    alternatives = "|".join(re.escape(name) for name in sorted(names))
    return 'instance=~"' + alternatives.replace("\\", "\\\\") + '"'


def read_history(source: Source, window: Window, options: Options, targets: dict[str, TargetReplay],
                 queries: Sequence[tuple[str, tuple[str, ...]]], narrow: bool = False) -> HistoryRead:
    """Read the window chunk by chunk and feed every target's replay its reads, in time order."""
    read = HistoryRead(targets)
    # One warm-up read a step before the window: the window's first read has one to compare with.
    times = list(grid(window.start - window.step, window.end, window.step))
    chunks = max(1, -(-len(times) // options.chunk_points))
    read.chunks = chunks
    group = (instance_matcher(targets),) if narrow else ()
    with ThreadPoolExecutor(max_workers=max(1, options.concurrency)) as pool:
        _read_chunks(source, window, options, targets, queries, read, times, group, pool)
    splits = getattr(source, "splits", 0)
    if splits:
        read.notes.append(Note(None, f"Prometheus refused {splits} quer{'y' if splits == 1 else 'ies'} as too many "
                                     f"samples (HTTP 422, its --query.max-samples): read again in halves, nothing lost"))
    return read


def _read_chunks(source: Source, window: Window, options: Options, targets: dict[str, TargetReplay],
                 queries: Sequence[tuple[str, tuple[str, ...]]], read: HistoryRead, times: list[float],
                 group: tuple[str, ...], pool: ThreadPoolExecutor) -> None:
    say = options.progress or (lambda _: None)
    chunks = read.chunks
    checked_interval = False
    for index in range(chunks):
        reads_at = times[index * options.chunk_points:(index + 1) * options.chunk_points]
        low, high = reads_at[0] - window.step, reads_at[-1]
        by_target: dict[str, list[Series]] = defaultdict(list)
        selectors = [name_selector([name], ",".join(m for m in (options.matchers, *group, *extra) if m))
                     for name, extra in queries]
        try:
            # The families of one chunk at once: Prometheus answers them in parallel, and this
            # process decodes one answer while it works on the next.
            for answer in pool.map(functools.partial(_samples, source, start=low, end=high), selectors):
                for series in answer:
                    instance = series.labels.get("instance", "")
                    if instance in targets:
                        by_target[instance].append(series)
        except PrometheusError as exc:
            read.notes.append(Note(low, f"reads from {_iso(reads_at[0])} to {_iso(high)} not judged: {exc}"))
            say(f"chunk {index + 1}/{chunks}: {exc}")
            continue
        read.chunks_read += 1
        # Target by target: each replay needs only its own reads in time order (the gate, which
        # needs the fleet, runs afterwards), so one target's scrapes at a time are held as pages.
        intervals: list[float] = []
        for name, replay in targets.items():
            of_target = by_target.pop(name, None)
            found: Scrapes | Columns | None = _scrapes_of(of_target, replay, options.fast) if of_target else None
            if found is not None:
                if not checked_interval and (interval := scrape_interval(found.times)) is not None:
                    intervals.append(interval)
                read.notes += [Note(low, f"{name}: two series wrote {prefix} at one scrape (a relabel duplicated "
                                         f"them?): the first is read, the other ignored")
                               for prefix in sorted(found.duplicates)]
            _feed(replay, found, reads_at, window.step)
        if not checked_interval and intervals:
            checked_interval = True
            read.notes += _check_interval(intervals, window)
        if chunks > 4:
            say(f"chunk {index + 1}/{chunks} read ({_iso(high)})")


def _samples(source: Source, selector: str, *, start: float, end: float) -> list[Series]:
    return source.samples(selector, start, end)


def _scrapes_of(series: list[Series], replay: TargetReplay, fast: bool) -> Scrapes | Columns:
    """The target's scrapes of one chunk: as columns of samples where its adapter reads samples directly."""
    extra = (*QUEUE_TIME_FAMILIES, UP)
    if fast and found_parser(replay.engine.name) is not None:
        columns = Columns.of(series, extra)
        # Only the adapter's own families: another engine's lines on the page are the page path's
        # `wrong_engine`, which the samples path does not judge.
        if columns.page_names() <= frozenset(families(replay.engine)):
            return columns
    return Scrapes.of(series, extra)


def _feed(replay: TargetReplay, found: Scrapes | Columns | None, reads_at: Sequence[float], step: float) -> None:
    """Feed one target's replay its reads of one chunk, in time order."""
    if found is None:
        if replay.first_read is not None:
            for at in reads_at:
                replay.feed(_missed(at))
        return
    first = found.times[0] if found.times else None
    feed = replay.feed
    if isinstance(found, Columns):
        position = 0
        for at in reads_at:
            if replay.first_read is None and (first is None or first > at):
                continue  # not in the history yet (a target that appears mid-window)
            one, position = found.read_at(at, step, position)
            feed(one)
        return
    for at in reads_at:
        if replay.first_read is None and (first is None or first > at):
            continue
        feed(found.read_at(at, step))


def _read_group(source_factory: Callable[[], Source], window: Window, options: Options,
                targets: dict[str, TargetReplay], queries: Sequence[tuple[str, tuple[str, ...]]]) -> HistoryRead:
    source = source_factory()
    try:
        return read_history(source, window, options, targets, queries, narrow=True)
    finally:
        close = getattr(source, "close", None)
        if callable(close):
            close()


def _read_in_processes(source_factory: Callable[[], Source], window: Window, options: Options,
                       targets: dict[str, TargetReplay], queries: Sequence[tuple[str, tuple[str, ...]]],
                       jobs: int) -> HistoryRead:
    say = options.progress or (lambda _: None)
    names = sorted(targets)
    # More groups than processes, each process taking the next group as it finishes one: a group of
    # busy servers (every read judged) and one of idle ones (most reads steady) end together.
    count = min(len(names), jobs * GROUPS_PER_JOB)
    # Dealt in the order of the names' CRC-32 (the same in every run), not by name: names run in
    # patterns (a workload's replicas side by side, every other one busy), and a stride over sorted
    # names gathered like with like. The bench's fleet, busy and half-idle targets alternating, made
    # four groups of busy servers, the last of which ran alone: the week's wall was 1.14x its CPU per
    # core (93.7-112.4 s), 1.02x dealt this way (83.4-89.8 s).
    dealt = sorted(names, key=lambda name: (zlib.crc32(name.encode()), name))
    groups = [{name: targets[name] for name in dealt[i::count]} for i in range(count)]
    quiet = replace(options, progress=None, source_factory=None)
    merged = HistoryRead({})
    notes: dict[tuple[float | None, str], Note] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_read_group, source_factory, window, quiet, group, queries) for group in groups]
        for done, future in enumerate(as_completed(futures), 1):
            part = future.result()
            merged.targets.update(part.targets)
            merged.chunks = max(merged.chunks, part.chunks)
            # A chunk counts as read when every group read it (a group's failure is its own note).
            merged.chunks_read = part.chunks_read if done == 1 else min(merged.chunks_read, part.chunks_read)
            for note in part.notes:
                notes.setdefault((note.at, note.text), note)
            say(f"group {done}/{count} read ({len(part.targets)} targets)")
    merged.targets = {name: merged.targets[name] for name in names}
    merged.notes = list(notes.values())
    return merged


def _missed(at: float) -> Read:
    return Read(at, None)


def _check_interval(intervals: Sequence[float], window: Window) -> list[Note]:
    if not intervals:
        return []
    typical = statistics.median(intervals)
    if typical > 1.5 * window.step:
        return [Note(None, f"the engines were scraped every {typical:g}s, more than --step {window.step:g}s: reads "
                           f"between two scrapes find none and count as missed; use --step {typical:g}s")]
    return []


def _iso(seconds: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
