"""The replay: reads of one target -> what llm-vitals would have said; all targets' alerts -> what its gate would have done. Pure.

Per target (`TargetReplay`, fed reads in time order, chunk after chunk):
- each read goes through the engine's adapter (`engines.table.read_page`) and the exporter's
  verdict (`verdict.judge`), the very functions the exporter polls with; a missed read is a
  PollError, as a failed poll is;
- restarts seen are the verdict's own (a new process start time, counters that fell);
- the alert rules on the target's state (rules.py) are evaluated at each read, Prometheus's `for:`
  counted from the first read that matched, and Alertmanager's notifications to the remediator
  re-sent every `repeat_interval` while firing;
- the watchdog column: where a 1-token request would have waited longer than the watchdog's
  timeout (`Watchdog`), each such period one restart by a timeout-and-restart watchdog.

The fleet (`gate_replay`): every firing notification of a restart rule, in time order, through the
remediator's own gate (`gate.decide`, its effects applied by `with_effects`), with the fleet
as the verdicts stood at that time. What the gate allowed is a would-be restart. The history goes on
as it was recorded: a would-be restart changes nothing that follows but the gate's own state.

The canary's results are not in the engine's history: `unresponsive` (an idle-looking server whose
canary fails) cannot be replayed, and is never reported.
"""

from __future__ import annotations

import bisect
import functools
import importlib
import math
import re
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from llm_vitals.backtest.history import Read
from llm_vitals.backtest.rules import AlertRule
from llm_vitals.backtest.steady import Steady, steady
from llm_vitals.exporter.engines import Engine, Page, PageError, PageReading
from llm_vitals.exporter.engines.scan import Sample
from llm_vitals.exporter.engines.table import read_page
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import PollError, Verdict, judge
from llm_vitals.remediator import gate, model
from llm_vitals.remediator.model import Intent
from llm_vitals.remediator.state import with_effects
from llm_vitals.targets import STATES, UNHEALTHY_STATES

# States that are the server working as it should: not listed as episodes. Every other state the
# verdict returns (today's and any added later, e.g. a pause on purpose) is an episode of its own.
ORDINARY_STATES = frozenset({"busy", "idle"})
# Flags a verdict may carry beside its state (a replica limping beside its peers: `degraded`), each
# listed as episodes of its own name while true; a verdict without the field has the flag false.
FLAGS = ("degraded",)
# alerts/alertmanager.yml's route to the remediator re-sends a still-firing alert every hour.
REPEAT_INTERVAL = 3600.0
# The remediator's executors' default timeout: how long a would-be restart holds "in progress".
RESTART_TIMEOUT = 30.0

# Prometheus's own series per scrape: 1 when the scrape worked, 0 when it failed.
UP = "up"
# How far back the watchdog's finish rate looks (at least 4 timeouts).
BACKLOG_HORIZON = 300.0
# vLLM's queue-time histogram (seconds a request waited before it was scheduled).
QUEUE_TIME_BUCKET = "vllm:request_queue_time_seconds_bucket"
QUEUE_TIME_COUNT = "vllm:request_queue_time_seconds_count"
QUEUE_TIME_FAMILIES = (QUEUE_TIME_BUCKET, QUEUE_TIME_COUNT)
# Of a read's off-page lines: the queue-time count's, and the bucket lines at each bound >= timeout, smallest first.
QueueLayout = tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]
isfinite = math.isfinite


@functools.cache
def found_parser(engine: str) -> Callable[[dict[str, list[Sample]]], PageReading] | None:
    """The adapter's own `parse_found` (what its scanner found on a page -> its PageReading), where it has one."""
    from llm_vitals.exporter.engines.table import ENGINES

    entry = ENGINES[engine]
    if entry.parse is None or entry.restart_header is not None:
        return None  # a restart token comes in a header the history does not keep: the page path says so
    parser = getattr(importlib.import_module(entry.parse.__module__), "parse_found", None)
    return parser if callable(parser) else None


