"""The shared state's pure transitions and its JSON form (what the replicas keep in the Lease)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import REPO

from llm_vitals.remediator.gate import Effects
from llm_vitals.remediator.model import AlertFacts, GateState, Intent
from llm_vitals.remediator.state import (
    MAX_KEYS,
    circuits_reset,
    disruption_refused,
    finished,
    node_cordoned,
    node_released,
    paused_state,
    pruned,
    undo_of,
    undone,
    with_effects,
    workload_released,
)
from llm_vitals.remediator.state_codec import BadState, dump, from_json, load, to_json

T0 = 1_800_000_000.0
ALERT = AlertFacts("firing", {"target": "llm/p1", "remediation": "restart"}, "fp", T0 - 60)
INTENT = Intent("replica-a/abc", "llm/p1", T0 + 35)
WORKLOAD = "Deployment/llm/vllm"


def test_an_intent_holds_the_restart_the_cooldown_the_budget_and_the_alert_key():
    state = with_effects(GateState(), Effects(intent=True), ALERT, T0, INTENT)
    assert (state.in_progress, state.in_progress_expires, state.in_progress_by) == ("llm/p1", T0 + 35, "replica-a/abc")
    assert state.last_restart_started == T0 and state.restart_times == {"llm/p1": (T0,)}
    assert ALERT.key in state.decided_keys


def test_only_the_holder_releases_its_restart():
    state = with_effects(GateState(), Effects(intent=True), ALERT, T0, INTENT)
    assert finished(state, "replica-b/zzz") == state
    released = finished(state, "replica-a/abc")
    assert released.in_progress is None and released.last_restart_started == T0  # the cooldown stays


def test_storm_and_circuit_effects_and_the_node_marked_after_its_cordon():
    state = with_effects(GateState(), Effects(open_circuit=True, storm_seen_at=T0), ALERT, T0, None)
    assert state.open_circuits == {"llm/p1"} and state.storm_seen_at == T0 and state.cordoned_nodes == frozenset()
    assert circuits_reset(state, ["llm/p1"]).open_circuits == frozenset()
    marked = node_cordoned(state, "n1")
    assert marked.cordoned_nodes == {"n1"} and node_released(marked, "n1").cordoned_nodes == frozenset()
    assert node_released(state, "n9") == state  # releasing a node never escalated changes nothing


def test_pruning_forgets_old_restarts_and_keys_and_caps_the_keys():
    state = GateState(
        restart_times={"a": (T0 - 7200, T0 - 10), "b": (T0 - 7200,)},
        decided_at={("old", 1.0): T0 - 2 * 86400} | {(f"k{i}", 1.0): T0 - i for i in range(300)},
    )
    kept = pruned(state, T0, 3600)
    assert kept.restart_times == {"a": (T0 - 10,)}
    assert len(kept.decided_keys) == MAX_KEYS and ("k0", 1.0) in kept.decided_keys
    assert ("old", 1.0) not in kept.decided_keys


def test_json_round_trip_keeps_everything():
    state = with_effects(GateState(), Effects(intent=True, open_circuit=True, storm_seen_at=T0,
                                                        workload=WORKLOAD, step="restart"), ALERT, T0, INTENT)
    state = node_cordoned(paused_state(state, T0 + 600, "upgrade"), "n1")
    assert state.ladder == {WORKLOAD: ("restart", T0)} and state.restart_times == {WORKLOAD: (T0,)}
    assert from_json(to_json(state)) == state
    assert from_json(None) == GateState() == from_json("")


def test_pages_ladder_nodes_and_backoff_round_trip_and_a_page_is_never_pruned():
    state = GateState(ladder={WORKLOAD: ("page", T0 - 3 * 86400), "w2": ("restart", T0 - 60)},
                         ladder_nodes={"w2": "n2"}, pages={"w3": T0 - 30 * 86400}, backoff={"w2": (3, T0 - 60)})
    assert from_json(to_json(state)) == state
    kept = pruned(state, T0, 3600)
    assert kept.pages == state.pages and kept.ladder == state.ladder  # a page, old or new, holds until released
    assert pruned(state, T0 + 8 * 86400, 3600).backoff == {}  # a streak is over after a week
    released = workload_released(workload_released(state, WORKLOAD), "w3")
    assert released.pages == {} and WORKLOAD not in released.ladder and released.backoff == state.backoff
    reset = circuits_reset(state, [WORKLOAD, "w2", "w3"])
    assert reset.pages == state.pages and reset.ladder == {WORKLOAD: state.ladder[WORKLOAD]}  # a reset is no release
    assert reset.backoff == {} and reset.ladder_nodes == {}


def test_backoff_refusals_keep_their_first_time_until_a_restart_or_two_quiet_hours():
    refused = Effects(workload=WORKLOAD, backoff_refused=True)
    state = with_effects(GateState(), refused, ALERT, T0, None)
    state = with_effects(state, refused, ALERT, T0 + 900, None)
    assert state.backoff_refused == {WORKLOAD: (T0, T0 + 900)}
    assert from_json(to_json(state)) == state
    assert pruned(state, T0 + 900 + 7199, 3600).backoff_refused == state.backoff_refused
    assert pruned(state, T0 + 900 + 7200, 3600).backoff_refused == {}  # no refusal for 2h: over
    restarted = with_effects(state, Effects(intent=True, workload=WORKLOAD), ALERT, T0 + 1800, INTENT)
    assert restarted.backoff_refused == {}  # acted on: nothing held back now
    assert circuits_reset(state, [WORKLOAD]).backoff_refused == {}


@pytest.mark.parametrize("text", ['{"pages": {"w": "soon"}}', '{"backoff": {"w": [1]}}', '{"ladder_nodes": 3}',
                                  '{"backoff_refused": {"w": [1]}}'])
def test_new_fields_that_are_not_ours_are_an_error_not_a_crash(text):
    with pytest.raises(BadState):
        from_json(text)


@pytest.mark.parametrize("text", ["{", "[]", '{"restart_times": 3}', '{"decided": [[1]]}', '{"paused_until": "x"}'])
def test_a_state_that_is_not_ours_is_an_error_not_a_crash(text):
    with pytest.raises(BadState):
        from_json(text)


def test_a_state_written_before_workloads_and_the_ladder_still_loads():
    """The JSON of the previous version: budgets and circuits keyed by target name, no ladder."""
    old = ('{"decided":[["fp",1799999940.0,1799999950.0]],"gpu_nodes":["n1"],"in_progress":null,'
           '"in_progress_by":null,"in_progress_expires":null,"last_restart_started":1799999950.0,'
           '"open_circuits":["llm/p1"],"pause_reason":"","paused_until":null,'
           '"restart_times":{"llm/p1":[1799999950.0]},"storm_seen_at":null}')
    state = from_json(old)
    assert state.open_circuits == {"llm/p1"} and state.restart_times == {"llm/p1": (T0 - 50,)}
    assert state.ladder == {} and state.cordoned_nodes == {"n1"}
    assert circuits_reset(state, ["llm/p1"]).open_circuits == frozenset()  # its reset names the old key


UNDO_WORKLOAD = "Deployment/llm/vllm"


def intent_on(state: GateState, step: str | None = None, at: float = T0) -> tuple[GateState, Intent]:
    """`state` after an allowed restart of UNDO_WORKLOAD at `at` (with a ladder step), and its intent."""
    intent = Intent("replica-a/x", "llm/p1", at + 30, UNDO_WORKLOAD, at, undo_of(state, UNDO_WORKLOAD))
    used = len(state.restart_times.get(UNDO_WORKLOAD, ()))
    streak = (state.backoff.get(UNDO_WORKLOAD) or (0, 0.0))[0]
    effects = Effects(intent=True, open_circuit=used + 1 >= 3, workload=UNDO_WORKLOAD, step=step,
                      node="n1" if step else None, backoff=(streak + 1, at))
    return with_effects(state, effects, ALERT, at, intent), intent


@pytest.mark.parametrize("before, step", [
    (GateState(), None),
    (GateState(last_restart_started=T0 - 900, restart_times={UNDO_WORKLOAD: (T0 - 900,)}), None),
    (GateState(restart_times={UNDO_WORKLOAD: (T0 - 900, T0 - 800)}, last_restart_started=T0 - 800), None),  # opens
    (GateState(ladder={UNDO_WORKLOAD: ("restart", T0 - 100)}), "cordon_and_move"),
    (GateState(), "restart"),
    (GateState(open_circuits=frozenset({"other"}), storm_seen_at=T0 - 5, cordoned_nodes=frozenset({"n1"})), None),
    (GateState(ladder={UNDO_WORKLOAD: ("restart", T0 - 100)}, ladder_nodes={UNDO_WORKLOAD: "n0"},
                  backoff={UNDO_WORKLOAD: (2, T0 - 100)}), "cordon_and_move"),
], ids=["fresh", "an earlier restart", "the commit opened the circuit", "a ladder step before", "the first step",
        "unrelated state", "a ladder node and a backoff streak before"])
def test_a_restart_the_api_server_refused_is_taken_back_entirely(before, step):
    """An eviction a PodDisruptionBudget refused (429) did nothing: the state is as before the commit,
    so Alertmanager's next re-send is judged afresh (not a duplicate, no cooldown, no budget spent)."""
    committed, intent = intent_on(before, step)
    assert committed != before
    assert undone(committed, intent, ALERT.key) == before


