"""The fleet soak (bench/soak.py), short: two simulated days of 20 workloads through the remediator's
real gate, stores and journals, seeded, on a virtual clock (a second or two of CPU per run).

Two kinds of test:
- the soak itself, once per store (two replicas on a Lease; one replica on its SQLite file): every
  invariant reports 0 violations;
- one test per invariant: its rule switched off (the gate's, the store's or the identity check's
  function monkeypatched), a short soak shows that invariant's count above 0. An invariant that could
  not see its violation would be no guard.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import REPO, load_script

from llm_vitals.remediator import gate, model
from llm_vitals.remediator.gate import Decision
from llm_vitals.remediator.model import GateState
from llm_vitals.remediator.store import StateUnavailable, lease, sqlite
from llm_vitals.remediator.store.lease import LeaseStore, Snapshot

# One worker runs the module (under `pytest -n 2`, a module fixture is made once per worker).
pytestmark = pytest.mark.xdist_group("soak")

soak_module = load_script(REPO / "bench" / "soak.py")
# The soak's own helper modules (it imports them from bench/), so that their classes are the ones it uses.
invariants = soak_module.soak_invariants
fleet_sim = soak_module.fleet_sim

# Seed 1 meets every kind of incident, a rollout between the exporter's poll and the identity check included,
# the kubelet's liveness restarts and a human's pause.
SHORT = fleet_sim.FleetConfig(days=2.0, workloads=20, seed=1)


@pytest.fixture(scope="module")
def reports():
    return {store: soak_module.run(soak_module.SoakConfig(SHORT, store)) for store in ("lease", "sqlite")}


@pytest.mark.parametrize("store, name", [
    pytest.param(store, name, id=f"{store}-{name}") for store in ("lease", "sqlite") for name in invariants.INVARIANTS
])
def test_two_simulated_days_break_no_invariant(reports, store, name):
    report = reports[store]
    assert report.violations[name] == 0, soak_module.format_report(report)


def test_the_short_soak_meets_every_incident_and_is_deterministic(reports):
    figures = reports["lease"].figures
    for kind in fleet_sim.INCIDENT_KINDS:
        assert figures.get(f"incident {kind}", 0) >= 1, kind
    assert figures["decision duplicate"] > 0  # Alertmanager's HA copies reached the replicas
    assert figures["rollouts_mid_incident"] > 0
    assert figures["lease_conflicts"] > 0  # a replica's stale write was refused, and it decided again
    assert figures["action restart"] > 0 and figures["action cordon_and_move"] > 0
    # Issue 39: the kubelet acts beside the remediator, a human pauses and lifts the pause, and the
    # remediator's own look decides held targets again between Alertmanager's re-sends.
    assert figures["action kubelet_restart"] > 0
    assert figures["human pause"] > 0 and figures["human unpause"] > 0
    assert figures["redecided allowed"] > 0
    # A pod replaced after the exporter's poll was refused by the identity check, on one store or the other.
    assert sum(r.figures.get("decision identity_mismatch", 0) for r in reports.values()) > 0
    again = soak_module.run(soak_module.SoakConfig(SHORT, "lease"))
    assert again.violations == reports["lease"].violations
    assert {k: v for k, v in again.figures.items() if not k.endswith(("seconds", "mib"))} == {
        k: v for k, v in reports["lease"].figures.items() if not k.endswith(("seconds", "mib"))}


# -- each invariant catches its violation when the rule it guards is off -------------------------


def decide_with(monkeypatch, change):
    """Monkeypatch the gate: `change(decision, alert, fleet, state)` may replace each decision; a
    replacement `allow(...)` makes is carried out as the gate's own would be. The gate's decisions all
    come from `decide_with_subject` (`decide` and `ruling` ask it), else, in an older gate, `decide`."""
    name = "decide_with_subject" if hasattr(gate, "decide_with_subject") else "decide"
    real = getattr(gate, name)

    def replaced_by(decision, alert, fleet, journal, policy):
        replaced = change(decision, alert, fleet, journal)
        if isinstance(replaced, Allow):
            return replaced.decision(alert, fleet, policy)
        return replaced or decision

    def decide(alert, fleet, journal, policy, now, *args, **kwargs):
        answer = real(alert, fleet, journal, policy, now, *args, **kwargs)
        if name == "decide":
            return replaced_by(answer, alert, fleet, journal, policy)
        decision, subject = answer  # the subject's counts stay true whatever the decision becomes
        return replaced_by(decision, alert, fleet, journal, policy), subject

    monkeypatch.setattr(gate, name, decide)


class Allow:
    """A switched-off rule's refusal turned into the action: a restart, or a cordon-and-move."""

    def __init__(self, moving: bool = False):
        self.moving = moving

    def decision(self, alert, fleet, policy) -> Decision:
        reason = "cordon_and_move" if self.moving else "allowed"
        plan_of = getattr(gate, "plan_of", None)
        if plan_of is None:  # a gate whose decisions carry no plan (before "one plan carried out once")
            return Decision(True, reason, "switched off")
        status = fleet.targets[alert.target]
        plan = plan_of(alert.target, model.workload_of(alert.target, status), status, policy, self.moving)
        return Decision(True, reason, "switched off", plan)


