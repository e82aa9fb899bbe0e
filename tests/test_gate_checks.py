"""The gate's one table of checks (llm_vitals/remediator/checks.py), walked both ways.

`gate.decide` walks `CHECKS` for an alert and the backstop's word (gate_word.py) walks it for a
workload. Before the table, the word kept the refusal order by hand, and drifted (a circuit open in
the cooldown: the gate said `cooldown`, the word `circuit_open`). Here every combination of the holds
the state can carry is decided both ways, and the word's code is read to show that it names no reason
of the table itself.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import replace
from itertools import product

import pytest
from test_remediator_loop import OLD, POLICY, T0, alert

from llm_vitals.remediator import gate, gate_word
from llm_vitals.remediator.checks import STORM_HOLD
from llm_vitals.remediator.gate import CHECKS
from llm_vitals.remediator.model import FleetView, GateState, TargetStatus
from llm_vitals.remediator.reasons import HOLDING, REASONS
from llm_vitals.remediator.state import claim_lapsed

STUCK = TargetStatus("stuck", process_start_time=OLD)
IDLE = TargetStatus("idle", process_start_time=OLD)
QUIET = FleetView({"a": STUCK, "b": IDLE, "c": IDLE, "d": IDLE, "e": IDLE})
# A storm cooldown at least STORM_HOLD: a storm the state saw holds the word as the gate holds (storm_cooldown).
STORMY = replace(POLICY, storm_cooldown=STORM_HOLD)

# Each hold the shared state can carry for workload `a` (a static target, its own workload), as a change to it.
HOLDS = {
    "paused": dict(paused_until=T0 + 60, pause_reason="upgrade"),
    "paged": dict(pages={"a": T0 - 60}),
    "its restart running": dict(in_progress="a", in_progress_expires=T0 + 30, last_restart_started=T0 - 5,
                                restart_times={"a": (T0 - 5,)}),
    "cooldown": dict(last_restart_started=T0 - 60),
    "circuit open": dict(open_circuits=frozenset({"a"})),
    "budget used": dict(restart_times={"a": (T0 - 3000, T0 - 2000, T0 - 1000)}),
    "backoff": dict(backoff={"a": (2, T0 - 1000)}),
    "storm": dict(storm_seen_at=T0 - 30),
}


def state_of(names: tuple[str, ...]) -> GateState:
    """A state carrying the named holds at once (restart times merged; a running restart is also the last)."""
    fields: dict = {}
    for name in names:
        for key, value in HOLDS[name].items():
            if key == "restart_times":
                times = sorted({*fields.get(key, {}).get("a", ()), *value["a"]})
                fields[key] = {"a": tuple(times)}
            elif key == "last_restart_started":
                fields[key] = max(value, fields.get(key, value))
            else:
                fields[key] = value
    return GateState(**fields)


COMBINATIONS = [tuple(n for n, on in zip(HOLDS, mask, strict=True) if on) for mask in product((0, 1), repeat=len(HOLDS))]


@pytest.mark.parametrize("names", COMBINATIONS, ids=["+".join(c) or "nothing" for c in COMBINATIONS])
def test_the_word_holds_for_the_reason_the_gate_refuses_and_acts_where_it_allows(names):
    state = state_of(names)
    decision = gate.decide(alert("a"), QUIET, state, STORMY, T0)
    word = gate_word.word_for("a", state, STORMY, T0)
    if decision.allowed:
        assert (word.word, word.reason) == ("act", "")
    else:
        assert decision.reason in {c.reason for c in CHECKS}
        assert (word.word, word.reason) == ("hold", decision.reason)


def test_every_hold_of_the_table_that_needs_no_reading_is_reached_both_ways():
    """Each status-free hold alone: the gate refuses with it, the word holds with it, and both meet the
    table's reasons in the table's order."""
    reached = []
    for name in HOLDS:
        state = state_of((name,))
        decision = gate.decide(alert("a"), QUIET, state, STORMY, T0)
        assert not decision.allowed, name
        assert gate_word.word_for("a", state, STORMY, T0).reason == decision.reason, name
        reached.append(decision.reason)
    order = [c.reason for c in CHECKS]
    assert {"paused", "escalated_to_human", "restart_in_progress", "cooldown", "circuit_open", "backoff",
            "storm_cooldown"} <= set(reached)
    assert sorted(set(reached), key=order.index) == list(dict.fromkeys(r for r in order if r in reached))


def test_another_workloads_restart_holds_the_word_as_the_cooldown():
    """The one place the word's reason differs from the gate's, by design: the gate refuses every
    target while any restart runs; the word holds a workload for its own restart only (a shim told
    restart_in_progress waits for its new process), and another's restart is the cooldown's to hold."""
    state = GateState(in_progress="b", in_progress_expires=T0 + 30, last_restart_started=T0 - 5,
                         restart_times={"b": (T0 - 5,)})
    assert gate.decide(alert("a"), QUIET, state, STORMY, T0).reason == "restart_in_progress"
    assert gate_word.word_for("a", state, STORMY, T0).reason == "cooldown"


def test_the_word_keeps_no_order_of_its_own():
    """word_for names only the reasons that are not the table's (state_lost, unknown_workload): every
    other reason comes from CHECKS or from a held entry, so the word cannot keep a parallel order."""
    tree = ast.parse(inspect.getsource(gate_word.word_for))
    named = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in REASONS}
    assert named == {"state_lost"}
    assert "unknown_workload" in inspect.getsource(gate_word.word_for)
    table = list(dict.fromkeys(c.reason for c in CHECKS))
    assert list(gate_word.HOLD_REASONS[1:1 + len(table)]) == table
    assert set(gate_word.HOLD_REASONS) >= HOLDING


DEGRADED_ALERT = replace(alert("a"), labels={**alert("a").labels, "alertname": gate.DEGRADED_ALERT})
PAUSED_STATE = state_of(("paused",))


@pytest.mark.parametrize(("facts", "fleet", "unpaused"), [
    (alert("a"), None, "exporter_unreachable"),
    (alert("a"), FleetView({"a": IDLE}), "not_stuck"),  # the re-check (step 4)
    (DEGRADED_ALERT, FleetView({"a": replace(IDLE, degraded=True)}), "not_stuck"),  # degraded, no evidence (UNMOVED)
    (alert("a"), FleetView({"a": replace(STUCK, gpu_fault=True)}), "gpu_fault"),  # the first of checks.HOLDS
], ids=["no exporter", "not stuck", "degraded alone", "gpu fault"])
def test_the_pause_is_step_3_and_outranks_every_later_refusal(facts, fleet, unpaused):
    """The pause is the gate's step 3 (`precheck`), not a check of the table walked after the re-check:
    it refuses before the exporter's absence, the re-check, a degraded replica and the whole table."""
    assert gate.decide(facts, fleet, GateState(), STORMY, T0).reason == unpaused
    assert gate.decide(facts, fleet, PAUSED_STATE, STORMY, T0).reason == "paused"
    assert gate.CHECKS[0] is gate.PAUSED and gate.PAUSED not in gate.HOLDS


