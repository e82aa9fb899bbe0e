"""The pace rule (llm_vitals/exporter/pace.py): a replica against its peers, over time, as tables."""

from __future__ import annotations

import pytest

from llm_vitals.exporter.pace import (
    NOT_JUDGED,
    Measure,
    Pace,
    PaceRules,
    Reading,
    add_reading,
    judge_pace,
    measure,
    peer_group,
)

RULES = PaceRules(ratio=2.0, degraded_after=600.0, min_peers=2, window=120.0, min_work=100.0)
FAST = 0.02  # seconds per token


def fleet(*paces: tuple[float, float]) -> list[Measure]:
    """Measures from (seconds per token, tokens in the window)."""
    return [Measure(seconds, work) for seconds, work in paces]


def judge_all(measures: list[Measure], before: list[Pace], now: float, rules: PaceRules = RULES) -> list[Pace]:
    """Each replica judged against every other one, as the store does for one workload."""
    return [judge_pace([("", own, measures[:i] + measures[i + 1:])], before[i], now, rules)
            for i, own in enumerate(measures)]


def run(measures: list[Measure], seconds: float, step: float = 5.0, rules: PaceRules = RULES) -> list[Pace]:
    """The judgements after `seconds` of the same measures, judged every `step`."""
    paces = [NOT_JUDGED] * len(measures)
    now = 0.0
    while now <= seconds:
        paces = judge_all(measures, paces, now, rules)
        now += step
    return paces


# (what, the replicas' (seconds per token, tokens in the window), which are degraded after 10 min)
CASES = [
    ("three alike", [(FAST, 800), (FAST, 800), (FAST, 800)], [False, False, False]),
    ("one slowed 3x", [(FAST, 800), (FAST, 800), (3 * FAST, 300)], [False, False, True]),
    # 4, 4 and 2 clients: half the tokens, at the same pace per token.
    ("uneven load", [(FAST, 800), (FAST, 800), (FAST, 400)], [False, False, False]),
    ("uneven load, a little slower under more clients", [(1.3 * FAST, 800), (1.3 * FAST, 800), (FAST, 400)],
     [False, False, False]),
    ("a fleet-wide slowdown", [(3 * FAST, 300), (3 * FAST, 300), (3 * FAST, 300)], [False, False, False]),
    ("slow, with too little work to judge", [(FAST, 800), (FAST, 800), (3 * FAST, 40)], [False, False, False]),
    ("slow, with a single peer", [(FAST, 800), (3 * FAST, 300)], [False, False]),
    ("slow, whose peers did too little work", [(FAST, 50), (FAST, 50), (3 * FAST, 300)], [False, False, False]),
    ("1.9x: under pace.ratio", [(FAST, 800), (FAST, 800), (1.9 * FAST, 400)], [False, False, False]),
    ("two of five slowed: the median is still the healthy pace",
     [(FAST, 800), (FAST, 800), (FAST, 800), (3 * FAST, 300), (3 * FAST, 300)], [False, False, False, True, True]),
]