def soak_count(name: str, fleet=SHORT, store: str = "lease") -> int:
    report = soak_module.run(soak_module.SoakConfig(fleet, store))
    return report.violations[name]


def rates(**over: float) -> tuple[tuple[str, float], ...]:
    return tuple((kind, over.get(kind, rate)) for kind, rate in fleet_sim.FleetConfig().rates)


def test_a_page_that_does_not_hold_is_caught(monkeypatch):
    paged: set[str] = set()

    def change(decision, alert, fleet, state):
        if decision.reason != "escalated_to_human":
            return None
        workload = fleet.targets[alert.target].workload
        if workload in paged:  # the page is off: the workload's next alert restarts it
            return Allow()
        paged.add(workload)
        return None

    decide_with(monkeypatch, change)
    assert soak_count("no_restart_while_paged") > 0


def test_a_cordon_without_node_evidence_is_caught(monkeypatch):
    decide_with(monkeypatch, lambda d, *_: Allow(moving=True) if d.reason == "allowed" else None)
    assert soak_count("no_cordon_without_node_evidence") > 0


def test_cordons_past_the_limit_are_caught(monkeypatch):
    # Many GPU faults at once; a refusal for the limit (the merge's `cordon_limit`) is turned into a move.
    decide_with(monkeypatch, lambda d, *_: Allow(moving=True) if d.reason == "cordon_limit" else None)
    assert soak_count("cordons_within_limit", replace(SHORT, rates=rates(gpu_fault=0.3))) > 0


def test_restarts_past_the_budget_or_the_backoff_are_caught(monkeypatch):
    holds = {"circuit_open", "cooldown", "escalated_to_human", "backoff", "restart_in_progress", "storm_cooldown"}
    decide_with(monkeypatch, lambda d, *_: Allow() if d.reason in holds else None)
    assert soak_count("restarts_within_budget_and_backoff", replace(SHORT, days=1.0, rates=rates(recurring_hang=0.05))) > 0


def test_a_hang_nobody_handles_is_caught(monkeypatch):
    decide_with(monkeypatch, lambda d, *_: Decision(False, "not_stuck", "switched off"))
    assert soak_count("hangs_handled_within_bound") > 0


def test_a_state_that_forgets_is_caught(monkeypatch):
    for store in (lease, sqlite):  # each store prunes the state it commits
        monkeypatch.setattr(store, "pruned", lambda state, *args, **kwargs: GateState())
    assert soak_count("nothing_forgotten") > 0
    assert soak_count("nothing_forgotten", store="sqlite") > 0


def test_an_action_on_a_pod_the_api_server_does_not_hold_is_caught(monkeypatch):
    # The identity check switched off: the pod the exporter's last poll named is taken as it is.
    async def check(self, status):
        return soak_module.identity.Checked(status)

    monkeypatch.setattr(soak_module.SimIdentities, "check", check)
    assert soak_count("no_action_on_a_mismatched_pod", replace(SHORT, rollout_mid_incident=1.0)) > 0