def read_found(entry: Engine, found: Mapping[str, list[Sample]]) -> PageReading:
    """`entry`'s PageReading of the samples its scanner would have found on the page (Read.found)."""
    parser = found_parser(entry.name)
    if parser is None:
        raise PageError("bad_metrics", f"engine {entry.name} reads no samples directly")  # run.py never asks
    # The adapter only reads what it is given (a run of identical reads shares one mapping).
    return parser(found if isinstance(found, dict) else dict(found))


@dataclass(frozen=True, slots=True)
class Episode:
    """One stretch of one state, from the read that entered it to the read that left it (or the window's end)."""

    state: str
    start: float
    end: float
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class AlertEpisode:
    """One alert that fired: from `start` (its `for:` elapsed) to `end` (resolved, or the window's end)."""

    alert: str
    active_at: float  # its expression first held (Alertmanager's startsAt)
    start: float
    end: float
    restart: bool


@dataclass(frozen=True, slots=True)
class Notification:
    """A firing restart alert as Alertmanager sends it to the remediator."""

    at: float
    target: str
    alert: str
    active_at: float


@dataclass(frozen=True, slots=True)
class Restart:
    """A restart seen in the history, or one the gate or the watchdog would have made."""

    at: float
    why: str


@dataclass(frozen=True, slots=True)
class Note:
    """Something about the history a reader must know (a gap, a duplicate, a page the adapter refused)."""

    at: float | None
    text: str


@dataclass
class Watchdog:
    """A request-based watchdog's view of one target: would a 1-token probe have waited over `timeout`?

    From vLLM's queue-time histogram where the history has it (a request scheduled since the last
    read after waiting longer than the smallest bucket bound >= timeout), and from the load: work
    pending with no engine step or finished request for `timeout` or longer, or more waiting than
    the finish rate clears within `timeout` (over the last BACKLOG_HORIZON, while it had work
    throughout). A period ends once no read has failed for `timeout`. Each period is one restart of a
    watchdog that restarts on its first failed probe: one that waits for several failures in a row
    restarts less often, one whose restart does not clear the load restarts again within a period.
    """

    timeout: float
    failing: bool = False
    periods: list[tuple[float, float | None]] = field(default_factory=list)
    _frozen_since: float | None = None
    _last: PageReading | None = None
    _last_at: float | None = None
    _queue: tuple[float, float] | None = None  # (count, bucket at the bound) at the last read
    _slow_queue: bool = False  # the last requests scheduled waited longer than the bound
    _last_failing: float | None = None
    _waiting_since: float | None = None  # first of the reads since which requests have been waiting
    _finishes: deque[tuple[float, float]] = field(default_factory=deque)  # (time, finished) over the horizon
    _lines: Mapping[str, float] | None = None
    _lines_queue: tuple[float, float] | None = None
    # The names of the last lines read and their layout (_queue_lines): the same names scrape after scrape.
    _names: frozenset[str] = frozenset()
    _layout: QueueLayout = ((), ())

    def feed(self, at: float, snap: PageReading | None, lines: Mapping[str, float], restarted: bool,
             unreachable: bool = False) -> None:
        """Fold one read in; a missed read (`snap` None) changes nothing, it shows nothing either way, unless
        Prometheus's own scrape failed there (`unreachable`, `up` 0): a probe would have failed too."""
        if snap is None:
            if unreachable:
                self._failing(at, True)
            return
        pending = snap.pending
        if (snap is self._last and not restarted and not pending and not self.failing and not self._slow_queue
                and self._frozen_since is None and self._waiting_since is None and not self._finishes):
            # The same idle read again (a quiet server's run of identical scrapes): nothing below can
            # change but the time of the last read.
            self._last_at = at
            return
        last, last_at = (None, None) if restarted else (self._last, self._last_at)
        if lines is not self._lines:
            # The same scrape's lines (a run of identical reads) are the same object: counted once.
            if lines.keys() != self._names:
                self._names, self._layout = frozenset(lines), _queue_lines(tuple(lines), self.timeout)
            self._lines, self._lines_queue = lines, _queue_counts(lines, self._layout)
        queue = self._lines_queue
        if restarted or not pending:
            self._slow_queue = False
        elif queue is not None and self._queue is not None:
            scheduled, fast = queue[0] - self._queue[0], queue[1] - self._queue[1]
            if scheduled > 0 and fast >= 0:
                # Requests scheduled since the last read: did any wait past the bound? With none
                # scheduled, the last evidence stands (a probe would queue behind the same backlog).
                self._slow_queue = scheduled > fast
        moved = last is not None and _moved(last, snap)
        if not pending or moved:
            self._frozen_since = None
        elif self._frozen_since is None:
            # Pending and nothing moved since the last read: frozen since then (since now on a lifetime's first read).
            self._frozen_since = last_at if last_at is not None else at
        frozen = self._frozen_since is not None and at - self._frozen_since >= self.timeout
        backlog = self._backlog(at, snap, restarted or not pending)
        self._failing(at, self._slow_queue or frozen or backlog)
        self._last, self._last_at, self._queue = snap, at, queue

    def _failing(self, at: float, failing: bool) -> None:
        if failing:
            if not self.failing:
                self.periods.append((at, None))
            self.failing, self._last_failing = True, at
        elif self.failing and self._last_failing is not None and at - self._last_failing >= self.timeout:
            # Over once a probe sent after the last failing read would have been answered in time: a
            # queue that empties between two requests of a batch job is one period, not one per request.
            self.periods[-1] = (self.periods[-1][0], at)
            self.failing = False

    def _backlog(self, at: float, snap: PageReading, restarted_or_idle: bool) -> bool:
        """More waiting than the recent finish rate clears within `timeout`: a probe joins the queue's tail
        and waits for every request ahead of it to be scheduled, one per finished request."""
        if restarted_or_idle or snap.finished is None:
            # The finish rate measures the server's pace only while it has work throughout: an idle
            # spell's few finishes would make a request that just arrived look stuck behind a slow queue.
            self._finishes.clear()
            self._waiting_since = None
            return False
        self._finishes.append((at, snap.finished))
        if snap.waiting <= 0:
            self._waiting_since = None
        elif self._waiting_since is None:
            self._waiting_since = at
        horizon = max(4 * self.timeout, BACKLOG_HORIZON)
        while len(self._finishes) > 2 and at - self._finishes[1][0] >= horizon:
            self._finishes.popleft()
        first_at, first = self._finishes[0]
        span = at - first_at
        if snap.waiting <= 0 or span < self.timeout:
            return False
        rate = (snap.finished - first) / span
        if rate <= 0:
            # Nothing finished over the horizon: the queue has not moved since requests began waiting.
            return self._waiting_since is not None and at - self._waiting_since >= self.timeout
        return (snap.waiting + 1) / rate > self.timeout

    @property
    def restarts(self) -> int:
        return len(self.periods)