RUNNING = alert("a")
# The claim of RUNNING's restart, running until T0 + 30: its key decided with it.
CLAIMED = GateState(decided_keys=frozenset({RUNNING.key}), in_progress="a", in_progress_by="replica-0/abc",
                    in_progress_expires=T0 + 30, in_progress_key=RUNNING.key, last_restart_started=T0 - 5)


@pytest.mark.parametrize(("facts", "state", "look", "at", "decided"), [
    (RUNNING, CLAIMED, None, T0, "duplicate"),  # its claim holds: the transaction calls it a duplicate
    (RUNNING, CLAIMED, None, T0 + 31, "cooldown"),  # its claim lapsed: judged afresh (state.claim_lapsed)
    (alert("a", "fp-other"), replace(CLAIMED, decided_keys=CLAIMED.decided_keys | {alert("a", "fp-other").key}),
     "duplicate", T0, "duplicate"),  # a key no claim holds is a duplicate at the look, before any I/O
    (replace(RUNNING, status="resolved"), CLAIMED, "not_firing", T0, "not_firing"),
], ids=["claim holds", "claim lapsed", "decided, no claim", "resolved"])
def test_the_look_before_io_leaves_the_claimed_alert_to_the_transaction(facts, state, look, at, decided):
    """The loop's look (`gate.precheck` without a time, on the state as last seen) refuses what no time
    can change; the one alert whose restart holds the claim goes on to the transaction, which alone can
    tell, at the store's time, whether the claim lapsed (its alert judged afresh) or holds (a duplicate)."""
    looked = gate.precheck(facts, state, POLICY)
    assert (looked.reason if looked is not None else None) == look
    ruled, _ = gate.ruling(facts, QUIET, claim_lapsed(state, at), POLICY, at)
    assert ruled.reason == decided


@pytest.mark.parametrize(("facts", "state", "look", "at", "decided"), [
    (RUNNING, CLAIMED, None, T0, "duplicate"),
    (RUNNING, CLAIMED, None, T0 + 31, "cooldown"),
    (replace(RUNNING, status="resolved"), CLAIMED, "not_firing", T0, "not_firing"),
], ids=["claim holds", "claim lapsed", "resolved"])
def test_the_gate_on_one_alert_looks_then_rules_on_each_state_sent(facts, state, look, at, decided):
    """`gate.on_alert`, the gate on one alert in one frame (the loop starts it, the transaction resumes
    it): its look is `precheck` without a time, and each (fleet, state, now) sent is ruled on as
    `ruling` rules, again and again (a conflict's second read, the pod confirmed)."""
    on_alert = gate.on_alert(facts, POLICY, state)
    looked = next(on_alert)
    assert (looked[0].reason if looked is not None else None) == look
    assert looked is None or not looked[1]  # the look changes nothing
    for sent in (claim_lapsed(state, at), GateState(), claim_lapsed(state, at)):
        assert on_alert.send((QUIET, sent, at)) == gate.ruling(facts, QUIET, sent, POLICY, at)
    assert on_alert.send((QUIET, claim_lapsed(state, at), at))[0].reason == decided
