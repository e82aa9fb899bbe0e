"""The gate, as a table: one row per reason, each built from a passing base case by one change."""

from __future__ import annotations

from dataclasses import replace

import pytest

from remediator.gate import (
    REASONS,
    AlertFacts,
    Decision,
    FleetView,
    GatePolicy,
    JournalState,
    TargetStatus,
    decide,
)

T0 = 1_800_000_000.0
STARTS = T0 - 300  # the alert began five minutes ago
OLD = STARTS - 3600  # the process is older than the alert

POLICY = GatePolicy(
    targets=frozenset({"a", "b", "c", "d", "e"}),
    global_cooldown=900,
    max_restarts=3,
    budget_window=3600,
    max_unhealthy=2,
)
ALERT = AlertFacts("firing", {"alertname": "LLMServerStuck", "target": "a", "remediation": "restart"}, "fp1", STARTS)
FLEET = FleetView({name: TargetStatus("idle", OLD) for name in "bcde"} | {"a": TargetStatus("stuck", OLD)})
JOURNAL = JournalState()


def labels(**over: str) -> dict[str, str]:
    merged = {**ALERT.labels, **over}
    return {k: v for k, v in merged.items() if v is not None}


def fleet(**states: TargetStatus) -> FleetView:
    return FleetView({**FLEET.targets, **states})


# (case id, alert, fleet, journal, policy, now, expected reason)
CASES = [
    ("resolved", replace(ALERT, status="resolved"), FLEET, JOURNAL, POLICY, T0, "not_firing"),
    ("no label", replace(ALERT, labels=labels(remediation=None)), FLEET, JOURNAL, POLICY, T0, "no_restart_label"),
    ("other remediation", replace(ALERT, labels=labels(remediation="page")), FLEET, JOURNAL, POLICY, T0, "no_restart_label"),
    ("unknown target", replace(ALERT, labels=labels(target="zz")), FLEET, JOURNAL, POLICY, T0, "unknown_target"),
    ("no target label", replace(ALERT, labels=labels(target=None)), FLEET, JOURNAL, POLICY, T0, "unknown_target"),
    ("duplicate", ALERT, FLEET, JournalState(decided_keys=frozenset({ALERT.key})), POLICY, T0, "duplicate"),
    ("exporter unreachable", ALERT, None, JOURNAL, POLICY, T0, "exporter_unreachable"),
    ("busy now", ALERT, fleet(a=TargetStatus("busy", OLD)), JOURNAL, POLICY, T0, "not_stuck"),
    ("unknown to exporter", ALERT, FleetView({"b": TargetStatus("idle", OLD)}), JOURNAL, POLICY, T0, "not_stuck"),
    ("down, stuck alert", ALERT, fleet(a=TargetStatus("down", None)), JOURNAL, POLICY, T0, "not_stuck"),
    ("restarted since", ALERT, fleet(a=TargetStatus("stuck", STARTS + 10)), JOURNAL, POLICY, T0, "restarted_since_alert"),
    ("restart seen by counters", ALERT, fleet(a=TargetStatus("stuck", None, last_restart_time=STARTS + 1)),
     JOURNAL, POLICY, T0, "restarted_since_alert"),
    ("gpu fault", ALERT, fleet(a=TargetStatus("stuck", OLD, gpu_fault=True)), JOURNAL, POLICY, T0, "gpu_fault"),
    ("in progress", ALERT, FLEET, JournalState(in_progress="c"), POLICY, T0, "restart_in_progress"),
    ("cooldown", ALERT, FLEET, JournalState(last_restart_started=T0 - 899), POLICY, T0, "cooldown"),
    ("circuit open", ALERT, FLEET, JournalState(open_circuits=frozenset({"a"})), POLICY, T0, "circuit_open"),
    ("budget used up", ALERT, FLEET, JournalState(restart_times={"a": (T0 - 3000, T0 - 2000, T0 - 1000)},
     last_restart_started=T0 - 1000), POLICY, T0, "circuit_open"),
    ("fleet gate", ALERT, fleet(b=TargetStatus("stuck", OLD), c=TargetStatus("down", None)), JOURNAL, POLICY, T0,
     "fleet_gate"),
    # A fleet-wide hang clearing: b and c read healthy again, but the exporter saw them unhealthy
    # within its last two polls; a (still stuck, one poll behind) is no lone failure.
    ("fleet gate, fault clearing", ALERT, fleet(b=TargetStatus("busy", OLD, recently_unhealthy=True),
     c=TargetStatus("idle", OLD, recently_unhealthy=True)), JOURNAL, POLICY, T0, "fleet_gate"),
    ("dry run", ALERT, FLEET, JOURNAL, replace(POLICY, dry_run=True), T0, "dry_run"),
    ("allowed", ALERT, FLEET, JOURNAL, POLICY, T0, "allowed"),
    ("unresponsive allowed", ALERT, fleet(a=TargetStatus("unresponsive", OLD)), JOURNAL, POLICY, T0, "allowed"),
    ("labelled down alert", replace(ALERT, labels=labels(alertname="LLMServerDown")),
     fleet(a=TargetStatus("down", None)), JOURNAL, POLICY, T0, "allowed"),
    ("cooldown just over", ALERT, FLEET, JournalState(last_restart_started=T0 - 900), POLICY, T0, "allowed"),
    ("old restarts out of window", ALERT, FLEET, JournalState(restart_times={"a": (T0 - 9000, T0 - 8000, T0 - 7000)},
     last_restart_started=T0 - 7000), POLICY, T0, "allowed"),
    ("two unhealthy within max", ALERT, fleet(b=TargetStatus("stuck", OLD)), JOURNAL, POLICY, T0, "allowed"),
]


