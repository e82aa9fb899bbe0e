"""The fleet's pace readings (llm_vitals/exporter/pace_track.py): peers by group, stale peers, units, forgetting."""

from __future__ import annotations

import pytest

from llm_vitals.exporter.engines import PageReading, Unit
from llm_vitals.exporter.pace import NOT_JUDGED, Pace, PaceRules
from llm_vitals.exporter.pace_track import PaceTracker, unit_readings

RULES = PaceRules(ratio=2.0, degraded_after=10.0, min_peers=2, window=20.0, min_work=50.0)


def snapshot(seconds: float, tokens: float) -> PageReading:
    return PageReading(running=2, waiting=0, pace=(seconds, tokens))


def drive(tracker: PaceTracker, paces: dict[str, tuple[str, float]], until: float, step: float = 1.0) -> dict[str, Pace]:
    """Each target (name -> (group, seconds per token)) making 100 tokens a second until `until`."""
    judged = {name: NOT_JUDGED for name in paces}
    now = 0.0
    while now <= until:
        for name, (group, per_token) in paces.items():
            judged[name] = tracker.observe(name, group, snapshot(100 * now * per_token, 100 * now), now, RULES, judged[name])
        now += step
    return judged


def test_peers_are_the_targets_of_one_group_only() -> None:
    tracker = PaceTracker()
    judged = drive(tracker, {"a": ("w", 0.01), "b": ("w", 0.01), "c": ("w", 0.03), "x": ("other", 0.01)}, 30.0)
    assert judged["c"].degraded and judged["c"].peers == 2 and judged["c"].ratio == pytest.approx(3.0)
    assert not judged["a"].degraded and judged["a"].ratio == pytest.approx(1 / 2)  # median of b (0.01) and c (0.03)
    assert judged["x"].basis == "alone" and judged["x"].ratio is None


def test_a_peer_whose_reads_stopped_ages_out_after_the_window_and_a_forgotten_one_at_once() -> None:
    tracker = PaceTracker()
    drive(tracker, {"a": ("w", 0.01), "b": ("w", 0.01), "c": ("w", 0.03)}, 10.0)
    # a's and b's reads stop at 10 s: within the window (20 s) they are still peers, past it no more.
    assert tracker.observe("c", "w", snapshot(100 * 25 * 0.03, 2500), 25.0, RULES, NOT_JUDGED).peers == 2
    pace = tracker.observe("c", "w", snapshot(100 * 31 * 0.03, 3100), 31.0, RULES, NOT_JUDGED)
    assert pace.basis == "alone" and pace.peers == 0
    tracker = PaceTracker()
    drive(tracker, {"a": ("w", 0.01), "b": ("w", 0.01), "c": ("w", 0.03)}, 10.0)
    tracker.forget("b")
    assert tracker.observe("c", "w", snapshot(100 * 14 * 0.03, 1400), 14.0, RULES, NOT_JUDGED).basis == "too_few_peers"


def test_a_missed_read_keeps_the_judgement_and_reads_are_taken_a_sixth_of_a_window_apart() -> None:
    tracker = PaceTracker()
    judged = drive(tracker, {"a": ("w", 0.01), "b": ("w", 0.01), "c": ("w", 0.03)}, 30.0)
    assert tracker.observe("c", "w", None, 31.0, RULES, judged["c"]) is judged["c"]
    fresh = tracker.observe("c", "w", snapshot(100 * 40 * 0.03, 4000), 40.0, RULES, judged["c"])
    assert fresh is not judged["c"] and fresh.degraded
    # 3 s after its last reading (under 20 s / 6): the judgement stands, nothing is computed.
    assert tracker.observe("c", "w", snapshot(100 * 43 * 0.03, 4300), 43.0, RULES, fresh) is fresh
    assert tracker.observe("c", "w", snapshot(100 * 44 * 0.03, 4400), 44.0, RULES, fresh) is not fresh


def test_a_target_that_changes_workload_changes_peers() -> None:
    tracker = PaceTracker()
    drive(tracker, {"a": ("w", 0.01), "b": ("w", 0.01), "c": ("w", 0.03)}, 5.0)
    tracker.observe("c", "v", snapshot(100 * 9 * 0.03, 900), 9.0, RULES, NOT_JUDGED)
    assert tracker.observe("a", "w", snapshot(100 * 9 * 0.01, 900), 9.0, RULES, NOT_JUDGED).peers == 1


def test_units_with_their_own_pace_are_peers_of_each_other() -> None:
    def dp(now: float, slow: float) -> PageReading:
        units = tuple(Unit(f'engine="{i}"', 1, 0, 0, (), (), (100 * now * (slow if i == 1 else 0.01), 100 * now))
                      for i in range(3))
        return PageReading(running=3, waiting=0, units=units, pace=(0.0, 0.0))

    assert set(unit_readings(dp(1.0, 0.03), 1.0)) == {'engine="0"', 'engine="1"', 'engine="2"'}
    tracker, pace = PaceTracker(), NOT_JUDGED
    for now in range(0, 31):
        pace = tracker.observe("dp", "alone-workload", dp(float(now), 0.03), float(now), RULES, pace)
    assert pace.degraded and pace.ratio == pytest.approx(3.0) and pace.detail.startswith('engine="1"')