def _moved(before: PageReading, after: PageReading) -> bool:
    """An engine step or a finished request between two reads (what moves a request-based probe along)."""
    steps = before.steps is not None and after.steps is not None and after.steps > before.steps
    done = before.finished is not None and after.finished is not None and after.finished > before.finished
    return steps or done


def _queue_counts(lines: Mapping[str, float], layout: QueueLayout) -> tuple[float, float] | None:
    """(requests scheduled, those that waited <= the smallest bucket bound >= timeout) in a read's lines, or None.

    `layout` is `_queue_lines` of these lines. Only finite values count; the bound is the smallest one >= timeout
    with a finite value. (Loops, not comprehensions and sum: this runs at every busy read.)"""
    counts, bounds = layout
    scheduled, seen = 0.0, False
    for prefix in counts:
        value = lines[prefix]
        if isfinite(value):
            scheduled, seen = scheduled + value, True
    if not seen:
        return None
    for prefixes in bounds:
        at_bound, seen = 0.0, False
        for prefix in prefixes:
            value = lines[prefix]
            if isfinite(value):
                at_bound, seen = at_bound + value, True
        if seen:
            return scheduled, at_bound
    return None


@functools.lru_cache(maxsize=256)
def _queue_lines(prefixes: tuple[str, ...], timeout: float) -> QueueLayout:
    """Of a read's off-page lines (the same set scrape after scrape: worked out once): the queue-time count's,
    and the bucket lines at each bound >= timeout, smallest bound first."""
    counts: list[str] = []
    bounds: dict[float, list[str]] = {}
    for prefix in prefixes:
        name = prefix.partition("{")[0]
        if name == QUEUE_TIME_COUNT:
            counts.append(prefix)
        elif name == QUEUE_TIME_BUCKET:
            match = _LE.search(prefix)
            try:
                le = float(match.group(1)) if match else math.nan
            except ValueError:
                le = math.nan
            if le >= timeout:
                bounds.setdefault(le, []).append(prefix)
    return tuple(counts), tuple(tuple(bounds[le]) for le in sorted(bounds))


