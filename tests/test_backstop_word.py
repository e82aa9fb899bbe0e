"""The gate's word for the kubelet's liveness backstop, per workload (llm_vitals/remediator/gate_word.py).

One table over the gate's state, with the time as an input: every reason the remediator holds a
workload, the first one winning, and `act` only when the gate would decide the workload's alert on
its merits. Before this, nothing of the gate reached the shims: a pause, a page, an open circuit or
a fleet-wide storm held the remediator and never the kubelet.
"""

from __future__ import annotations

import json

import pytest

from llm_vitals.backstop_word import DETAIL_LIMIT, BackstopWord, act, answer_json, hold, word_in
from llm_vitals.remediator.gate import STORM_HOLD, GatePolicy, HeldAlert, JournalState
from llm_vitals.remediator.gate_word import HELD_STALE, UNKNOWN_HOLD, word_for

W = "Deployment/llm/vllm"
OTHER = "Deployment/llm/other"
NOW = 100_000.0
POLICY = GatePolicy(targets=frozenset({"a"}), global_cooldown=300.0, max_restarts=3, budget_window=3600.0,
                    max_unhealthy=1, storm_cooldown=0.0, backoff_initial=900.0)


def held(reason: str, workload: str = W, since: float = NOW - 30, at: float = NOW - 30) -> dict[str, HeldAlert]:
    """A stuck target of `workload` the gate refused for `reason` (JournalState.held)."""
    return {"llm/vllm-abc": HeldAlert(workload, reason, since, at, "fp", NOW - 600, "LLMServerStuck")}


CASES = [
    # (id, state, lost, unknown_since, word, reason, since)
    ("nothing held", JournalState(), False, None, "act", "", None),
    ("state lost", JournalState(), True, None, "hold", "state_lost", None),
    ("paused", JournalState(paused_until=NOW + 60, pause_reason="maintenance"), False, None, "hold", "paused", None),
    ("a pause that ended", JournalState(paused_until=NOW - 1), False, None, "act", "", None),
    ("paged", JournalState(pages={W: NOW - 5000}), False, None, "hold", "escalated_to_human", NOW - 5000),
    ("another workload paged", JournalState(pages={OTHER: NOW - 5000}), False, None, "act", "", None),
    ("circuit open", JournalState(open_circuits=frozenset({W}), restart_times={W: (NOW - 4000,)}), False, None,
     "hold", "circuit_open", NOW - 4000),
    ("budget used within the window", JournalState(restart_times={W: (NOW - 3000, NOW - 2000, NOW - 1000)}),
     False, None, "hold", "circuit_open", NOW - 1000),
    ("budget used by the kubelet's restarts too", JournalState(restart_times={W: (NOW - 3000,)},
                                                               outside_restarts={W: (NOW - 2000, NOW - 1000)}),
     False, None, "hold", "circuit_open", NOW - 3000),
    ("restart of it running", JournalState(in_progress="llm/vllm-abc", in_progress_expires=NOW + 30,
                                           last_restart_started=NOW - 10, restart_times={W: (NOW - 10,)}),
     False, None, "hold", "restart_in_progress", NOW - 10),
    ("restart of another running: the global cooldown", JournalState(
        in_progress="llm/other-x", in_progress_expires=NOW + 30, last_restart_started=NOW - 10,
        restart_times={OTHER: (NOW - 10,)}), False, None, "hold", "cooldown", NOW - 10),
    ("its restart done, in the global cooldown", JournalState(last_restart_started=NOW - 100, restart_times={W: (NOW - 100,)}),
     False, None, "hold", "cooldown", NOW - 100),
    ("a dead replica's claim past its expiry, cooldown over", JournalState(
        in_progress="llm/vllm-abc", in_progress_expires=NOW - 1, last_restart_started=NOW - 400,
        restart_times={W: (NOW - 400,)}), False, None, "act", "", None),
    ("backoff of a loop", JournalState(last_restart_started=NOW - 400, restart_times={W: (NOW - 400,)},
                                       backoff={W: (1, NOW - 400)}), False, None, "hold", "backoff", NOW - 400),
    ("backoff passed", JournalState(last_restart_started=NOW - 1000, restart_times={W: (NOW - 1000,)},
                                    backoff={W: (1, NOW - 1000)}), False, None, "act", "", None),
    ("a storm in the state", JournalState(storm_seen_at=NOW - 60), False, None, "hold", "fleet_gate", NOW - 60),
    ("a storm long past", JournalState(storm_seen_at=NOW - STORM_HOLD - 1), False, None, "act", "", None),
    ("a storm dated ahead of the clock holds nothing", JournalState(storm_seen_at=NOW + 30), False, None,
     "act", "", None),
    # The shared state's holds: every replica reads them, a restarted one too.
    ("a GPU fault refused for it", JournalState(held=held("gpu_fault")), False, None, "hold", "gpu_fault", NOW - 30),
    ("a GPU fault refused for another", JournalState(held=held("gpu_fault", OTHER)), False, None, "act", "", None),
    ("a cordon refused by the limit", JournalState(held=held("cordon_limit")), False, None, "hold", "cordon_limit",
     NOW - 30),
    ("a fleet gate refusal of it, however old the storm", JournalState(held=held("fleet_gate", since=NOW - 5000)),
     False, None, "hold", "fleet_gate", NOW - 5000),
    # A hold that ended keeps the word until the remediator has decided the target again.
    ("a pause lifted, its target not decided again yet", JournalState(paused_until=NOW - 5, held=held("paused")),
     False, None, "hold", "paused", NOW - 30),
    ("a held target no replica re-decided for long", JournalState(held=held("gpu_fault", at=NOW - HELD_STALE)),
     False, None, "act", "", None),
    ("an unknown workload, first asked lately", JournalState(), False, NOW - 60, "hold", "unknown_workload", NOW - 60),
    ("an unknown workload, held long enough", JournalState(), False, NOW - UNKNOWN_HOLD, "act", "", None),
    # The first reason wins: a paged workload in a paused remediator says paused (a human lifts both).
    ("paused and paged", JournalState(paused_until=NOW + 60, pages={W: NOW - 10}), False, None,
     "hold", "paused", None),
    ("lost beats everything", JournalState(paused_until=NOW + 60, held=held("gpu_fault")), True, None,
     "hold", "state_lost", None),
]


