"""One door for writes (issue 42): only `ledger.py` commits the gate's state or writes the journal,
and an alert's decision is made once, pure, before anything acts on it.

Before: gate state was committed from three modules (loop, acting, service: 11 call sites) and the
journal written from three (evidence, acting, service), and the decision's transaction called into
the `Actor` (`executor_for`, `claim`) before acting began.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO
from test_remediator_loop import FLEET, INTENT, POLICY, T0, alert

from llm_vitals.remediator import gate
from llm_vitals.remediator.model import Claim, GateState
from llm_vitals.remediator.state import (
    OwnClaims,
    Pruning,
    alert_decided,
    decided,
    orphan_ended,
    transition,
    with_effects,
)

REMEDIATOR = REPO / "llm_vitals" / "remediator"
# What writes: the ledger's transaction (a function), a store's door and commit and the journal's writes (methods).
WRITES = {"transact", "update", ".transact", ".commit", ".record_decision", ".record_intent", ".record_pause",
          ".record_pre_restart", ".finish", ".refuse_intent", ".record_circuit_reset", ".record_node_release",
          ".record_workload_release", ".record_state_reinit"}


def calls_in(path: Path) -> set[str]:
    """What a module calls: `name` for a function, `.name` for a method."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            found.add(f".{func.attr}" if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return found


def rule(facts):
    """The gate on `facts` as the loop starts it (`gate.on_alert`), past its look: what the transaction resumes."""
    on_alert = gate.on_alert(facts, POLICY, GateState())
    next(on_alert)
    return on_alert.send


def test_only_the_ledger_writes_the_state_or_the_journal():
    writers = {path.relative_to(REMEDIATOR).as_posix(): sorted(calls_in(path) & WRITES)
               for path in REMEDIATOR.rglob("*.py")}
    # The stores implement the commit (store/), the journal its own writes; the ledger alone calls them.
    assert {path: names for path, names in writers.items()
            if names and path not in ("ledger.py", "journal.py") and not path.startswith("store/")} == {}
    assert {"transact", "update", ".transact", ".record_intent", ".finish", ".refuse_intent"} <= set(writers["ledger.py"])


def test_the_decision_is_one_pure_step_with_its_claim():
    """`state.decided`: the gate's decision, the claim it takes and the state its effects make, from
    plain data (no Actor, no store): what the ledger commits, and all it commits for an alert."""
    claim = Claim("replica-0/abc", 15.0)
    decision, intent, state = decided(alert("a"), FLEET, GateState(), rule(alert("a")), T0, claim)
    assert decision.allowed and decision.plan is not None and intent is not None
    # The claim outlives the plan's timeouts by its margin, and remembers what its commit replaced.
    assert (intent.holder, intent.target, intent.expires) == ("replica-0/abc", "a", T0 + decision.plan.claim_for + 15.0)
    effects = gate.effects_of(decision, alert("a"), FLEET, GateState(), POLICY, T0)
    assert state == with_effects(GateState(), effects, alert("a"), T0, intent)
    # A store whose claims never expire (one replica): the claim holds until its restart ends.
    assert decided(alert("a"), FLEET, GateState(), rule(alert("a")), T0, Claim("r/1", None))[1].expires is None  # type: ignore[union-attr]
    # A refusal takes no claim.
    busy = with_effects(GateState(), effects, alert("a"), T0, INTENT)
    refused, none, _ = decided(alert("b"), FLEET, busy, rule(alert("b")), T0 + 1, claim)
    assert (refused.allowed, none) == (False, None)


def test_an_alerts_transaction_is_one_pure_step_over_the_state_and_the_stores_time():
    """`state.alert_decided`, the step the store's door applies (`GateStore.transact`): the decision
    at the store's time, and a pod not checked yet commits nothing of the decision."""
    claim = Claim("replica-0/abc", 15.0)
    committed, state = alert_decided(alert("a"), FLEET, rule(alert("a")), claim, True, None, GateState(), T0)
    assert committed.decision.allowed and committed.now == T0 and committed.intent is not None
    assert state == decided(alert("a"), FLEET, GateState(), rule(alert("a")), T0, claim)[2]
    unchecked, kept = alert_decided(alert("a"), FLEET, rule(alert("a")), claim, False, None, GateState(), T0)
    assert unchecked.needs_identity and unchecked.intent is None and kept == GateState()
    # An unchanged state is nothing to write; a changed one is pruned by the store's rules, at its time.
    assert transition(lambda s, now: ("same", s), GateState(), T0, Pruning(3600.0)) == ("same", None)
    old = GateState(restart_times={"w": (T0 - 7200, T0 - 60)})
    assert transition(lambda s, now: (None, old), GateState(), T0, Pruning(3600.0))[1] == GateState(
        restart_times={"w": (T0 - 60,)})


@pytest.mark.parametrize(("running", "unreleased", "ended"), [
    ({"replica-0/abc"}, {}, False),  # its restart runs: kept
    (set(), {"replica-0/abc": "a"}, True),  # ended, its release not written: released as its end would have
    (set(), {}, True),  # no restart of this process holds it: lapsed, its alert judged afresh
])
def test_a_claim_no_restart_of_this_process_runs_is_ended_on_one_replica(running, unreleased, ended):
    busy = with_effects(GateState(), gate.effects_of(gate.decide(alert("a"), FLEET, GateState(), POLICY, T0),
                                                     alert("a"), FLEET, GateState(), POLICY, T0), alert("a"), T0, INTENT)
    after = orphan_ended(busy, OwnClaims(running, unreleased))
    assert (after.in_progress is None) == ended
    assert (alert("a").key in after.decided_keys) == (not ended or bool(unreleased))
    assert orphan_ended(busy, None) == busy  # claims that expire (the Lease) end by themselves
