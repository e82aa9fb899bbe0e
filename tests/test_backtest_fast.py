"""The backtest's fast path (samples straight to the adapter, history.Columns) against its reference (each scrape
written as a page and scanned back, history.Scrapes): the same result, to the last field, on hostile histories.

Each history is replayed both ways and the whole JSON document compared, notes included.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from backtest_histories import MemorySource, Phase, as_series, scrapes

from llm_vitals.backtest import report
from llm_vitals.backtest.history import Columns, Series
from llm_vitals.backtest.rules import load_rules
from llm_vitals.backtest.run import Options, Window, backtest

T0 = 1_790_000_000.0
STEP = 15.0
RULES = load_rules()
HANG_AND_RESTART = [Phase("saturated", 3600), Phase("hang", 600), Phase("gap", 90), Phase("restart"), Phase("saturated", 600)]


def both(series: list[Series], end: float, **options) -> tuple[dict, dict]:
    window = Window(T0 + STEP, end, STEP)
    fast = backtest(MemorySource(series), window, Options(rules=RULES, trace=True, chunk_points=97, **options))
    slow = backtest(MemorySource(series), window, Options(rules=RULES, trace=True, chunk_points=97, fast=False, **options))
    for name, replay in fast.targets.items():
        # The HTML page's per-read trace too: every read judged alike, not only the episodes.
        assert _traced(replay.trace) == _traced(slow.targets[name].trace), name
    return report.as_json(fast), report.as_json(slow)


def _traced(trace) -> list[list]:
    return [[None if x != x else x for x in column] for column in (trace.at, trace.state, trace.pending, trace.steps_rate)]


def _set(series: list[Series], name: str, index: int, value: float) -> list[Series]:
    one = next(s for s in series if s.name == name)
    values = list(one.values)
    values[index] = value
    return [replace(s, values=values) if s is one else s for s in series]


def _relabelled(series: list[Series], after: float, **labels: str) -> list[Series]:
    """Each series split at `after`: its samples from then on under new labels (a relabel, a renamed model)."""
    out: list[Series] = []
    for one in series:
        cut = sum(1 for t in one.times if t < after)
        out.append(Series(one.name, one.labels, one.times[:cut], one.values[:cut]))
        out.append(Series(one.name, {**one.labels, **labels}, one.times[cut:], one.values[cut:]))
    return out


def hang_and_restart() -> list[Series]:
    return as_series("gpu-a:8000", scrapes(T0, HANG_AND_RESTART)) + as_series("gpu-b:8000", scrapes(T0, [Phase("saturated", 5000)]))


def idle_then_hang() -> list[Series]:
    return as_series("gpu-a:8000", scrapes(T0, [Phase("idle", 1800), Phase("saturated", 600), Phase("hang", 900),
                                                 Phase("idle", 1500)]))


def nan_and_inf() -> list[Series]:
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 2400), Phase("hang", 600)]))
    series = _set(series, "vllm:num_requests_running", 60, math.nan)
    series = _set(series, "vllm:kv_cache_usage_perc", 70, math.inf)
    return _set(series, "vllm:iteration_tokens_total_count", 80, -math.inf)


def counters_fall_without_start_time() -> list[Series]:
    return [s for s in as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 900), Phase("restart"),
                                                            Phase("saturated", 900)]))
            if s.name != "process_start_time_seconds"]


def duplicated_by_a_relabel() -> list[Series]:
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 1800), Phase("hang", 900)]))
    waiting = next(s for s in series if s.name == "vllm:num_requests_waiting")
    # A copy that disagrees, over half the window: the first series of the line is read either way.
    copy = Series(waiting.name, {**waiting.labels, "job": "vllm-relabelled"}, waiting.times[60:],
                  [v + 1 for v in waiting.values[60:]])
    return [*series, copy]


def labels_change_mid_window() -> list[Series]:
    # At T0 + 1800 the pod is rescheduled under a new pod label (a target label: the same page lines)
    # and at T0 + 2700 the model is renamed (an engine label: new page lines, the old ones gone).
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 2400), Phase("hang", 1200)]),
                       extra={"pod": "vllm-0"})
    series = _relabelled(series, T0 + 1800, pod="vllm-1")
    return _relabelled(series, T0 + 2700, model_name="tiny-v2")


def up_0_then_gone() -> list[Series]:
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 1200), Phase("gap", 300), Phase("saturated", 600)]))
    failed = [T0 + 1200 + 15 * i for i in range(20)]
    return [*series, Series("up", {"instance": "gpu-a:8000", "job": "vllm"}, failed, [0.0] * len(failed))]


def late_target() -> list[Series]:
    return (as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 3600)]))
            + as_series("gpu-c:8000", scrapes(T0 + 1800, [Phase("hang", 1800)])))


def _column(series: list[Series], name: str, value_at) -> list[Series]:
    """`name`'s series with each value replaced by value_at(index, value)."""
    return [replace(s, values=[value_at(i, v) for i, v in enumerate(s.values)]) if s.name == name else s for s in series]