_LE = re.compile(r'[{,]le="([^"]*)"')


STATE_INDEX = {state: i for i, state in enumerate(STATES)}


@dataclass
class Trace:
    """Per read, for the HTML page: time, state (index in STATES), pending requests, engine steps per second."""

    at: array = field(default_factory=lambda: array("d"))
    state: array = field(default_factory=lambda: array("b"))
    pending: array = field(default_factory=lambda: array("d"))
    steps_rate: array = field(default_factory=lambda: array("d"))


class TargetReplay:
    """One target's replay, fed its reads in time order (across chunks), then `finish`ed at the window's end."""

    def __init__(self, name: str, engine: Engine, settings: TargetSettings, rules: Sequence[AlertRule], *,
                 watchdog_timeout: float, step: float, workload: str | None = None, trace: bool = False,
                 record_from: float = -math.inf, labels: Mapping[str, str] | None = None, skip: bool = True) -> None:
        self.name = name
        self.labels = dict(labels or {})  # its series' labels (no __name__): what --incidents' selectors match
        self.engine = engine
        self.settings = settings
        self.rules = tuple(rules)
        # Per state, the rules on it (in the rules' order) and their names: a read walks only those.
        self._rules_on: dict[str, tuple[AlertRule, ...]] = {
            state: tuple(rule for rule in self.rules if rule.state == state) for state in {r.state for r in self.rules}}
        self._names_on = {state: frozenset(rule.name for rule in rules) for state, rules in self._rules_on.items()}
        self.step = step
        self.record_from = record_from
        self.workload = workload or name
        self.verdict: Verdict | None = None
        self.episodes: list[Episode] = []
        self.alerts: list[AlertEpisode] = []
        self.notifications: list[Notification] = []
        self.restarts_seen: list[Restart] = []
        self.notes: list[Note] = []
        self.watchdog = Watchdog(watchdog_timeout)
        self.trace = Trace() if trace else None
        self.first_read: float | None = None
        self.last_read: float | None = None
        self.reads = 0
        self.missed_reads = 0
        # (time, state) at each change, and (time, process start) at each: what the gate's fleet view reads.
        self.state_changes: list[tuple[float, str]] = []
        self.start_times: list[tuple[float, float | None]] = []
        self._open: tuple[str, float, str, str] | None = None  # state, since, reason, detail
        self._flags: dict[str, tuple[float, str]] = {}  # flag -> (since, detail), while it is true
        self._rules: dict[str, tuple[float, float | None, float | None]] = {}  # name -> (active_at, firing_at, last_sent)
        self._page_errors: dict[str, int] = {}
        self._last_page: object = None  # the page (or Read.key) the last snapshot was parsed from
        self._unscraped_since: float | None = None  # first of the reads since which nothing at all was scraped
        self.gone_at: float | None = None  # set by finish(): its scrapes stopped for good here
        self._last_snap: PageReading | None = None
        # Reads of one snapshot in a run judge answers alike but for the time are not judged again
        # (steady.py); False: every read judged, the reference tests/test_backtest_steady.py holds it to.
        self.skip = skip
        self._steady: Steady | None = None
        self._judged_snap: PageReading | None = None  # the snapshot of the last read judged, and its time
        self._judged_at: float | None = None

    def feed(self, read: Read) -> None:
        """Judge one read, as the exporter's poll would have."""
        self.reads += 1
        at = read.at
        observation, snap = self._observe(read)
        if self.first_read is None:
            self.first_read = at
        self.last_read = at
        run = self._steady
        if run is not None and snap is not None and snap is self._judged_snap and run.covers(at):
            # The same snapshot again, in a run judge answers alike but for the time (steady.py): its
            # verdict stands, and only what counts time (the alert rules' for:, the watchdog) moves on.
            verdict = run.verdict
            self._evaluate(verdict, at)
            self.watchdog.feed(at, snap, read.extra, False)
            if self.trace is not None:
                self._trace(at, verdict, snap)
            return
        before = self.verdict if run is None else run.current()
        verdict = judge(before, observation, at, self.settings, self.engine.facts)
        self.verdict = verdict
        self._steady = (steady(before, self._judged_at, verdict, at, self.settings)
                        if self.skip and snap is not None and snap is self._judged_snap else None)
        self._judged_snap, self._judged_at = snap, at
        restarted = before is not None and verdict.restarts > before.restarts
        if restarted:
            old = before.snapshot.process_start_time if before is not None and before.snapshot else None
            new = snap.process_start_time if snap is not None else None
            how = ("a new process start time" if old is not None and new is not None and old != new
                   else "counters fell")
            self.restarts_seen.append(Restart(at, how))
        if snap is not None and (not self.start_times or self.start_times[-1][1] != snap.process_start_time):
            self.start_times.append((at, snap.process_start_time))
        if self._open is None or self._open[0] != verdict.state:
            self._episode(verdict, at)
        for flag in FLAGS:
            if getattr(verdict, flag, False):
                self._flags.setdefault(flag, (at, verdict.detail))
            elif flag in self._flags:
                self._close_flag(flag, at)
        self._evaluate(verdict, at)
        self.watchdog.feed(at, snap, read.extra, restarted,
                           unreachable=snap is None and not read.scraped and read.extra.get(UP) == 0.0)
        if self.trace is not None:
            self._trace(at, verdict, snap)

    def _observe(self, read: Read) -> tuple[PageReading | PollError, PageReading | None]:
        """What the exporter's poll would have seen: the adapter's snapshot of the scrape, or the PollError."""
        found = read.found
        if found is None and read.page is None:  # not read.scraped
            self.missed_reads += 1
            if not read.extra and self._unscraped_since is None:
                self._unscraped_since = read.at
            elif read.extra:
                self._unscraped_since = None
            if read.extra.get(UP) == 0.0:
                return PollError("connect", "Prometheus's scrape of it failed (up 0)"), None
            return PollError("connect", f"no scrape in the history within the {self.step:g}s before this read"), None
        self._unscraped_since = None
        try:
            # The adapter is pure: the same page (a quiet or hung server's) is the same snapshot.
            key = read.key if found is not None else read.page
            if (key is not self._last_page and key != self._last_page) or self._last_snap is None:
                self._last_snap, self._last_page = None, key
                self._last_snap = (read_found(self.engine, found) if found is not None
                                   else read_page(self.engine, Page(str(read.page).encode())))
            return self._last_snap, self._last_snap
        except PageError as exc:
            if exc.reason not in self._page_errors:
                self.notes.append(Note(read.at, f"the {self.engine.name} adapter refused the page rebuilt from "
                                                f"the scrape at {read.scraped_at}: {exc.reason}: {exc.detail}"))
            self._page_errors[exc.reason] = self._page_errors.get(exc.reason, 0) + 1
            return PollError(exc.reason, exc.detail), None

    def _trace(self, at: float, verdict: Verdict, snap: PageReading | None) -> None:
        if self.trace is not None:  # (feed calls this only with a trace)
            self.trace.at.append(at)
            self.trace.state.append(STATE_INDEX.get(verdict.state, -1))
            last = verdict.snapshot
            self.trace.pending.append(last.running + last.waiting if last is not None and snap is not None else math.nan)
            rate = verdict.steps_per_second
            self.trace.steps_rate.append(rate if rate is not None else math.nan)

    def __getstate__(self) -> dict[str, object]:
        # Sent to and from a reading process (run.py's jobs): an engine entry holds functions, so
        # it travels as its name and is looked up again in the table.
        state = dict(self.__dict__)
        state["engine"] = self.engine.name
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        from llm_vitals.exporter.engines.table import ENGINES

        state["engine"] = ENGINES[str(state["engine"])]
        self.__dict__.update(state)

    def _episode(self, verdict: Verdict, at: float) -> None:
        if self._open is not None and self._open[0] == verdict.state:
            return
        self._close(at)
        self._open = (verdict.state, at, verdict.reason, verdict.detail)
        self.state_changes.append((at, verdict.state))

    def _close_flag(self, flag: str, at: float) -> None:
        since, detail = self._flags.pop(flag)
        if since >= self.record_from and at > self.record_from:
            self.episodes.append(Episode(flag, since, at, flag, detail))

    def _close(self, at: float) -> None:
        # The warm-up read before the window (`record_from`) only gives the first read of the window
        # a read to compare with: a server already running is not `starting` because the window begins.
        if self._open is not None and self._open[0] not in ORDINARY_STATES and at > self.record_from:
            state, since, reason, detail = self._open
            if since >= self.record_from:
                self.episodes.append(Episode(state, since, at, reason, detail))
        self._open = None

    def _evaluate(self, verdict: Verdict, at: float) -> None:
        state = verdict.state
        active = self._rules
        walk = self._rules_on.get(state, ())
        if active and not active.keys() <= self._names_on.get(state, frozenset()):
            walk = self.rules  # a rule of another state was active: it ends here (all walked, in order)
        elif not walk:
            return  # no rule holds, none was active: nothing to count (most reads of a healthy fleet)
        waiting = verdict.snapshot.waiting if verdict.snapshot is not None else 0.0
        for rule in walk:
            held = active.get(rule.name)
            if state != rule.state or (rule.needs_waiting and not waiting > 0):
                if held is not None:
                    if held[1] is not None:
                        self.alerts.append(AlertEpisode(rule.name, held[0], held[1], at, rule.restart))
                    del active[rule.name]
                continue
            active_at, firing_at, last_sent = held if held is not None else (at, None, None)
            if firing_at is None and at - active_at >= rule.for_seconds:
                firing_at = at
            if firing_at is not None and rule.restart and (last_sent is None or at - last_sent >= REPEAT_INTERVAL):
                self.notifications.append(Notification(at, self.name, rule.name, active_at))
                last_sent = at
            if held is None or firing_at is not held[1] or last_sent is not held[2]:
                active[rule.name] = (active_at, firing_at, last_sent)

    def finish(self, end: float) -> None:
        """Close what is still open at the window's end.

        A target Prometheus stopped scraping altogether (no sample at all, not even `up`, from some
        time to the window's end) left its service discovery: a deleted pod, a removed target. The
        exporter stops watching such a target too, so nothing after its last scrape is judged; a
        target whose scrapes failed (`up` 0) is judged, and goes `down` as the exporter's would.
        """
        if self._steady is not None:
            self.verdict, self._steady = self._steady.current(), None
        gone = self._unscraped_since
        # Shorter than down_after, the last reads were only missed reads: nothing was invented of them.
        if gone is not None and self.first_read is not None and end - gone >= self.settings.down_after:
            self.gone_at = gone
            if self._open is not None and self._open[1] >= gone:
                self._open = None
            self.state_changes = [(at, state) for at, state in self.state_changes if at < gone]
            self._rules = {name: rule for name, rule in self._rules.items() if rule[0] < gone}
            self.notes.append(Note(gone, "no scrape at all (not even `up`) from here to the window's end: gone from "
                                         "Prometheus's targets; nothing judged after its last scrape"))
            end = gone
        self._close(end)
        for flag in list(self._flags):
            if self._flags[flag][0] < end:
                self._close_flag(flag, end)
        self._flags.clear()
        self.episodes.sort(key=lambda e: e.start)
        for rule in self.rules:
            if rule.name in self._rules:
                active_at, firing_at, _ = self._rules.pop(rule.name)
                if firing_at is not None:
                    self.alerts.append(AlertEpisode(rule.name, active_at, firing_at, end, rule.restart))
        self.alerts.sort(key=lambda a: a.start)
        if self.watchdog.periods and self.watchdog.periods[-1][1] is None:
            self.watchdog.periods[-1] = (self.watchdog.periods[-1][0], end)
        for reason, count in self._page_errors.items():
            if count > 1:
                self.notes.append(Note(None, f"{count} reads in all were refused by the adapter ({reason})"))
        if self.missed_reads:
            self.notes.append(Note(None, f"{self.missed_reads} of {self.reads} reads found no scrape (missed reads: "
                                         f"evidence of nothing; down after {self.settings.down_after:g}s without one)"))

    # -- what the gate's fleet view reads, at any time --------------------------------------------
    def state_at(self, at: float) -> str | None:
        index = bisect.bisect_right(self.state_changes, (at, "\uffff")) - 1
        return self.state_changes[index][1] if index >= 0 else None

    def unhealthy_within(self, since: float, until: float) -> bool:
        """Unhealthy at some time in [since, until]: the fleet gate's `recently_unhealthy`."""
        index = max(0, bisect.bisect_right(self.state_changes, (since, "\uffff")) - 1)
        for at, state in self.state_changes[index:]:
            if at > until:
                break
            if state in UNHEALTHY_STATES:
                return True
        return False

    def process_start_at(self, at: float) -> float | None:
        index = bisect.bisect_right(self.start_times, (at, math.inf)) - 1
        return self.start_times[index][1] if index >= 0 else None

    def last_restart_before(self, at: float) -> float | None:
        times = [r.at for r in self.restarts_seen if r.at <= at]
        return times[-1] if times else None