@pytest.mark.parametrize("alert, fleet_view, journal, policy, now, reason", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_gate_reason(alert, fleet_view, journal, policy, now, reason):
    decision = decide(alert, fleet_view, journal, policy, now)
    assert decision.reason == reason, decision
    assert decision.allowed == (reason == "allowed")


def test_every_reason_has_a_case():
    assert {c[-1] for c in CASES} == set(REASONS)


def test_checks_run_in_the_documented_order():
    """With every refusal true at once, each check wins over all the later ones."""
    journal = JournalState(
        in_progress="c", last_restart_started=T0, open_circuits=frozenset({"a"}), decided_keys=frozenset()
    )
    sick = fleet(a=TargetStatus("stuck", OLD, gpu_fault=True), b=TargetStatus("stuck", OLD), c=TargetStatus("down"))
    policy = replace(POLICY, dry_run=True)
    assert decide(ALERT, sick, journal, policy, T0).reason == "gpu_fault"
    sick = fleet(a=TargetStatus("stuck", OLD), b=TargetStatus("stuck", OLD), c=TargetStatus("down"))
    assert decide(ALERT, sick, journal, policy, T0).reason == "restart_in_progress"
    assert decide(ALERT, sick, replace(journal, in_progress=None), policy, T0).reason == "cooldown"
    journal = replace(journal, in_progress=None, last_restart_started=T0 - 1000)
    assert decide(ALERT, sick, journal, policy, T0).reason == "circuit_open"
    journal = replace(journal, open_circuits=frozenset())
    assert decide(ALERT, sick, journal, policy, T0).reason == "fleet_gate"
    assert decide(ALERT, FLEET, journal, policy, T0).reason == "dry_run"
    # a resolved duplicate for an unknown target is first of all resolved
    weird = replace(ALERT, status="resolved", labels=labels(target="zz"))
    assert decide(weird, None, JournalState(decided_keys=frozenset({weird.key})), policy, T0).reason == "not_firing"


def test_decision_unpacks_as_allowed_and_reason():
    allowed, reason, *_ = decide(ALERT, FLEET, JOURNAL, POLICY, T0)
    assert (allowed, reason) == (True, "allowed")
    assert isinstance(decide(ALERT, None, JOURNAL, POLICY, T0), Decision)


@pytest.mark.parametrize(
    ("journal", "reason", "opens"),
    [
        (JournalState(), "allowed", False),
        (JournalState(restart_times={"a": (T0 - 3000, T0 - 2000)}, last_restart_started=T0 - 2000), "allowed", True),
        (JournalState(restart_times={"a": (T0 - 3000, T0 - 2000, T0 - 1000)}, last_restart_started=T0 - 1000),
         "circuit_open", True),  # the budget found used up: opened now
        (JournalState(open_circuits=frozenset({"a"})), "circuit_open", False),  # open already
    ],
    ids=["first restart", "the restart that uses up the budget", "budget used up", "already open"],
)
def test_the_gate_says_when_a_decision_opens_the_circuit(journal: JournalState, reason: str, opens: bool) -> None:
    decision = decide(ALERT, FLEET, journal, POLICY, T0)
    assert (decision.reason, decision.open_circuit) == (reason, opens)
