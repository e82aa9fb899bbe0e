"""llm-vitals-backtest --compare-live below the HTTP layer: the exporter's own llm_vitals_state against the replay.

The exporter's series are written from a first replay of the same history (what a live exporter
that agreed would have exported), then spoiled on purpose. The real exporter, simulator and
Prometheus are in tests/test_backtest_live.py.
"""

from __future__ import annotations

import json

from backtest_histories import MemorySource, Phase, as_series, scrapes

from llm_vitals.backtest import html, report
from llm_vitals.backtest.history import Series
from llm_vitals.backtest.live import compare, live_timelines, match_targets
from llm_vitals.backtest.rules import load_rules
from llm_vitals.backtest.run import Options, Window, backtest
from llm_vitals.targets import STATES

T0 = 1_790_000_000.0
STEP = 15.0
RULES = load_rules()
HANG_AND_RESTART = [Phase("saturated", 1800), Phase("hang", 600), Phase("gap", 90), Phase("restart"), Phase("saturated", 600)]
LENGTH = 1800 + 600 + 90 + 600
WINDOW = Window(T0 + STEP, T0 + LENGTH - STEP, STEP)


def exporter_series(target: str, timeline: list[tuple[float, str]], instance: str = "exporter:9500") -> list[Series]:
    """llm_vitals_state as the exporter exports it: one series per state, 1 for the state of each scrape."""
    return [Series("llm_vitals_state", {"target": target, "state": state, "instance": instance, "job": "llm-vitals"},
                   [at for at, _ in timeline], [1.0 if now == state else 0.0 for _, now in timeline])
            for state in STATES]


def engine_history() -> list[Series]:
    return as_series("gpu-a:8000", scrapes(T0, HANG_AND_RESTART)) + as_series("gpu-b:8000", scrapes(T0, [Phase("saturated", LENGTH)]))


def agreeing_timeline(name: str) -> list[tuple[float, str]]:
    # The exporter polls on its own clock: 5 s after each of Prometheus's scrapes of the engine.
    replay = backtest(MemorySource(engine_history()), WINDOW, Options(rules=RULES)).targets[name]
    return [(at, replay.state_at(at) or "starting") for at in (T0 + 20 + 15 * k for k in range(int(LENGTH / 15) - 2))]


def test_an_exporter_that_agreed_scores_100_percent_and_one_that_did_not_shows_each_long_disagreement() -> None:
    spoiled = agreeing_timeline("gpu-b:8000")
    # Five scrapes where the exporter said stuck and the replay says busy, and a one-scrape blip.
    for k in range(40, 45):
        spoiled[k] = (spoiled[k][0], "stuck")
    spoiled[80] = (spoiled[80][0], "idle")
    series = (engine_history() + exporter_series("gpu-a:8000", agreeing_timeline("gpu-a:8000"))
              + exporter_series("gpu-b:8000", spoiled))
    result = backtest(MemorySource(series), WINDOW, Options(rules=RULES, compare_live=True))
    assert result.live is not None
    by_target = {a.target: a for a in result.live}
    assert by_target["gpu-a:8000"].percent == 100.0 and not by_target["gpu-a:8000"].disagreements
    b = by_target["gpu-b:8000"]
    assert b.compared - b.agreed == 6
    (long,) = b.disagreements
    assert (long.scrapes, long.live, long.replay, long.start) == (5, "stuck", "busy", spoiled[40][0])
    text = report.as_text(result)
    assert "live gpu-b:8000: the replay agrees with 97.1% of 204 exporter scrape(s)" in text
    assert "for 5 scrapes: live stuck, replay busy" in text
    assert "compare-live: 2 target(s), the replay agrees with 98." in text
    assert json.loads(report.dumps(result))["live"][1]["disagreements"][0]["scrapes"] == 5
    assert "for 5 scrapes: live stuck, replay busy" in html.page(result)


def test_a_live_target_is_matched_by_name_or_by_its_url_s_host_and_port() -> None:
    urls = {"gpu-a": "http://gpu-a:8000", "other": "http://10.0.0.9:8000/v1"}
    assert match_targets(["gpu-a", "gpu-b:8000", "other"], ["gpu-a:8000", "gpu-b:8000"], urls) == {
        "gpu-a:8000": "gpu-a", "gpu-b:8000": "gpu-b:8000"}


def test_without_the_exporter_s_series_compare_live_says_so() -> None:
    result = backtest(MemorySource(engine_history()), WINDOW, Options(rules=RULES, compare_live=True))
    assert result.live == []
    assert any("no llm_vitals_state series" in n.text for n in result.notes)


def test_a_replicated_exporter_pair_is_read_once() -> None:
    timeline = [(T0 + 15 * k, "busy") for k in range(10)]
    series = exporter_series("a", timeline, "exporter-0:9500") + exporter_series("a", [(t, "stuck") for t, _ in timeline],
                                                                                   "exporter-1:9500")
    assert live_timelines(series) == {"a": timeline}


def test_scrapes_before_the_replay_s_first_read_are_not_compared() -> None:
    agreement = compare("a", "a", [(10.0, "busy"), (20.0, "busy"), (30.0, "busy")],
                        lambda at: None if at < 20 else "busy", (0.0, 100.0))
    assert (agreement.compared, agreement.agreed) == (2, 2)
