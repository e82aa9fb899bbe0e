"""The replay that leaves out reads of a steady run (steady.py) against the one that judges every read.

Each history is replayed both ways (Options.skip) and held to the same result: the whole JSON report
(states, episodes, alerts, restarts, notes), the per-read trace (every read's state), and the very
verdict each target ends on, field by field. The histories: tests/test_backtest_fast.py's hostile ones,
and random seeded ones (idle, saturated, hung, gaps, restarts, a sleep with requests kept past its
pause budget, NaN, a lost scrape, a start time that jumps) under short and default settings.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from backtest_histories import MemorySource, Phase, as_series, scrapes
from test_backtest_fast import HISTORIES, RULES, STEP, T0, _traced

from llm_vitals.backtest import replay as replay_module
from llm_vitals.backtest import report
from llm_vitals.backtest.history import Series
from llm_vitals.backtest.replay import TargetReplay
from llm_vitals.backtest.run import Options, Result, Window, backtest
from llm_vitals.backtest.steady import durations, steady
from llm_vitals.exporter.settings import ExporterSettings, TargetSettings
from llm_vitals.exporter.verdict import judge

KINDS = ("idle", "idle", "idle", "saturated", "hang", "gap", "restart")
LENGTHS = (15, 30, 45, 60, 90, 120, 300, 600, 900, 1800)
VERDICTS: dict[str, list] = {}
SHORT = {"stuck_after": 45, "down_after": 20, "startup_grace": 60, "pause_budget": 300}


def _config(names: list[str], settings: dict[str, float]) -> ExporterSettings:
    return ExporterSettings.model_validate(
        {"targets": [{"name": name, "url": f"http://{name}", "engine": "vllm", **settings} for name in names]})


def _judged(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return judge(*args, **kwargs)

    monkeypatch.setattr(replay_module, "judge", counted)
    return calls


def _every_verdict(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[bool, str], list]:
    """Each read's whole verdict, per (skipping, target): a read left out gives its run's verdict moved to its time."""
    seen: dict[tuple[bool, str], list] = {}
    traced = TargetReplay._trace

    def trace(self, at, verdict, snap):
        run = self._steady
        now = run.current() if run is not None and run.at == at else self.verdict
        seen.setdefault((self.skip, self.name), []).append((at, now))
        traced(self, at, verdict, snap)

    monkeypatch.setattr(TargetReplay, "_trace", trace)
    return seen


def both(series: list[Series], end: float, monkeypatch: pytest.MonkeyPatch, **options) -> tuple[Result, Result, int, int]:
    """The history replayed skipping and judging every read; the calls of judge each made. Every read's verdict
    is the same both ways (VERDICTS keeps the last history's, by target)."""
    calls = _judged(monkeypatch)
    verdicts = _every_verdict(monkeypatch)
    window = Window(T0 + STEP, end, STEP)
    skipping = backtest(MemorySource(series), window, Options(rules=RULES, trace=True, chunk_points=97, **options))
    skipped_calls = calls[0]
    every = backtest(MemorySource(series), window, Options(rules=RULES, trace=True, chunk_points=97, skip=False, **options))
    for name in every.targets:
        assert verdicts.get((True, name)) == verdicts.get((False, name)), name
    VERDICTS.clear()
    VERDICTS.update({name: verdicts.get((False, name), []) for name in every.targets})
    return skipping, every, skipped_calls, calls[0] - skipped_calls


def assert_same(skipping: Result, every: Result) -> None:
    assert report.as_json(skipping) == report.as_json(every)
    assert skipping.targets.keys() == every.targets.keys()
    for name, one in skipping.targets.items():
        other = every.targets[name]
        assert _traced(one.trace) == _traced(other.trace), name
        assert one.verdict == other.verdict, name
        assert [(e.state, e.start, e.end, e.reason, e.detail) for e in one.episodes] == [
            (e.state, e.start, e.end, e.reason, e.detail) for e in other.episodes], name
        assert one.alerts == other.alerts and one.notifications == other.notifications, name
        assert one.watchdog.periods == other.watchdog.periods, name


@pytest.mark.parametrize("name", sorted(HISTORIES))
def test_leaving_out_steady_reads_changes_nothing_on_a_hostile_history(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make, end = HISTORIES[name]
    skipping, every, _, _ = both(make(), end, monkeypatch)
    assert_same(skipping, every)


def _asleep(series: list[Series], low: int, high: int) -> list[Series]:
    """The engine asleep (weights offloaded) from scrape `low` to `high`: with requests kept, `paused` (sleep_kept)."""
    out = []
    for one in series:
        if one.name == "vllm:engine_sleep_state":
            level = one.labels.get("sleep_state")
            values = [(1.0 if level == "weights_offloaded" else 0.0) if low <= i < high else v
                      for i, v in enumerate(one.values)]
            one = replace(one, values=values)
        out.append(one)
    return out


def _lose_scrape(series: list[Series], index: int) -> list[Series]:
    return [replace(s, times=[t for i, t in enumerate(s.times) if i != index],
                    values=[v for i, v in enumerate(s.values) if i != index]) for s in series]


def _tamper(series: list[Series], rng: random.Random) -> list[Series]:
    count = len(series[0].times)
    if count > 4 and rng.random() < 0.6:
        low = rng.randrange(count - 2)
        series = _asleep(series, low, rng.randrange(low + 1, count))
    if count > 4 and rng.random() < 0.4:
        one = rng.choice([s for s in series if s.times])
        index = rng.randrange(len(one.values))
        values = list(one.values)
        values[index] = rng.choice([math.nan, math.inf, values[index] + 1])
        series = [replace(s, values=values) if s is one else s for s in series]
    if count > 4 and rng.random() < 0.3:
        series = _lose_scrape(series, rng.randrange(count))
    if count > 4 and rng.random() < 0.2:
        cut = rng.randrange(count)
        series = [replace(s, values=[v + 3600 if i >= cut else v for i, v in enumerate(s.values)])
                  if s.name == "process_start_time_seconds" else s for s in series]
    return series


def random_history(seed: int) -> tuple[list[Series], float]:
    """Two targets' random phases, tampered with; and the window's end."""
    rng = random.Random(seed)
    series: list[Series] = []
    end = T0
    for instance in ("gpu-a:8000", "gpu-b:8000"):
        phases = [Phase(rng.choice(KINDS), rng.choice(LENGTHS)) for _ in range(rng.randint(2, 7))]
        phases.insert(0, Phase(rng.choice(("idle", "saturated")), rng.choice(LENGTHS)))
        start = T0 + rng.choice((0, 0, 300))
        made = as_series(instance, scrapes(start, phases))
        if made and made[0].times:
            series += _tamper(made, rng)
            end = max(end, max(s.times[-1] for s in made if s.times) + rng.choice((0, 15, 600)))
    return series, end


@pytest.mark.parametrize("seed", range(40))
def test_leaving_out_steady_reads_changes_nothing_on_a_random_history(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    series, end = random_history(seed)
    settings = SHORT if seed % 2 else {}
    skipping, every, _, _ = both(series, end, monkeypatch, config=_config(["gpu-a:8000", "gpu-b:8000"], settings))
    assert_same(skipping, every)


def test_an_idle_server_is_judged_a_few_times_and_its_sleep_past_the_budget_is_still_seen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # An hour idle, then asleep with requests kept (paused, sleep_kept) for 20 minutes under a 5-minute
    # pause budget: the detail that says it is past the budget changes at a deadline the run must stop at.
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("idle", 3600), Phase("saturated", 60), Phase("hang", 1200),
                                                  Phase("idle", 600)]))
    series = _asleep(series, 244, 324)
    skipping, every, skipped_calls, every_calls = both(series, T0 + 5460, monkeypatch,
                                                       config=_config(["gpu-a:8000"], SHORT))
    assert_same(skipping, every)
    assert skipped_calls < every_calls / 3
    (target,) = every.targets.values()
    assert [(e.state, e.reason, e.start - T0) for e in target.episodes if e.state == "paused"] == [
        ("paused", "sleep_kept", 3660.0)]
    # Past the budget from T0 + 3960 (paused since T0 + 3660, a 300 s budget): the read after it says so.
    past = [at - T0 for at, verdict in VERDICTS["gpu-a:8000"] if "past pause_budget" in verdict.detail]
    assert past[0] == 3975.0 and past[-1] == 4845.0


def test_a_verdict_that_counts_reads_or_runs_a_clock_is_not_steady() -> None:
    target = TargetSettings.model_validate({"name": "t", "url": "http://t", "engine": "vllm"})
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 60), Phase("hang", 300)]))
    from llm_vitals.backtest.history import Columns
    from llm_vitals.backtest.replay import read_found
    from llm_vitals.exporter.engines.table import ENGINES

    columns = Columns.of(series, ("vllm:request_queue_time_seconds_bucket", "vllm:request_queue_time_seconds_count"))
    verdicts, times = [], []
    position, verdict = 0, None
    for k in range(len(columns.times)):
        read, position = columns.read_at(columns.times[k], STEP, position)
        verdict = judge(verdict, read_found(ENGINES["vllm"], read.found), read.at, target)
        verdicts.append(verdict)
        times.append(read.at)
    # The hung reads: the stuck clock runs and the reads without progress count up: never steady.
    assert all(steady(a, ta, b, tb, target) is None for a, ta, b, tb in
               zip(verdicts[5:], times[5:], verdicts[6:], times[6:], strict=False))
    assert 0.0 in durations(target) and 60.0 in durations(target) and 1800.0 in durations(target)