def held_lines_that_are_not_quite_held() -> list[Series]:
    # The fast path shares one sample per line whose value held over a chunk (Columns._make): a gauge at
    # -0.0 that is 0.0 at one scrape (the page writes the two apart), a NaN at every scrape (equal to
    # nothing), a line that holds only until the chunk's last scrape, and a finished reason that moves
    # beside four that hold; chunks of 97 reads cut them at odd places.
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("idle", 1500), Phase("saturated", 1500), Phase("hang", 1500)]))
    series = _column(series, "vllm:kv_cache_usage_perc", lambda i, v: 0.0 if i == 130 else -0.0)
    series = _column(series, "vllm:num_requests_waiting", lambda i, v: -0.0 if i % 97 == 96 and not v else v)
    series = _column(series, "vllm:prompt_tokens_total", lambda i, v: math.nan if 200 <= i < 300 else v)
    return _column(series, "process_start_time_seconds", lambda i, v: v + (1.0 if i == 96 else 0.0))


HISTORIES = {
    "hang_and_restart": (hang_and_restart, T0 + 4800),
    "idle_then_hang": (idle_then_hang, T0 + 4800),
    "nan_and_inf": (nan_and_inf, T0 + 3000),
    "counters_fall_without_start_time": (counters_fall_without_start_time, T0 + 1800 - STEP),
    "duplicated_by_a_relabel": (duplicated_by_a_relabel, T0 + 2700),
    "labels_change_mid_window": (labels_change_mid_window, T0 + 3600),
    "up_0_then_gone": (up_0_then_gone, T0 + 2400),
    "late_target": (late_target, T0 + 3600 - STEP),
    "held_lines_that_are_not_quite_held": (held_lines_that_are_not_quite_held, T0 + 4500 - STEP),
}


@pytest.mark.parametrize("name", sorted(HISTORIES))
def test_the_fast_path_gives_the_reference_s_result_on_a_hostile_history(name: str) -> None:
    make, end = HISTORIES[name]
    fast, slow = both(make(), end)
    assert fast == slow
    assert fast["targets"], name


def test_labels_that_change_mid_window_are_one_target_and_its_hang_is_found() -> None:
    fast, _ = both(labels_change_mid_window(), T0 + 3600)
    unchanged, _ = both(as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 2400), Phase("hang", 1200)])), T0 + 3600)
    (target,), (same,) = fast["targets"], unchanged["targets"]
    assert [e["state"] for e in target["episodes"]] == ["stuck"]
    assert target["episodes"] == same["episodes"] and target["alerts"] == same["alerts"]
    assert target["restarts_seen"] == 0  # a renamed model's lines are no new process
    assert target["missed_reads"] == same["missed_reads"]  # no read lost at either change


def test_a_run_of_identical_scrapes_is_one_set_of_samples() -> None:
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("idle", 600)]))
    columns = Columns.of(series)
    reads = []
    position = 0
    for k in range(1, 40):
        read, position = columns.read_at(T0 + k * STEP, STEP, position)
        reads.append(read)
    assert all(r.found is reads[0].found and r.key == reads[0].key for r in reads)
    assert reads[0].scraped_at is not None and reads[-1].scraped_at == T0 + 39 * STEP


class _Flagged:
    """A verdict as a later verdict.py may return it: with a `degraded` flag beside its state."""

    def __init__(self, verdict, degraded: bool) -> None:
        self.inner, self.degraded = verdict, degraded

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_any_other_state_and_a_degraded_flag_are_episodes_without_a_change_here(monkeypatch) -> None:
    from dataclasses import replace as replaced

    from llm_vitals.backtest import replay

    judge = replay.judge

    def later_judge(previous, observation, now, *args):
        # Where a new rule would say so: `paused` for ten minutes, `degraded` for five within the busy hour.
        real = previous.inner if isinstance(previous, _Flagged) else previous
        verdict = judge(real, observation, now, *args)
        if T0 + 600 <= now < T0 + 1200:
            verdict = replaced(verdict, state="paused", reason="paused", detail="a weight sync")
        return _Flagged(verdict, T0 + 1800 <= now < T0 + 2100)

    monkeypatch.setattr(replay, "judge", later_judge)
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 3600)]))
    fast, slow = both(series, T0 + 3600 - STEP)
    assert fast == slow
    (target,) = fast["targets"]
    assert [(e["state"], e["start"] - T0, e["end"] - T0) for e in target["episodes"]] == [
        ("paused", 600, 1200), ("degraded", 1800, 2100)]
    assert fast["totals"]["episodes"] == {"degraded": 1, "paused": 1}