def test_a_hang_held_back_by_a_long_backoff_is_told_and_untold_without_the_refusals_kept(monkeypatch):
    """A backoff can outlast the bound on a hang (here 6h from a workload's second restart of a streak,
    its hangs every half day): LLMVitalsRemediatorBackoffHolding tells a human from the refusals the
    state keeps. Switched off (the refusals not kept), the same hangs go untold past the bound."""
    fleet = replace(SHORT, rates=rates(hang=1.0))
    settings = {"budget": {"max_restarts": 3, "window": "1h", "backoff": {"initial": "6h", "max": "6h"}}}
    told = soak_module.run(soak_module.SoakConfig(fleet, "lease", settings))
    assert told.violations["hangs_handled_within_bound"] == 0, soak_module.format_report(told)
    assert told.figures["decision backoff"] > 0 and told.figures["told backoff"] == told.figures["decision backoff"]
    real = gate.effects_of
    monkeypatch.setattr(gate, "effects_of", lambda *a, **k: replace(real(*a, **k), backoff_refused=False))
    untold = soak_module.run(soak_module.SoakConfig(fleet, "lease", settings))
    assert untold.violations["hangs_handled_within_bound"] > 0


def test_a_lost_state_that_does_not_refuse_is_caught(monkeypatch):
    real = LeaseStore.read

    async def read(self):
        try:
            return await real(self)
        except StateUnavailable:  # the merge's `state_lost`: switched off, a lost Lease reads as a fresh one
            return GateState(), Snapshot(None)

    monkeypatch.setattr(LeaseStore, "read", read)
    # ... or, where the gate refuses a lost state itself, that refusal is turned into a restart.
    decide_with(monkeypatch, lambda d, *_: Allow() if d.reason == "state_lost" else None)
    assert soak_count("lost_state_refuses", replace(SHORT, rates=rates(hang=0.5, lost_lease=2.0))) > 0


# -- the invariants on their own: pure functions over a hand-made history ------------------------


def history() -> invariants.History:
    return invariants.History(window=3600.0, max_restarts=3)


def act(h, at: float, kind: str = "restart", workload: str = "Deployment/llm/a", node: str = "n1", cordoned: int = 0):
    h.record_action(invariants.Action(h.next_seq(), at, kind, workload, "a-1", node, "r", True, cordoned))


def human(h, at: float, kind: str, workload: str = "") -> None:
    h.record_human(invariants.HumanAct(h.next_seq(), at, kind, workload))


def check(h, state=None, now: float = 0.0, episodes=()):
    c = invariants.Check(h, invariants.Marks(), now, state, list(episodes))
    return {name: list(fn(c)) for name, fn in invariants.INVARIANTS.items()}


def test_a_restart_after_the_page_and_before_its_release_is_a_violation_and_after_it_none():
    h = history()
    h.record_decision(invariants.Seen(h.next_seq(), 10.0, "a-1", "Deployment/llm/a", "escalated_to_human", "r"))
    act(h, 20.0)
    human(h, 30.0, "release_page", "Deployment/llm/a")
    act(h, 4000.0)
    assert check(h)["no_restart_while_paged"] == [2]


def test_budget_and_backoff_count_per_workload_since_a_human_reset():
    h = history()
    act(h, 0.0)
    act(h, invariants.BACKOFF_BASE - 1)  # too soon after the first
    act(h, 3 * invariants.BACKOFF_BASE)
    act(h, 3500.0)  # the fourth within the hour
    act(h, 3500.0, workload="Deployment/llm/b")  # another workload's own budget
    assert check(h)["restarts_within_budget_and_backoff"] == [("backoff", 2), ("budget", 4)]
    human(h, 3550.0, "reset_circuit", "Deployment/llm/a")
    act(h, 3600.0)
    assert ("budget", 7) not in check(h)["restarts_within_budget_and_backoff"]


def test_a_cordon_needs_the_nodes_flag_and_room_under_the_limit():
    h = history()
    h.record_evidence("n1", True, 0.0)
    act(h, 10.0, "cordon_and_move", node="n1", cordoned=1)
    act(h, 20.0, "cordon_and_move", node="n2", cordoned=invariants.MAX_CORDONED_NODES + 1)
    result = check(h)
    assert result["no_cordon_without_node_evidence"] == [3]
    assert result["cordons_within_limit"] == [3]


