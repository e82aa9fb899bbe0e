"""The shared state's pure transitions and its JSON form (what the replicas keep in the Lease)."""

from __future__ import annotations

import pytest

from llm_vitals.remediator import shared
from llm_vitals.remediator.gate import AlertFacts, Effects, JournalState
from llm_vitals.remediator.shared import Intent

T0 = 1_800_000_000.0
ALERT = AlertFacts("firing", {"target": "llm/p1", "remediation": "restart"}, "fp", T0 - 60)
INTENT = Intent("replica-a/abc", "llm/p1", T0 + 35)


def test_an_intent_holds_the_restart_the_cooldown_the_budget_and_the_alert_key():
    state = shared.with_effects(JournalState(), Effects(intent=True), ALERT, T0, INTENT)
    assert (state.in_progress, state.in_progress_expires, state.in_progress_by) == ("llm/p1", T0 + 35, "replica-a/abc")
    assert state.last_restart_started == T0 and state.restart_times == {"llm/p1": (T0,)}
    assert ALERT.key in state.decided_keys


def test_only_the_holder_releases_its_restart():
    state = shared.with_effects(JournalState(), Effects(intent=True), ALERT, T0, INTENT)
    assert shared.finished(state, "replica-b/zzz") == state
    released = shared.finished(state, "replica-a/abc")
    assert released.in_progress is None and released.last_restart_started == T0  # the cooldown stays


def test_storm_circuit_and_gpu_node_effects():
    state = shared.with_effects(JournalState(), Effects(open_circuit=True, storm_seen_at=T0, gpu_node="n1"), ALERT,
                                T0, None)
    assert state.open_circuits == {"llm/p1"} and state.storm_seen_at == T0 and state.gpu_nodes == {"n1"}
    assert shared.circuits_reset(state, ["llm/p1"]).open_circuits == frozenset()


def test_pruning_forgets_old_restarts_and_keys_and_caps_the_keys():
    state = JournalState(
        restart_times={"a": (T0 - 7200, T0 - 10), "b": (T0 - 7200,)},
        decided_at={("old", 1.0): T0 - 2 * 86400} | {(f"k{i}", 1.0): T0 - i for i in range(300)},
    )
    kept = shared.pruned(state, T0, 3600)
    assert kept.restart_times == {"a": (T0 - 10,)}
    assert len(kept.decided_keys) == shared.MAX_KEYS and ("k0", 1.0) in kept.decided_keys
    assert ("old", 1.0) not in kept.decided_keys


def test_json_round_trip_keeps_everything():
    state = shared.with_effects(JournalState(), Effects(intent=True, open_circuit=True, storm_seen_at=T0,
                                                        gpu_node="n1"), ALERT, T0, INTENT)
    state = shared.paused_state(state, T0 + 600, "upgrade")
    assert shared.from_json(shared.to_json(state)) == state
    assert shared.from_json(None) == JournalState() == shared.from_json("")


@pytest.mark.parametrize("text", ["{", "[]", '{"restart_times": 3}', '{"decided": [[1]]}', '{"paused_until": "x"}'])
def test_a_state_that_is_not_ours_is_an_error_not_a_crash(text):
    with pytest.raises(shared.BadState):
        shared.from_json(text)