@dataclass(frozen=True, slots=True)
class GateDecision:
    at: float
    target: str
    alert: str
    allowed: bool
    reason: str
    detail: str


def gate_replay(targets: Mapping[str, TargetReplay], policy: gate.GatePolicy,
                notifications: Iterable[Notification] | None = None) -> list[GateDecision]:
    """Every firing restart notification, in time order, through the remediator's gate; its state carried over."""
    queue = sorted(notifications if notifications is not None else
                   (n for t in targets.values() for n in t.notifications), key=lambda n: (n.at, n.target, n.alert))
    journal = model.GateState()
    decisions: list[GateDecision] = []
    for note in queue:
        now = note.at
        fleet = model.FleetView({name: _status(t, now) for name, t in targets.items()
                                if t.first_read is not None and t.first_read <= now
                                and (t.gone_at is None or now < t.gone_at)})
        alert = model.AlertFacts(status="firing",
                                labels={"alertname": note.alert, "target": note.target, "remediation": "restart"},
                                fingerprint=f"{note.alert}:{note.target}", starts_at=note.active_at)
        decision, effects = gate.ruling(alert, fleet, journal, policy, now)
        intent = Intent("backtest", note.target, now + RESTART_TIMEOUT) if effects.intent else None
        journal = with_effects(journal, effects, alert, now, intent)
        decisions.append(GateDecision(now, note.target, note.alert, decision.allowed, decision.reason, decision.detail))
    return decisions