@pytest.mark.parametrize(("paces", "degraded"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_pace_table(paces: list[tuple[float, float]], degraded: list[bool]) -> None:
    assert [pace.degraded for pace in run(fleet(*paces), 600.0)] == degraded


def test_degraded_only_after_degraded_after_and_cleared_when_pace_recovers() -> None:
    slow = fleet((FAST, 800), (FAST, 800), (3 * FAST, 300))
    before = run(slow, 595.0)
    assert before[2].ratio == pytest.approx(3.0) and before[2].slow_since == 0.0 and not before[2].degraded
    after = judge_all(slow, before, 600.0)
    assert after[2].degraded and after[2].since == 600.0 and after[2].basis == "judged" and after[2].peers == 2
    later = judge_all(slow, after, 900.0)
    assert later[2].since == 600.0  # since stays when it began
    recovered = judge_all(fleet((FAST, 800), (FAST, 800), (FAST, 800)), later, 905.0)
    assert not recovered[2].degraded and recovered[2].slow_since is None and recovered[2].since is None


def test_a_break_in_slowness_starts_the_clock_again() -> None:
    slow, healthy = fleet((FAST, 800), (FAST, 800), (3 * FAST, 300)), fleet((FAST, 800), (FAST, 800), (FAST, 800))
    paces = run(slow, 500.0)
    paces = judge_all(healthy, paces, 505.0)
    paces = judge_all(slow, paces, 510.0)
    assert paces[2].slow_since == 510.0 and not judge_all(slow, paces, 1000.0)[2].degraded


def test_a_replica_not_judged_says_why() -> None:
    alone = judge_pace([("", Measure(3 * FAST, 300), [])], NOT_JUDGED, 0.0, RULES)
    assert (alone.basis, alone.ratio, alone.degraded) == ("alone", None, False)
    one_peer = judge_pace([("", Measure(3 * FAST, 300), fleet((FAST, 800)))], NOT_JUDGED, 0.0, RULES)
    assert one_peer.basis == "too_few_peers" and "pace.min_peers 2" in one_peer.detail
    idle = judge_pace([("", Measure(None, 0.0), fleet((FAST, 800), (FAST, 800)))], NOT_JUDGED, 0.0, RULES)
    assert idle.basis == "too_little_work" and idle.peers == 2
    assert judge_pace([], NOT_JUDGED, 0.0, RULES).basis == "no_signal"


def test_a_degraded_replica_that_stops_working_is_no_longer_judged_after_a_window() -> None:
    paces = run(fleet((FAST, 800), (FAST, 800), (3 * FAST, 300)), 600.0)
    assert paces[2].degraded
    hung = fleet((FAST, 800), (FAST, 800), (None, 0.0))  # type: ignore[arg-type]
    # Within one window of its last slow read: no evidence either way, it keeps its word and clock.
    held = judge_all(hung, paces, 600.0 + RULES.window)
    assert held[2].degraded and held[2].basis == "too_little_work" and held[2].ratio is None and held[2].since == 600.0
    gone = judge_all(hung, held, 600.0 + RULES.window + 5)
    assert not gone[2].degraded and gone[2].basis == "too_little_work" and gone[2].slow_since is None


def test_a_slow_replica_whose_window_lacks_finished_work_keeps_its_clock() -> None:
    # llama.cpp's counters move when a request ends: a slow replica's window may hold none for a while.
    slow, gap = fleet((FAST, 800), (FAST, 800), (3 * FAST, 300)), fleet((FAST, 800), (FAST, 800), (3 * FAST, 20))
    paces = run(slow, 300.0)
    paces = judge_all(gap, paces, 360.0)
    assert paces[2].slow_since == 0.0
    paces = judge_all(slow, paces, 600.0)
    assert paces[2].degraded and paces[2].since == 600.0


def test_one_unit_of_a_data_parallel_server_is_judged_against_its_siblings() -> None:
    # One replica, four data-parallel ranks, rank 2 limping: its siblings are its peers.
    ranks = fleet((FAST, 800), (FAST, 800), (3 * FAST, 300), (FAST, 800))
    units = [(f'dp_rank="{i}"', own, ranks[:i] + ranks[i + 1:]) for i, own in enumerate(ranks)]
    pace = NOT_JUDGED
    for now in range(0, 605, 5):
        pace = judge_pace(units, pace, float(now), RULES)
    assert pace.degraded and pace.ratio == pytest.approx(3.0) and pace.peers == 3
    assert pace.detail.startswith('dp_rank="2"')
    # All four ranks at one pace: none is, whatever the load of each.
    even = fleet((FAST, 800), (FAST, 400), (FAST, 800), (FAST, 200))
    assert not judge_pace([(str(i), own, even[:i] + even[i + 1:]) for i, own in enumerate(even)],
                          NOT_JUDGED, 0.0, PaceRules(degraded_after=0.0)).degraded


def test_readings_keep_the_window_and_start_again_after_a_restart() -> None:
    readings: tuple[Reading, ...] = ()
    for at in range(0, 200, 10):
        readings = add_reading(readings, Reading(float(at), at * 0.2, at * 10.0), 120.0)
    assert readings[0].at == 70.0 and readings[-1].at == 190.0
    assert measure(readings) == Measure(pytest.approx(0.02), 1200.0)  # type: ignore[arg-type]
    assert add_reading(readings, None, 120.0) == readings  # a missed read changes nothing
    restarted = add_reading(readings, Reading(200.0, 1.0, 5.0), 120.0)
    assert restarted == (Reading(200.0, 1.0, 5.0),) and measure(restarted) == Measure(None, 0.0)


@pytest.mark.parametrize(("workload", "group"), [
    ("Deployment/ns/llama", "Deployment/ns/llama"),
    ("LeaderWorkerSet/ns/big/3", "LeaderWorkerSet/ns/big"),
    ("my-fleet", "my-fleet"),
])
def test_peer_group(workload: str, group: str) -> None:
    assert peer_group(workload) == group