def test_what_a_human_must_release_is_forgotten_when_the_state_drops_it():
    h = history()
    act(h, 10.0, "cordon_and_move", node="n1", cordoned=1)
    h.record_field("x_newer")
    kept = invariants.StoredState(frozenset(), frozenset(), frozenset({"n1"}), frozenset({"x_newer"}),
                                  {"Deployment/llm/a": (10.0,)})
    assert check(h, kept)["nothing_forgotten"] == []
    dropped = invariants.StoredState(frozenset(), frozenset(), frozenset(), frozenset())
    assert sorted(check(h, dropped)["nothing_forgotten"]) == [
        ("budget", "Deployment/llm/a", 1), ("field", "x_newer", 2), ("node", "n1", 1)]
    assert check(h, None)["nothing_forgotten"] == []  # unreadable: judged when it can be read


def test_a_hang_past_its_bound_with_nothing_done_is_a_violation():
    bound = invariants.HANG_BOUND
    h = history()
    h.record_decision(invariants.Seen(h.next_seq(), 500.0, "b-1", "Deployment/llm/b", "circuit_open", "r"))
    episodes = [fleet_sim.Episode(0, "a-1", "Deployment/llm/a", "u", "n1", "hang", 0.0),
                fleet_sim.Episode(1, "b-1", "Deployment/llm/b", "u", "n1", "hang", 0.0),  # told to a human
                fleet_sim.Episode(2, "c-1", "Deployment/llm/c", "u", "n1", "hang", 0.0, end=100.0)]  # ended
    assert check(h, now=bound - 1, episodes=episodes)["hangs_handled_within_bound"] == []
    assert check(h, now=bound, episodes=episodes)["hangs_handled_within_bound"] == [0]


def test_an_action_between_a_loss_and_the_humans_reinitialisation_is_a_violation():
    h = history()
    h.record_loss(0.0)
    act(h, 10.0)
    human(h, 20.0, "reinitialise")
    act(h, 30.0)
    assert check(h)["lost_state_refuses"] == [2]


def test_an_action_on_a_pod_the_api_server_did_not_hold_is_a_violation():
    h = history()
    act(h, 10.0)
    h.record_action(invariants.Action(h.next_seq(), 20.0, "restart", "Deployment/llm/a", "a-1", "n1", "r", False,
                                      pod_matched=False))
    assert check(h)["no_action_on_a_mismatched_pod"] == [2]


def test_a_reinitialisation_from_empty_ends_the_pages_and_forgives_the_budgets():
    h = history()
    h.record_decision(invariants.Seen(h.next_seq(), 10.0, "a-1", "Deployment/llm/a", "escalated_to_human", "r"))
    for at in (100.0, 200.0, 300.0):
        act(h, at)
    human(h, 400.0, "reinitialise")
    act(h, 500.0)  # after the human's re-initialisation: no page holds, the budget starts again
    result = check(h)
    assert result["no_restart_while_paged"] == [2, 3, 4]  # those before it were under the page
    assert [key for key in result["restarts_within_budget_and_backoff"] if key[1] == 6] == []


def test_a_hang_told_by_the_remediators_own_alert_is_handled():
    h = history()
    h.record_told("a-1", 600.0)  # a backoff refusal LLMVitalsRemediatorBackoffHolding fired for
    episode = fleet_sim.Episode(0, "a-1", "Deployment/llm/a", "u", "n1", "hang", 0.0)
    assert check(h, now=invariants.HANG_BOUND, episodes=[episode])["hangs_handled_within_bound"] == []


def test_a_page_is_held_where_the_ladders_last_step_is_page():
    assert soak_module.held_pages(GateState(ladder={"w": ("page", 1.0), "v": ("restart", 1.0)})) == {"w"}


def test_the_budget_spent_within_the_window_is_forgotten_when_the_state_drops_a_restart():
    h = history()
    act(h, 100.0)
    act(h, 1000.0)
    both = invariants.StoredState(frozenset(), frozenset(), frozenset(), frozenset(),
                                  {"Deployment/llm/a": (100.0, 1000.0)})
    one = replace(both, restart_times={"Deployment/llm/a": (1000.0,)})
    assert check(h, both, now=1200.0)["nothing_forgotten"] == []
    assert check(h, one, now=1200.0)["nothing_forgotten"] == [("budget", "Deployment/llm/a", 2)]
    assert check(h, one, now=3700.0)["nothing_forgotten"] == []  # the first is out of the window by now
    human(h, 1100.0, "reset_circuit", "Deployment/llm/a")
    assert check(h, replace(both, restart_times={}), now=1200.0)["nothing_forgotten"] == []  # a human forgave it