def test_taking_back_keeps_what_happened_since():
    committed, intent = intent_on(GateState())
    later = paused_state(node_cordoned(committed, "n2"), T0 + 60, "upgrade")
    after = undone(later, intent, ALERT.key)
    assert after.cordoned_nodes == {"n2"} and after.paused_until == T0 + 60
    assert after.in_progress is None and after.restart_times == {} and ALERT.key not in after.decided_keys
    # An intent whose claim another replica took over (it expired) leaves that claim alone.
    taken = replace(committed, in_progress_by="replica-b/y")
    assert undone(taken, intent, ALERT.key).in_progress_by == "replica-b/y"


def test_a_streak_of_disruption_budget_refusals_lasts_until_a_restart_runs_or_two_quiet_hours():
    state = disruption_refused(GateState(), UNDO_WORKLOAD, T0)
    state = disruption_refused(state, UNDO_WORKLOAD, T0 + 3600)
    assert state.disrupted == {UNDO_WORKLOAD: (T0, T0 + 3600)}
    assert from_json(to_json(state)) == state
    assert finished(state, "nobody", ran="other").disrupted == state.disrupted
    assert finished(state, "nobody", ran=UNDO_WORKLOAD).disrupted == {}
    assert pruned(state, T0 + 3600 + 7199, 3600).disrupted == state.disrupted
    assert pruned(state, T0 + 3600 + 7200, 3600).disrupted == {}


def test_a_document_written_before_the_renames_reads_as_it_was_and_is_written_back_byte_for_byte():
    """Issue 42 renamed the state's types and modules (`JournalState` is `GateState`, `gpu_nodes`
    is `cordoned_nodes`), never its stored form: a fleet upgrades, and downgrades, in place."""
    text = (REPO / "tests" / "fixtures" / "remediator" / "state-c455e69.json").read_text().strip()
    stored = load(text)
    assert stored.state.cordoned_nodes == {"gpu-7"} and stored.state.in_progress == "llm/vllm-0"
    assert stored.state.held["llm/vllm-1"].reason == "cooldown" and stored.state.seen_restarts["llm/vllm-1"] == -1.0
    assert (stored.epoch, stored.budget_window, dict(stored.carried)) == (
        "0f1e2d3c4b5a69788796a5b4c3d2e1f0", 3600.0, {"from_a_newer_version": {"kept": True}})
    assert dump(stored) == text