@pytest.mark.parametrize("state, lost, unknown_since, word, reason, since", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_gates_word_for_a_workload(state, lost, unknown_since, word, reason, since):
    said = word_for(W, state, POLICY, NOW, lost=lost, unknown_since=unknown_since)
    assert (said.workload, said.word, said.reason, said.since) == (W, word, reason, since)
    assert bool(said.detail) == (word == "hold")


def test_the_storm_cooldown_holds_as_long_as_it_is_longer():
    policy = GatePolicy(targets=frozenset(), global_cooldown=0.0, max_restarts=3, budget_window=3600.0,
                        max_unhealthy=1, storm_cooldown=3 * STORM_HOLD)
    state = JournalState(storm_seen_at=NOW - 2 * STORM_HOLD)
    assert word_for(W, state, policy, NOW).reason == "storm_cooldown"  # as the gate would refuse a stuck target
    assert word_for(W, state, policy, NOW + STORM_HOLD + 1).word == "act"


@pytest.mark.parametrize("restart_times, pod, actor", [
    ({W: (NOW - 50,)}, "vllm-abc", "remediator"),  # its own restart since the alert began
    ({W: (NOW - 500,)}, "vllm-abc", "kubelet"),  # its restart was before the alert: not this one
    ({}, "vllm-abc", "kubelet"),
    ({}, None, "other"),
    ({OTHER: (NOW - 50,)}, None, "other"),
])
def test_a_restart_no_remediator_action_explains_is_the_kubelets_in_a_pod(restart_times, pod, actor):
    from llm_vitals.remediator.gate import TargetStatus
    from llm_vitals.remediator.gate_word import restart_actor

    status = TargetStatus(state="starting", pod=pod, workload=W)
    assert restart_actor(status, JournalState(restart_times=restart_times), W, NOW - 100) == actor


# -- one word, one wire shape (llm_vitals/backstop_word.py) -----------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_shim_reads_every_word_the_remediator_writes_as_it_was(case):
    _, state, lost, unknown_since, _, _, _ = case
    said = word_for(W, state, POLICY, NOW, lost=lost, unknown_since=unknown_since)
    assert word_in(json.loads(json.dumps(answer_json(NOW, [said]))), W) == said


def test_a_word_is_whole_or_not_made():
    assert BackstopWord(workload=W, word="hold", reason="paused", detail="x" * 900).detail == "x" * DETAIL_LIMIT
    assert word_in({"words": [{"workload": W, "word": "act", "reason": None, "detail": None}]}, W) == act(W)
    with pytest.raises(ValueError, match="contradictory"):
        hold(W, "", None, "a hold without a reason")
    with pytest.raises(ValueError, match="contradictory"):
        BackstopWord(workload=W, word="act", reason="paused")
