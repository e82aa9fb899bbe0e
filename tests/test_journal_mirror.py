"""The journal's in-memory mirror and the gate's pure `after_decision` agree, so the replay's journal is the real one's."""

from __future__ import annotations

from remediator import gate
from remediator.journal import Journal

T0 = 1_800_000_000.0
POLICY = gate.GatePolicy(targets=frozenset({"a", "b"}), global_cooldown=10, max_restarts=2, budget_window=3600,
                         max_unhealthy=2)
FLEET = gate.FleetView({"a": gate.TargetStatus("stuck", T0 - 9000), "b": gate.TargetStatus("idle", T0 - 9000)})


def alert(n: int) -> gate.AlertFacts:
    return gate.AlertFacts("firing", {"alertname": "LLMServerStuck", "target": "a", "remediation": "restart"},
                           f"fp{n}", T0 - 60 + n)


async def apply(journal: Journal, facts: gate.AlertFacts, decision: gate.Decision, now: float) -> None:
    """What the service does with a decision (remediator/service.py), without the executor."""
    if decision.allowed:
        action_id = await journal.record_intent(now, facts, "http", open_circuit=decision.open_circuit)
        await journal.finish(action_id, "ok", "", 0.1)
        return
    if decision.open_circuit:
        await journal.open_circuit("a", now)
    journal.record_decision(now, facts, "dry_run" if decision.reason == "dry_run" else "refused", decision.reason)


async def test_after_decision_is_what_the_journal_mirrors(tmp_path) -> None:
    journal = Journal(tmp_path / "j.db")
    await journal.open(T0)
    try:
        pure = gate.JournalState()
        # allowed, cooldown, duplicate, allowed (uses up the budget: opens), circuit_open, dry run
        steps = [(alert(1), T0, POLICY), (alert(2), T0 + 1, POLICY), (alert(1), T0 + 20, POLICY),
                 (alert(3), T0 + 20, POLICY), (alert(4), T0 + 40, POLICY)]
        reasons = []
        for facts, now, policy in steps:
            decision = gate.decide(facts, FLEET, journal.state, policy, now)
            assert decision == gate.decide(facts, FLEET, pure, policy, now)
            reasons.append(decision.reason)
            await apply(journal, facts, decision, now)
            pure = gate.after_decision(pure, facts, decision, now)
            if decision.allowed:
                pure = gate.after_restart(pure)
            assert journal.state == pure, (decision, journal.state, pure)
        assert reasons == ["allowed", "cooldown", "duplicate", "allowed", "circuit_open"]
        await journal.reset_circuits(["a"], T0 + 50)
        dry = gate.GatePolicy(**{**POLICY.__dict__, "dry_run": True})
        decision = gate.decide(alert(5), FLEET, journal.state, dry, T0 + 60)
        assert decision.reason == "dry_run"
        await apply(journal, alert(5), decision, T0 + 60)
        assert alert(5).key in journal.state.decided_keys
        assert alert(5).key in gate.after_decision(pure, alert(5), decision, T0 + 60).decided_keys
    finally:
        await journal.close()
