"""A replica's pace beside its peers': the rule that finds a replica limping (gray failure). Pure.

A replica that keeps stepping at a third of its peers' pace reads `busy` forever: a throttled GPU,
a downtrained link, a node whose CPU is starved. Its own counters cannot tell slow from loaded, but
its workload's other replicas (same model, same settings) can.

- **Pace** (`measure`): seconds of decode per unit of work over the last `pace.window`, from two
  cumulative counters each engine adapter reads (`PageReading.pace`, `Unit.pace`: seconds, work):
  vLLM's and SGLang's inter-token latency histogram (sum, count), llama.cpp's
  `tokens_predicted_seconds_total` and `tokens_predicted_total`, Triton's compute time and
  inferences, TGI's decode time and tokens. Time per token, not tokens per second: more clients
  give a replica more tokens per second, not slower tokens (docs/states.md has the figures).
- **Peers**: every other unit of the same peer group (`peer_group`: the workload; a
  LeaderWorkerSet's groups are peers of one another) with enough work in the window. A
  data-parallel server's units are peers too: one limping rank is compared with its siblings.
- **Judged** (`judge_pace`) only with `min_peers` peers and `min_work` of its own work in the
  window; otherwise the view says why (`basis`). `ratio` is its pace over the median of its peers'.
- **Degraded**: the ratio at or above `pace.ratio` for `pace.degraded_after` without a break. A
  workload slowing as a whole moves the median with it: no replica is degraded. Degraded is no
  verdict state: the state stays busy or idle, and a degraded replica that hangs is `stuck` (with
  no work in the window it is no longer judged).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

# Why a replica is or is not judged: `judged`, or what it lacks.
Basis = Literal["judged", "no_signal", "too_little_work", "alone", "too_few_peers"]


@dataclass(frozen=True, slots=True)
class PaceRules:
    """The pace settings the rule reads (exporter/settings.py's PaceSettings has the same fields)."""

    ratio: float = 2.0
    degraded_after: float = 600.0
    min_peers: int = 2
    window: float = 120.0
    min_work: float = 100.0


@dataclass(frozen=True, slots=True)
class Reading:
    """One poll's cumulative pace counters of one unit: seconds spent and work done (tokens, inferences)."""

    at: float
    seconds: float
    work: float


@dataclass(frozen=True, slots=True)
class Measure:
    """A unit's pace over its window: seconds per unit of work (None without work) and the work done."""

    seconds_per_work: float | None
    work: float


NO_MEASURE = Measure(None, 0.0)


@dataclass(frozen=True, slots=True)
class Pace:
    """A target's pace judgement: its view's `pace` (targets.py's PaceView) and the clock of its degradation.

    `slow_since` is when the ratio last rose to `pace.ratio` or above (None while under it), and
    `slow_at` the last read that found it so; `since` when the target became degraded (None while
    not). `unit`, `own` and `median` (seconds per unit of work) are what a judged ratio rests on;
    `note` why it is not judged.
    """

    basis: Basis = "no_signal"
    ratio: float | None = None
    peers: int = 0
    degraded: bool = False
    slow_since: float | None = None
    since: float | None = None
    slow_at: float | None = None
    note: str = ""
    unit: str = ""
    own: float | None = None
    median: float | None = None

    @property
    def detail(self) -> str:
        """What it rests on, for people: written when asked, not at every poll (a tenth of a poll's pace work)."""
        if self.own is None or self.median is None:
            return self.note
        text = (f"{self.own * 1000:.3g} ms per unit of work against the peers' median {self.median * 1000:.3g} ms "
                f"({self.peers} peers)")
        return f"{self.unit}: {text}" if self.unit else text


NOT_JUDGED = Pace()


def peer_group(workload: str) -> str:
    """The peers' key of a workload: the workload itself, but a LeaderWorkerSet's groups
    (`LeaderWorkerSet/<ns>/<name>/<group-index>`) are replicas of one another."""
    if workload.startswith("LeaderWorkerSet/") and workload.count("/") == 3:
        return workload.rsplit("/", 1)[0]
    return workload


def add_reading(readings: tuple[Reading, ...], reading: Reading | None, window: float) -> tuple[Reading, ...]:
    """The readings within `window` of `reading`, it included; a counter that fell (a restart) starts afresh.

    None (the page had no pace counters, or no reading came) keeps the readings as they are: a
    missed read is no evidence either way, and the window ages out at the next one.
    """
    if reading is None:
        return readings
    if readings and (reading.seconds < readings[-1].seconds or reading.work < readings[-1].work):
        return (reading,)
    # Readings come in time order: only the oldest can have left the window (a scan of all took an
    # eighth of a poll's pace work).
    horizon, start = reading.at - window, 0
    while start < len(readings) and readings[start].at < horizon:
        start += 1
    return (*readings[start:], reading)


def measure(readings: Sequence[Reading]) -> Measure:
    """The pace over the readings: seconds per unit of work between the first and the last."""
    if len(readings) < 2:
        return NO_MEASURE
    work = readings[-1].work - readings[0].work
    seconds = readings[-1].seconds - readings[0].seconds
    if work <= 0:
        return Measure(None, 0.0)
    return Measure(max(seconds, 0.0) / work, work)


# (basis, ratio, peers counted, note, own seconds per work, the peers' median) of one unit.
UnitJudgement = tuple[Basis, float | None, int, str, float | None, float | None]


def judge_unit(own: Measure, peers: Iterable[Measure], rules: PaceRules) -> UnitJudgement:
    """One unit against its peers' measures: (basis, ratio, peers counted, note, own, median)."""
    min_work = rules.min_work
    # A peer whose seconds never moved (0 per unit of work) can scale nothing: it is no peer.
    counted = [peer.seconds_per_work for peer in peers
               if peer.seconds_per_work is not None and peer.seconds_per_work > 0 and peer.work >= min_work]
    count, mine = len(counted), own.seconds_per_work
    if mine is None or own.work < min_work:
        note = "no work done in the window" if own.work <= 0 else \
            f"{own.work:g} work done in the window, fewer than pace.min_work {min_work:g}"
        return "too_little_work", None, count, note, None, None
    if count < rules.min_peers:
        note = f"{count} peer(s) with enough work in the window, fewer than pace.min_peers {rules.min_peers}"
        return ("alone" if not count else "too_few_peers"), None, count, note, None, None
    counted.sort()
    half = count // 2
    median = counted[half] if count % 2 else (counted[half - 1] + counted[half]) / 2
    return "judged", mine / median, count, "", mine, median


@functools.lru_cache(maxsize=1024)
def _not_judged(basis: Basis, peers: int, note: str) -> Pace:
    """The judgement of a replica not judged, one shared (immutable) Pace per outcome.

    A replica without peers (a workload of one) reads the same at each of its pace reads: the
    judgement it already holds comes back, which the poller keeps without comparing it field by
    field (TargetRecord.record_poll), and no new Pace is made (a third of such a read's pace work).
    """
    return Pace(basis=basis, peers=peers, note=note)


def judge_pace(units: Sequence[tuple[str, Measure, Sequence[Measure]]], previous: Pace, now: float, rules: PaceRules,
               ) -> Pace:
    """A target's pace judgement now: each of its units against its peers, the slowest counting.

    `units` holds (the unit's name, its measure, its peers' measures) for each unit of the target:
    one, named '', for a server without data-parallel units; none for an engine without pace counters.
    """
    if not units:
        return NOT_JUDGED
    judged = [(name, judge_unit(own, peers, rules)) for name, own, peers in units]
    with_ratio = [unit for unit in judged if unit[1][1] is not None]
    if not with_ratio:
        basis, _, count, note, _, _ = judged[0][1]
        if previous.slow_at is not None and now - previous.slow_at <= rules.window:
            # A slow replica whose window lacks finished work for a while (llama.cpp's counters move
            # only when a request ends) keeps its clock and its word for up to one window: no
            # evidence either way. Longer, it is idle or hung, and not judged.
            return Pace(basis=basis, peers=count, note=note, degraded=previous.degraded,
                        slow_since=previous.slow_since, since=previous.since, slow_at=previous.slow_at)
        return _not_judged(basis, count, note)
    name, (basis, ratio, count, note, own, median) = max(with_ratio, key=lambda unit: unit[1][1] or 0.0)
    assert ratio is not None
    if ratio < rules.ratio:
        return Pace(basis=basis, ratio=ratio, peers=count, unit=name, own=own, median=median)
    slow_since = previous.slow_since if previous.slow_since is not None else now
    degraded = now - slow_since >= rules.degraded_after
    since = (previous.since if previous.degraded and previous.since is not None else now) if degraded else None
    return Pace(basis=basis, ratio=ratio, peers=count, degraded=degraded, slow_since=slow_since, since=since,
                slow_at=now, unit=name, own=own, median=median)