# -- issue 39: the hang bound counts the hung pod itself, and only untold time -----------------------


def test_an_action_on_another_pod_of_the_workload_does_not_handle_a_hang():
    h = history()
    h.record_action(invariants.Action(h.next_seq(), 600.0, "restart", "Deployment/llm/a", "a-2", "n1", "r", True))
    episode = fleet_sim.Episode(0, "a-1", "Deployment/llm/a", "u", "n1", "hang", 0.0)
    assert check(h, now=invariants.HANG_BOUND + 1, episodes=[episode])["hangs_handled_within_bound"] == [0]
    act(h, 700.0)  # the hung pod itself ("a-1")
    assert check(h, now=invariants.HANG_BOUND + 1, episodes=[episode])["hangs_handled_within_bound"] == []


def test_one_early_refusal_then_untold_answers_does_not_handle_a_hang():
    """Before, a single refusal a human sees at any time within the bound counted as handled."""
    h = history()
    h.record_decision(invariants.Seen(h.next_seq(), 300.0, "a-1", "Deployment/llm/a", "circuit_open", "r"))
    h.record_decision(invariants.Seen(h.next_seq(), 400.0, "a-1", "Deployment/llm/a", "cooldown", "r"))
    episode = fleet_sim.Episode(0, "a-1", "Deployment/llm/a", "u", "n1", "hang", 0.0)
    # 100 s told, the rest untold: past the bound by the 100 s the hold stopped the clock.
    assert check(h, now=invariants.HANG_BOUND + 99, episodes=[episode])["hangs_handled_within_bound"] == []
    assert check(h, now=invariants.HANG_BOUND + 101, episodes=[episode])["hangs_handled_within_bound"] == [0]


def test_a_hang_held_for_a_human_stops_the_clock_while_the_hold_is_told():
    h = history()
    h.record_decision(invariants.Seen(h.next_seq(), 60.0, "a-1", "Deployment/llm/a", "escalated_to_human", "r"))
    episode = fleet_sim.Episode(0, "a-1", "Deployment/llm/a", "u", "n1", "hang", 0.0)
    assert check(h, now=10 * invariants.HANG_BOUND, episodes=[episode])["hangs_handled_within_bound"] == []
    assert invariants.hang_outcome(episode, h, 10 * invariants.HANG_BOUND) is None  # still the human's


def test_the_kubelets_restart_of_the_hung_pod_handles_its_hang():
    h = history()
    h.record_action(invariants.Action(h.next_seq(), 900.0, "kubelet_restart", "Deployment/llm/a", "a-1", "n1",
                                      "kubelet", True))
    episode = fleet_sim.Episode(0, "a-1", "Deployment/llm/a", "u", "n1", "hang", 0.0)
    assert invariants.hang_outcome(episode, h, invariants.HANG_BOUND + 1) == "handled"


def test_alertmanager_resends_at_the_first_flush_after_repeat_interval():
    assert fleet_sim.resend_after(900.0, 60.0) == 960.0  # 15m is 16m in practice
    assert fleet_sim.resend_after(900.0, 300.0) == 1200.0
    assert fleet_sim.resend_after(3600.0, 1.0) == 3601.0


def test_a_cordon_after_another_workloads_node_hang_there_has_node_evidence():
    h = history()
    h.record_action(invariants.Action(h.next_seq(), 100.0, "restart", "Deployment/llm/b", "b-1", "n1", "r", True,
                                      node_at_fault=True))
    act(h, 200.0, "cordon_and_move", node="n1", cordoned=1)  # workload a's own hang, but n1 keeps hanging pods
    act(h, 300.0, "cordon_and_move", node="n2", cordoned=2)  # nothing about n2
    act(h, 100.0 + invariants.ESCALATE_WITHIN + 1, "cordon_and_move", node="n1", cordoned=2)  # too long after
    assert check(h)["no_cordon_without_node_evidence"] == [3, 4]
