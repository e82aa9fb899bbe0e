"""The gate's word for the kubelet's liveness backstop, per workload (llm_vitals/remediator/backstop.py).

One table over the gate's state, with the time as an input: every reason the remediator holds a
workload, the first one winning, and `act` only when the gate would decide the workload's alert on
its merits. Before this, nothing of the gate reached the shims: a pause, a page, an open circuit or
a fleet-wide storm held the remediator and never the kubelet.
"""

from __future__ import annotations

import pytest

from llm_vitals.remediator.backstop import REFUSAL_HOLD, Refusals, noted, word_for
from llm_vitals.remediator.gate import GatePolicy, JournalState

W = "Deployment/llm/vllm"
OTHER = "Deployment/llm/other"
NOW = 100_000.0
POLICY = GatePolicy(targets=frozenset({"a"}), global_cooldown=300.0, max_restarts=3, budget_window=3600.0,
                    max_unhealthy=1, storm_cooldown=0.0, backoff_initial=900.0)

CASES = [
    # (id, state, refusals, lost, word, reason, since)
    ("nothing held", JournalState(), Refusals(), False, "act", "", None),
    ("state lost", JournalState(), Refusals(), True, "hold", "state_lost", None),
    ("paused", JournalState(paused_until=NOW + 60, pause_reason="maintenance"), Refusals(), False,
     "hold", "paused", None),
    ("a pause that ended", JournalState(paused_until=NOW - 1), Refusals(), False, "act", "", None),
    ("paged", JournalState(pages={W: NOW - 5000}), Refusals(), False, "hold", "escalated_to_human", NOW - 5000),
    ("another workload paged", JournalState(pages={OTHER: NOW - 5000}), Refusals(), False, "act", "", None),
    ("circuit open", JournalState(open_circuits=frozenset({W}), restart_times={W: (NOW - 4000,)}), Refusals(), False,
     "hold", "circuit_open", NOW - 4000),
    ("budget used within the window", JournalState(restart_times={W: (NOW - 3000, NOW - 2000, NOW - 1000)}),
     Refusals(), False, "hold", "circuit_open", NOW - 1000),
    ("restart of it running", JournalState(in_progress="llm/vllm-abc", in_progress_expires=NOW + 30,
                                           last_restart_started=NOW - 10, restart_times={W: (NOW - 10,)}),
     Refusals(), False, "hold", "restart_in_progress", NOW - 10),
    ("restart of another running: the global cooldown", JournalState(
        in_progress="llm/other-x", in_progress_expires=NOW + 30, last_restart_started=NOW - 10,
        restart_times={OTHER: (NOW - 10,)}), Refusals(), False, "hold", "cooldown", NOW - 10),
    ("its restart done, in the global cooldown", JournalState(last_restart_started=NOW - 100, restart_times={W: (NOW - 100,)}),
     Refusals(), False, "hold", "cooldown", NOW - 100),
    ("a dead replica's claim past its expiry, cooldown over", JournalState(
        in_progress="llm/vllm-abc", in_progress_expires=NOW - 1, last_restart_started=NOW - 400,
        restart_times={W: (NOW - 400,)}), Refusals(), False, "act", "", None),
    ("backoff of a loop", JournalState(last_restart_started=NOW - 400, restart_times={W: (NOW - 400,)},
                                       backoff={W: (1, NOW - 400)}), Refusals(), False, "hold", "backoff", NOW - 400),
    ("backoff passed", JournalState(last_restart_started=NOW - 1000, restart_times={W: (NOW - 1000,)},
                                    backoff={W: (1, NOW - 1000)}), Refusals(), False, "act", "", None),
    ("a storm in the state", JournalState(storm_seen_at=NOW - 60), Refusals(), False, "hold", "fleet_gate", NOW - 60),
    ("a storm long past", JournalState(storm_seen_at=NOW - REFUSAL_HOLD - 1), Refusals(), False, "act", "", None),
    ("the fleet gate refused another workload lately", JournalState(), Refusals(fleet=NOW - 30), False,
     "hold", "fleet_gate", NOW - 30),
    ("the fleet gate's refusal long past", JournalState(), Refusals(fleet=NOW - REFUSAL_HOLD - 1), False, "act", "", None),
    ("a GPU fault refused for it", JournalState(), Refusals(workloads={W: ("gpu_fault", NOW - 30)}), False,
     "hold", "gpu_fault", NOW - 30),
    ("a GPU fault refused for another", JournalState(), Refusals(workloads={OTHER: ("gpu_fault", NOW - 30)}), False,
     "act", "", None),
    ("a refusal dated ahead of the clock holds nothing", JournalState(), Refusals(fleet=NOW + 30), False, "act", "", None),
    # The first reason wins: a paged workload in a paused remediator says paused (a human lifts both).
    ("paused and paged", JournalState(paused_until=NOW + 60, pages={W: NOW - 10}), Refusals(), False,
     "hold", "paused", None),
    ("lost beats everything", JournalState(paused_until=NOW + 60), Refusals(fleet=NOW), True, "hold", "state_lost", None),
]


@pytest.mark.parametrize("state, refusals, lost, word, reason, since", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_gates_word_for_a_workload(state, refusals, lost, word, reason, since):
    said = word_for(W, state, POLICY, NOW, refusals, lost=lost)
    assert (said.workload, said.word, said.reason, said.since) == (W, word, reason, since)
    assert bool(said.detail) == (word == "hold")


def test_the_storm_cooldown_holds_as_long_as_it_is_longer():
    policy = GatePolicy(targets=frozenset(), global_cooldown=0.0, max_restarts=3, budget_window=3600.0,
                        max_unhealthy=1, storm_cooldown=3 * REFUSAL_HOLD)
    state = JournalState(storm_seen_at=NOW - 2 * REFUSAL_HOLD)
    assert word_for(W, state, policy, NOW).reason == "fleet_gate"
    assert word_for(W, state, policy, NOW + REFUSAL_HOLD + 1).word == "act"


@pytest.mark.parametrize("reason, fleet, mine", [
    ("fleet_gate", NOW, None), ("storm_cooldown", NOW, None), ("gpu_fault", None, ("gpu_fault", NOW)),
    ("cooldown", None, None), ("not_stuck", None, None), ("allowed", None, None),
])
def test_only_refusals_that_a_restart_would_not_fix_are_noted(reason, fleet, mine):
    refusals = noted(Refusals(), W, reason, NOW)
    assert refusals.fleet == fleet
    assert refusals.workloads.get(W) == mine


@pytest.mark.parametrize("restart_times, pod, actor", [
    ({W: (NOW - 50,)}, "vllm-abc", "remediator"),  # its own restart since the alert began
    ({W: (NOW - 500,)}, "vllm-abc", "kubelet"),  # its restart was before the alert: not this one
    ({}, "vllm-abc", "kubelet"),
    ({}, None, "other"),
    ({OTHER: (NOW - 50,)}, None, "other"),
])
def test_a_restart_no_remediator_action_explains_is_the_kubelets_in_a_pod(restart_times, pod, actor):
    from llm_vitals.remediator.backstop import restart_actor
    from llm_vitals.remediator.gate import TargetStatus

    status = TargetStatus(state="starting", pod=pod, workload=W)
    assert restart_actor(status, JournalState(restart_times=restart_times), W, NOW - 100) == actor