def _status(replay: TargetReplay, now: float) -> model.TargetStatus:
    # The exporter's fleet gate window: unhealthy within its last two polls (verdict.recently_unhealthy).
    return model.TargetStatus(
        state=replay.state_at(now) or "starting",
        process_start_time=replay.process_start_at(now),
        last_restart_time=replay.last_restart_before(now),
        recently_unhealthy=replay.unhealthy_within(now - 2 * replay.step, now),
        engine=replay.engine.name,
        workload=replay.workload,
    )


def default_policy(targets: Iterable[str]) -> gate.GatePolicy:
    """The gate's policy with the remediator's defaults (its settings' own), over these targets."""
    from llm_vitals.remediator.fleet_limit import percent_of
    from llm_vitals.remediator.settings import Budget, Settings

    fields = Settings.model_fields
    budget = Budget()
    max_unhealthy = fields["max_unhealthy"].default
    names = frozenset(targets)
    percent = percent_of(max_unhealthy)
    return gate.GatePolicy(
        targets=names,
        global_cooldown=float(fields["global_cooldown"].default),
        max_restarts=budget.max_restarts,
        budget_window=budget.window,
        max_unhealthy=max_unhealthy if isinstance(max_unhealthy, int) else 0,
        max_unhealthy_percent=percent,
        storm_cooldown=float(fields["storm_cooldown"].default),
    )
