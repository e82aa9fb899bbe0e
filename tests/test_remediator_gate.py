"""The gate, as a table: one row per reason, each built from a passing base case by one change."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llm_vitals.remediator.checks import gpu_refusal
from llm_vitals.remediator.gate import (
    AFTER_GATE,
    AT_EDGE,
    HUMAN_REFUSALS,
    REASONS,
    Decision,
    Effects,
    GatePolicy,
    Group,
    Plan,
    TemplateMatch,
    backoff_delay,
    decide,
    effects_of,
    ladder_step,
    managed_targets,
    node_suspect,
)
from llm_vitals.remediator.model import AlertFacts, FleetView, GateState, HeldAlert, TargetStatus

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
JOURNAL = GateState()
POD = TargetStatus("stuck", OLD, engine="vllm", namespace="llm", pod="p1", pod_uid="u1", node="node-a")
GPU_POD = replace(POD, gpu_fault=True)
TEMPLATED = replace(POLICY, templates=(TemplateMatch(engine="vllm", namespace="llm"),))
MOVING = replace(TEMPLATED, gpu_fault_action="cordon_and_move")
POD_ALERT = replace(ALERT, labels={**ALERT.labels, "target": "llm/p1"})
DEPLOYMENT = "Deployment/llm/vllm"
OTHER = "StatefulSet/llm/other"  # another workload, whose restart on a node is evidence about it
DEPLOYED = replace(POD, workload=DEPLOYMENT)
LADDERED = replace(TEMPLATED, escalate_within=1800.0)
GROUP = "LeaderWorkerSet/llm/big/0"
DEGRADED_ALERT = replace(POD_ALERT, labels={**POD_ALERT.labels, "alertname": "LLMServerDegraded"})
DEGRADED = replace(DEPLOYED, state="busy", degraded=True)
# Another workload's replica on the same node, degraded beside its own peers: evidence against the node.
NEIGHBOUR = replace(POD, state="busy", pod="q1", pod_uid="uq1", workload=OTHER, degraded=True)


def labels(**over: str) -> dict[str, str]:
    merged = {**ALERT.labels, **over}
    return {k: v for k, v in merged.items() if v is not None}


def fleet(**states: TargetStatus) -> FleetView:
    return FleetView({**FLEET.targets, **states})


def withheld(**states: TargetStatus) -> FleetView:
    """FLEET with these targets moved to `withheld` (reported by more than one exporter)."""
    return FleetView({n: s for n, s in FLEET.targets.items() if n not in states}, withheld=states)


# (case id, alert, fleet, journal, policy, now, expected reason)
CASES = [
    ("resolved", replace(ALERT, status="resolved"), FLEET, JOURNAL, POLICY, T0, "not_firing"),
    ("no label", replace(ALERT, labels=labels(remediation=None)), FLEET, JOURNAL, POLICY, T0, "no_restart_label"),
    ("other remediation", replace(ALERT, labels=labels(remediation="page")), FLEET, JOURNAL, POLICY, T0, "no_restart_label"),
    ("unknown target", replace(ALERT, labels=labels(target="zz")), FLEET, JOURNAL, POLICY, T0, "unknown_target"),
    ("no target label", replace(ALERT, labels=labels(target=None)), FLEET, JOURNAL, POLICY, T0, "unknown_target"),
    ("duplicate", ALERT, FLEET, GateState(decided_keys=frozenset({ALERT.key})), POLICY, T0, "duplicate"),
    ("exporter unreachable", ALERT, None, JOURNAL, POLICY, T0, "exporter_unreachable"),
    ("busy now", ALERT, fleet(a=TargetStatus("busy", OLD)), JOURNAL, POLICY, T0, "not_stuck"),
    ("unknown to exporter", ALERT, FleetView({"b": TargetStatus("idle", OLD)}), JOURNAL, POLICY, T0, "not_stuck"),
    ("down, stuck alert", ALERT, fleet(a=TargetStatus("down", None)), JOURNAL, POLICY, T0, "not_stuck"),
    ("restarted since", ALERT, fleet(a=TargetStatus("stuck", STARTS + 10)), JOURNAL, POLICY, T0, "restarted_since_alert"),
    ("restart seen by counters", ALERT, fleet(a=TargetStatus("stuck", None, last_restart_time=STARTS + 1)),
     JOURNAL, POLICY, T0, "restarted_since_alert"),
    # The server's clock 10 minutes behind: its start time says before the alert, the exporter saw
    # the restart after it (its own clock, the alert's readings'). Before: allowed, a second restart.
    ("restart seen by the exporter, start time from a clock behind", ALERT,
     fleet(a=TargetStatus("stuck", STARTS - 590, last_restart_time=STARTS + 10)), JOURNAL, POLICY, T0,
     "restarted_since_alert"),
    ("gpu fault", ALERT, fleet(a=TargetStatus("stuck", OLD, gpu_fault=True)), JOURNAL, POLICY, T0, "gpu_fault"),
    ("in progress", ALERT, FLEET, GateState(in_progress="c"), POLICY, T0, "restart_in_progress"),
    ("cooldown", ALERT, FLEET, GateState(last_restart_started=T0 - 899), POLICY, T0, "cooldown"),
    ("circuit open", ALERT, FLEET, GateState(open_circuits=frozenset({"a"})), POLICY, T0, "circuit_open"),
    ("budget used up", ALERT, FLEET, GateState(restart_times={"a": (T0 - 3000, T0 - 2000, T0 - 1000)},
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
    ("cooldown just over", ALERT, FLEET, GateState(last_restart_started=T0 - 900), POLICY, T0, "allowed"),
    ("old restarts out of window", ALERT, FLEET, GateState(restart_times={"a": (T0 - 9000, T0 - 8000, T0 - 7000)},
     last_restart_started=T0 - 7000), POLICY, T0, "allowed"),
    ("two unhealthy within max", ALERT, fleet(b=TargetStatus("stuck", OLD)), JOURNAL, POLICY, T0, "allowed"),
    # Pause (shared across replicas, in the state the gate reads).
    ("paused", ALERT, FLEET, GateState(paused_until=T0 + 1, pause_reason="maintenance"), POLICY, T0, "paused"),
    ("pause over", ALERT, FLEET, GateState(paused_until=T0, pause_reason="maintenance"), POLICY, T0, "allowed"),
    ("paused duplicate", ALERT, FLEET, GateState(decided_keys=frozenset({ALERT.key}), paused_until=T0 + 1),
     POLICY, T0, "duplicate"),
    ("shared state unreadable", ALERT, FLEET, None, POLICY, T0, "state_unreachable"),
    # A dead replica's intent ends at its executor's timeout.
    ("intent not expired", ALERT, FLEET, GateState(in_progress="c", in_progress_expires=T0 + 1), POLICY, T0,
     "restart_in_progress"),
    ("intent expired", ALERT, FLEET, GateState(in_progress="c", in_progress_expires=T0), POLICY, T0, "allowed"),
    # Storm cooldown: the fleet is healthy again, but a storm was seen within storm_cooldown.
    ("storm cooldown", ALERT, FLEET, GateState(storm_seen_at=T0 - 599), replace(POLICY, storm_cooldown=600), T0,
     "storm_cooldown"),
    ("storm cooldown over", ALERT, FLEET, GateState(storm_seen_at=T0 - 600), replace(POLICY, storm_cooldown=600),
     T0, "allowed"),
    ("storm still on", ALERT, fleet(b=TargetStatus("stuck", OLD), c=TargetStatus("down", None)),
     GateState(storm_seen_at=T0 - 1), replace(POLICY, storm_cooldown=600), T0, "fleet_gate"),
    # Templates: a discovered target is known when a template takes it.
    ("template by engine", replace(ALERT, labels=labels(target="llm/p1")),
     fleet(**{"llm/p1": POD}), JOURNAL, TEMPLATED, T0, "allowed"),
    ("template, other engine", replace(ALERT, labels=labels(target="llm/p1")),
     fleet(**{"llm/p1": replace(POD, engine="tgi")}), JOURNAL, TEMPLATED, T0, "unknown_target"),
    ("template, other namespace", replace(ALERT, labels=labels(target="llm/p1")),
     fleet(**{"llm/p1": replace(POD, namespace="dev")}), JOURNAL, TEMPLATED, T0, "unknown_target"),
    ("template, not reported", replace(ALERT, labels=labels(target="llm/p9")), FLEET, JOURNAL, TEMPLATED, T0,
     "unknown_target"),
    ("template by name glob", replace(ALERT, labels=labels(target="llm/p1")), fleet(**{"llm/p1": POD}), JOURNAL,
     replace(POLICY, templates=(TemplateMatch(name="llm/p*"),)), T0, "allowed"),
    ("template, glob misses", replace(ALERT, labels=labels(target="llm/p1")), fleet(**{"llm/p1": POD}), JOURNAL,
     replace(POLICY, templates=(TemplateMatch(name="llm/q*"),)), T0, "unknown_target"),
    ("static still known with templates", ALERT, FLEET, JOURNAL, TEMPLATED, T0, "allowed"),
    # GPU escalation: off by default; once per node; under the cooldown and the fleet gate.
    ("gpu fault, refuse by default", POD_ALERT, fleet(**{"llm/p1": GPU_POD}), JOURNAL, TEMPLATED, T0, "gpu_fault"),
    ("gpu fault, cordon_and_move", POD_ALERT, fleet(**{"llm/p1": GPU_POD}), JOURNAL, MOVING, T0, "cordon_and_move"),
    ("gpu fault, node done once", POD_ALERT, fleet(**{"llm/p1": GPU_POD}),
     GateState(cordoned_nodes=frozenset({"node-a"})), MOVING, T0, "gpu_fault"),
    ("gpu fault, no node known", POD_ALERT, fleet(**{"llm/p1": replace(GPU_POD, node=None)}), JOURNAL, MOVING, T0,
     "gpu_fault"),
    ("gpu move under cooldown", POD_ALERT, fleet(**{"llm/p1": GPU_POD}),
     GateState(last_restart_started=T0 - 10), MOVING, T0, "cooldown"),
    ("gpu move under fleet gate", POD_ALERT, fleet(**{"llm/p1": GPU_POD}, b=TargetStatus("stuck", OLD),
     c=TargetStatus("down", None)), JOURNAL, MOVING, T0, "fleet_gate"),
    # Sharded exporters (`exporter_urls`): a target two of them report is withheld (llm_vitals/remediator/shards.py):
    # never acted on, yet counted by the fleet gate.
    ("withheld: reported by two exporters", ALERT, withheld(a=TargetStatus("stuck", OLD)), JOURNAL, POLICY, T0,
     "unknown_target"),
    ("withheld template target", POD_ALERT, withheld(**{"llm/p1": POD}), JOURNAL, TEMPLATED, T0, "unknown_target"),
    ("withheld static targets count in the fleet gate", ALERT,
     withheld(b=TargetStatus("stuck", OLD), c=TargetStatus("down", None)), JOURNAL, POLICY, T0, "fleet_gate"),
    ("withheld template targets count in the fleet gate", ALERT,
     withheld(**{"llm/p2": POD, "llm/p3": POD, "llm/p4": POD}), JOURNAL, replace(TEMPLATED, max_unhealthy=2), T0,
     "fleet_gate"),
    ("withheld healthy targets: allowed", ALERT, withheld(b=TargetStatus("idle", OLD), c=TargetStatus("idle", OLD)),
     JOURNAL, POLICY, T0, "allowed"),
    # Forward compatibility: a verdict this remediator does not know refuses that target only.
    ("unknown state", ALERT, fleet(a=TargetStatus("draining", OLD, unknown_verdict="state 'draining' unknown")),
     JOURNAL, POLICY, T0, "unknown_verdict"),
    ("unknown reason of a stuck target", ALERT, fleet(a=TargetStatus("stuck", OLD, unknown_verdict="reason 'x'")),
     JOURNAL, POLICY, T0, "unknown_verdict"),
    ("another target's unknown verdict", ALERT, fleet(b=TargetStatus("draining", OLD, unknown_verdict="state")),
     JOURNAL, POLICY, T0, "allowed"),
    # A pod is acted on by UID only.
    ("pod without a UID", POD_ALERT, fleet(**{"llm/p1": replace(POD, pod_uid=None)}), JOURNAL, TEMPLATED, T0,
     "no_pod_uid"),
    ("template target naming no pod", POD_ALERT, fleet(**{"llm/p1": replace(POD, pod=None, pod_uid=None)}), JOURNAL,
     TEMPLATED, T0, "no_pod_uid"),
    ("gpu move needs the UID too", POD_ALERT, fleet(**{"llm/p1": replace(GPU_POD, pod_uid=None)}), JOURNAL, MOVING,
     T0, "no_pod_uid"),
    # Budgets and circuits per workload, across the pod names a Deployment's restarts make.
    ("a Deployment's budget spent by its earlier pods", replace(ALERT, labels=labels(target="llm/p2")),
     fleet(**{"llm/p2": replace(DEPLOYED, pod="p2", pod_uid="u2")}),
     GateState(restart_times={DEPLOYMENT: (T0 - 3000, T0 - 2000, T0 - 1000)}), TEMPLATED, T0, "circuit_open"),
    ("a Deployment's open circuit holds for its new pods", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(open_circuits=frozenset({DEPLOYMENT})), TEMPLATED, T0, "circuit_open"),
    ("another workload's budget is its own", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(restart_times={"Deployment/llm/other": (T0 - 3000, T0 - 2000, T0 - 1000)},
                  open_circuits=frozenset({"Deployment/llm/other"})), TEMPLATED, T0, "allowed"),
    ("an older exporter (no workload): the target's name", POD_ALERT, fleet(**{"llm/p1": POD}),
     GateState(restart_times={"llm/p1": (T0 - 3000, T0 - 2000, T0 - 1000)}), TEMPLATED, T0, "circuit_open"),
    # The escalation ladder: restart -> cordon_and_move -> page, per workload, within escalate_within.
    ("ladder: first a restart", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}), JOURNAL, LADDERED, T0, "allowed"),
    # The ladder's cordon is evidence about a node: the hang came back on the node the restart left it on,
    # and another workload was restarted on that node within escalate_within too.
    ("ladder: stuck again on the restart's node, where another hung too: cordon and move", POD_ALERT,
     fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("restart", T0 - 1799), OTHER: ("restart", T0 - 600)},
                  ladder_nodes={DEPLOYMENT: "node-a", OTHER: "node-a"}), LADDERED, T0, "cordon_and_move"),
    # A pinned pod (a StatefulSet's, a LeaderWorkerSet group's) comes back on its node by design: its own
    # bug hanging it there again says nothing about the node. Before: cordon_and_move of a healthy node.
    ("ladder: stuck again on the restart's node alone: page, never cordon", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("restart", T0 - 1799)}, ladder_nodes={DEPLOYMENT: "node-a"}), LADDERED, T0,
     "escalated_to_human"),
    ("ladder: stuck again, no node on record (an older state): page", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("restart", T0 - 1799)}), LADDERED, T0, "escalated_to_human"),
    # p1 of the Deployment was restarted on node-a; p2, on node-b and never restarted, hangs 16 minutes
    # later: the hang follows the software, not a node. node-b is healthy and is not cordoned.
    ("ladder: a sibling's hang on another node pages, never cordons", replace(ALERT, labels=labels(target="llm/p2")),
     fleet(**{"llm/p2": replace(DEPLOYED, pod="p2", pod_uid="u2", node="node-b")}),
     GateState(ladder={DEPLOYMENT: ("restart", T0 - 960)}, ladder_nodes={DEPLOYMENT: "node-a"}), LADDERED, T0,
     "escalated_to_human"),
    # A page holds until a human releases the workload: past escalate_within, the same alert re-sent by
    # Alertmanager's repeat_interval, or a new one, is refused again (on main the ladder started over).
    ("page holds past escalate_within (an older state's page step)", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("page", T0 - 3600)}), LADDERED, T0, "escalated_to_human"),
    ("page holds for hours", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(pages={DEPLOYMENT: T0 - 14 * 3600}), LADDERED, T0, "escalated_to_human"),
    ("page holds with the ladder turned off since", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(pages={DEPLOYMENT: T0 - 60}), TEMPLATED, T0, "escalated_to_human"),
    ("another workload's page is its own", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(pages={"Deployment/llm/other": T0 - 60}), LADDERED, T0, "allowed"),
    # Cordons are bounded fleet-wide (max_cordoned_nodes, 1 by default).
    ("gpu fault, a node already cordoned elsewhere: cordon_limit", POD_ALERT, fleet(**{"llm/p1": GPU_POD}),
     GateState(cordoned_nodes=frozenset({"node-z"})), MOVING, T0, "cordon_limit"),
    ("gpu fault, room for a second cordon", POD_ALERT, fleet(**{"llm/p1": GPU_POD}),
     GateState(cordoned_nodes=frozenset({"node-z"})), replace(MOVING, max_cordoned_nodes=2), T0, "cordon_and_move"),
    ("ladder cordon, limit reached: cordon_limit", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("restart", T0 - 60), OTHER: ("restart", T0 - 120)},
                  ladder_nodes={DEPLOYMENT: "node-a", OTHER: "node-a"}, cordoned_nodes=frozenset({"node-z"})), LADDERED,
     T0, "cordon_limit"),
    ("max_cordoned_nodes 0: never a cordon", POD_ALERT, fleet(**{"llm/p1": GPU_POD}), JOURNAL,
     replace(MOVING, max_cordoned_nodes=0), T0, "cordon_limit"),
    # The backoff: 15 min after the first restart of a streak, 30 after the second, 1 h, ... capped at 4 h.
    ("backoff after the first restart", ALERT, FLEET, GateState(backoff={"a": (1, T0 - 899)}), POLICY, T0,
     "backoff"),
    ("backoff after the first restart, over", ALERT, FLEET, GateState(backoff={"a": (1, T0 - 900)}), POLICY, T0,
     "allowed"),
    ("backoff grows: an hour after the third", ALERT, FLEET, GateState(backoff={"a": (3, T0 - 3599)}), POLICY, T0,
     "backoff"),
    ("backoff capped at max", ALERT, FLEET, GateState(backoff={"a": (30, T0 - 4 * 3600)}), POLICY, T0, "allowed"),
    ("backoff: a quiet reset_after ends the streak", ALERT, FLEET,
     GateState(backoff={"a": (30, T0 - 12 * 3600)}), replace(POLICY, backoff_max=1e6), T0, "allowed"),
    ("backoff off", ALERT, FLEET, GateState(backoff={"a": (3, T0 - 60)}), replace(POLICY, backoff_initial=0), T0,
     "allowed"),
    ("another workload's backoff is its own", ALERT, FLEET, GateState(backoff={"b": (3, T0 - 60)}), POLICY, T0,
     "allowed"),
    ("ladder: after escalate_within, a restart again", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("restart", T0 - 1800)}), LADDERED, T0, "allowed"),
    ("ladder: stuck again after the move, page", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("cordon_and_move", T0 - 60)}), LADDERED, T0, "escalated_to_human"),
    ("ladder: paged, still paged", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("page", T0 - 60)}), LADDERED, T0, "escalated_to_human"),
    ("ladder: no node to move off, page", POD_ALERT, fleet(**{"llm/p1": replace(DEPLOYED, node=None)}),
     GateState(ladder={DEPLOYMENT: ("restart", T0 - 60)}), LADDERED, T0, "escalated_to_human"),
    ("ladder: node already cordoned, page", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("restart", T0 - 60)}, ladder_nodes={DEPLOYMENT: "node-a"},
                  cordoned_nodes=frozenset({"node-a"})), LADDERED, T0,
     "escalated_to_human"),
    ("ladder: a static target has no node, page", ALERT, FLEET, GateState(ladder={"a": ("restart", T0 - 60)}),
     replace(POLICY, escalate_within=1800.0), T0, "escalated_to_human"),
    ("ladder: another workload's step is its own", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={"Deployment/llm/other": ("cordon_and_move", T0 - 60)}), LADDERED, T0, "allowed"),
    ("ladder off: a step on record changes nothing", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("cordon_and_move", T0 - 60)}), TEMPLATED, T0, "allowed"),
    ("ladder: the move waits for the cooldown", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("restart", T0 - 60), OTHER: ("restart", T0 - 120)},
                  ladder_nodes={DEPLOYMENT: "node-a", OTHER: "node-a"}, last_restart_started=T0 - 60), LADDERED, T0,
     "cooldown"),
    ("ladder: the page comes before the cooldown", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("cordon_and_move", T0 - 60)}, last_restart_started=T0 - 60), LADDERED, T0,
     "escalated_to_human"),
    ("ladder: a GPU fault moved once, stuck again: page", POD_ALERT,
     fleet(**{"llm/p1": replace(GPU_POD, workload=DEPLOYMENT, node="node-b")}),
     GateState(ladder={DEPLOYMENT: ("cordon_and_move", T0 - 60)}), replace(MOVING, escalate_within=1800.0), T0,
     "escalated_to_human"),
    # A replica degraded beside its peers (issue 40): LLMServerDegraded, relabelled remediation="restart" by an
    # operator, is never a restart; it is a move only off a node other evidence points at, with cordon_and_move.
    ("degraded alone: never a restart nor a move", DEGRADED_ALERT, fleet(**{"llm/p1": DEGRADED}), JOURNAL, MOVING, T0,
     "not_stuck"),
    ("degraded, another workload degraded on its node: cordon and move", DEGRADED_ALERT,
     fleet(**{"llm/p1": DEGRADED, "llm/q1": NEIGHBOUR}), JOURNAL, MOVING, T0, "cordon_and_move"),
    ("degraded, a GPU fault on another workload's replica there: cordon and move", DEGRADED_ALERT,
     fleet(**{"llm/p1": DEGRADED, "llm/q1": replace(NEIGHBOUR, degraded=False, gpu_fault=True)}), JOURNAL, MOVING, T0,
     "cordon_and_move"),
    ("degraded, its own workload's other replica degraded there: no evidence against the node", DEGRADED_ALERT,
     fleet(**{"llm/p1": DEGRADED, "llm/q1": replace(NEIGHBOUR, workload=DEPLOYMENT)}), JOURNAL, MOVING, T0,
     "not_stuck"),
    ("degraded, another workload degraded on another node: no evidence", DEGRADED_ALERT,
     fleet(**{"llm/p1": DEGRADED, "llm/q1": replace(NEIGHBOUR, node="node-b")}), JOURNAL, MOVING, T0, "not_stuck"),
    ("degraded with evidence, gpu_fault_action refuse: no move", DEGRADED_ALERT,
     fleet(**{"llm/p1": DEGRADED, "llm/q1": NEIGHBOUR}), JOURNAL, TEMPLATED, T0, "not_stuck"),
    ("degraded with evidence, under the usual limits: cordon_limit", DEGRADED_ALERT,
     fleet(**{"llm/p1": DEGRADED, "llm/q1": NEIGHBOUR}), GateState(cordoned_nodes=frozenset({"node-z"})), MOVING, T0,
     "cordon_limit"),
    ("degraded with evidence, under the usual limits: cooldown", DEGRADED_ALERT,
     fleet(**{"llm/p1": DEGRADED, "llm/q1": NEIGHBOUR}), GateState(last_restart_started=T0 - 60), MOVING, T0,
     "cooldown"),
    ("the degraded alert, no longer degraded now", DEGRADED_ALERT,
     fleet(**{"llm/p1": replace(DEGRADED, degraded=False), "llm/q1": NEIGHBOUR}), JOURNAL, MOVING, T0, "not_stuck"),
    ("ladder: stuck again on its node, where another workload's replica is degraded: cordon and move", POD_ALERT,
     fleet(**{"llm/p1": DEPLOYED, "llm/q1": NEIGHBOUR}),
     GateState(ladder={DEPLOYMENT: ("restart", T0 - 1799)}, ladder_nodes={DEPLOYMENT: "node-a"}), LADDERED, T0,
     "cordon_and_move"),
    # A LeaderWorkerSet group is one server in the fleet gate (max_unhealthy 2: a and the group).
    ("a stuck group counts once in the fleet gate", ALERT,
     fleet(**{f"llm/g{i}": replace(POD, pod=f"g{i}", pod_uid=f"ug{i}", workload=GROUP) for i in range(3)}),
     JOURNAL, TEMPLATED, T0, "allowed"),
    ("the same pods as lone servers are a storm", ALERT,
     fleet(**{f"llm/g{i}": replace(POD, pod=f"g{i}", pod_uid=f"ug{i}") for i in range(3)}),
     JOURNAL, TEMPLATED, T0, "fleet_gate"),
    ("a group's pod, allowed: the group restarts", replace(ALERT, labels=labels(target="llm/g1")),
     fleet(**{f"llm/g{i}": replace(POD, pod=f"g{i}", pod_uid=f"ug{i}", workload=GROUP) for i in range(3)}),
     GateState(restart_times={GROUP: (T0 - 3000,)}), TEMPLATED, T0, "allowed"),
]


@pytest.mark.parametrize("alert, fleet_view, journal, policy, now, reason", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_gate_reason(alert, fleet_view, journal, policy, now, reason):
    decision = decide(alert, fleet_view, journal, policy, now)
    assert decision.reason == reason, decision
    assert decision.allowed == (reason in ("allowed", "cordon_and_move"))


def test_every_refusal_a_human_must_see_has_an_event_reason():
    from llm_vitals.remediator.pods import EVENT_REASONS

    assert set(HUMAN_REFUSALS) <= set(EVENT_REASONS)


def test_every_reason_has_a_case():
    assert {c[-1] for c in CASES} == set(REASONS) - AFTER_GATE - AT_EDGE


def test_checks_run_in_the_documented_order():
    """With every refusal true at once, each check wins over all the later ones."""
    journal = GateState(
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
    assert decide(weird, None, GateState(decided_keys=frozenset({weird.key})), policy, T0).reason == "not_firing"


ADVICE = "a restart would not help: move the workload off it, or set gpu_fault_action: cordon_and_move"


@pytest.mark.parametrize("status, policy, detail", [
    (replace(GPU_POD, gpu_fault_detail="GpuMemWatch: Xid79: GPU has fallen off the bus"), TEMPLATED,
     f"a GPU fault is flagged (GpuMemWatch: Xid79: GPU has fallen off the bus) on node node-a; {ADVICE}"),
    (TargetStatus("stuck", OLD, gpu_fault=True), POLICY, f"a GPU fault is flagged; {ADVICE}"),
    (replace(GPU_POD, gpu_fault_detail="x" * 400), TEMPLATED,
     f"a GPU fault is flagged ({'x' * 300}) on node node-a; {ADVICE}"),
    (replace(GPU_POD, pod=None, gpu_fault_detail="SysLogsXIDError: Xid 48"), MOVING,
     "a GPU fault is flagged (SysLogsXIDError: Xid 48) on node node-a; a restart would not help: move the"
     " workload off it by hand (cordon_and_move needs the pod and node the exporter names)"),
], ids=["fault and node", "static target, nothing known", "long fault cut", "cordon_and_move without a pod"])
def test_a_refused_gpu_fault_says_what_the_fault_is_where_and_what_to_do(status, policy, detail):
    """The detail is the message of the pod's LLMVitalsGpuFault Event: a human acts on it."""
    assert gpu_refusal(status, policy) == detail
    alert = ALERT if status.pod is None and policy is POLICY else POD_ALERT
    assert decide(alert, fleet(**{alert.target: status}), JOURNAL, policy, T0) == Decision(False, "gpu_fault", detail)


def test_decision_unpacks_as_allowed_and_reason():
    allowed, reason, _, plan = decide(ALERT, FLEET, JOURNAL, POLICY, T0)
    assert (allowed, reason) == (True, "allowed") and plan is not None
    assert isinstance(decide(ALERT, None, JOURNAL, POLICY, T0), Decision)


@pytest.mark.parametrize("alert, fleet_view, journal, policy, now, reason", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_decision_carries_a_plan_exactly_when_it_is_allowed(alert, fleet_view, journal, policy, now, reason):
    decision = decide(alert, fleet_view, journal, policy, now)
    assert (decision.plan is not None) == decision.allowed


TIMED = replace(TEMPLATED, templates=(TemplateMatch(engine="vllm", namespace="llm", timeout=45.0,
                                                    pre_restart_timeout=10.0),),
                target_timeouts={"a": 120.0}, pre_restart_timeouts={"a": 20.0})
GROUPED = fleet(**{f"llm/g{i}": replace(POD, pod=f"g{i}", pod_uid=f"ug{i}", workload=GROUP) for i in range(3)})


PLAN_CASES = [
    ("static target: its own executor", ALERT, FLEET, JOURNAL, TIMED,
     Plan("a", "a", "restart", 120.0, 140.0)),
    ("static target, no timeout named", ALERT, FLEET, JOURNAL, POLICY, Plan("a", "a", "restart", 30.0, 30.0)),
    ("a template's pod, by UID", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}), JOURNAL, TIMED,
     Plan("llm/p1", DEPLOYMENT, "restart_pod", 45.0, 55.0, "llm", "p1", "u1", "node-a", template=0)),
    ("a group's pod: the whole group", replace(ALERT, labels=labels(target="llm/g1")), GROUPED, JOURNAL, TIMED,
     Plan("llm/g1", GROUP, "restart_group", 45.0, 55.0, "llm", "g1", "ug1", "node-a", Group("llm", "big", "0"),
          template=0)),
    ("a GPU fault: cordon, tainted with the fault's reason", POD_ALERT,
     fleet(**{"llm/p1": replace(GPU_POD, gpu_fault_detail="GpuMemWatch: Xid79: GPU has fallen off the bus")}), JOURNAL,
     replace(TIMED, gpu_fault_action="cordon_and_move"),
     Plan("llm/p1", "llm/p1", "cordon_and_move", 45.0, 55.0, "llm", "p1", "u1", "node-a",
          taint="GpuMemWatch", cause="GPU fault (GpuMemWatch: Xid79: GPU has fallen off the bus)", template=0)),
    ("the ladder's cordon", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("restart", T0 - 60), OTHER: ("restart", T0 - 120)},
                  ladder_nodes={DEPLOYMENT: "node-a", OTHER: "node-a"}),
     replace(TIMED, escalate_within=1800.0),
     Plan("llm/p1", DEPLOYMENT, "cordon_and_move", 45.0, 55.0, "llm", "p1", "u1", "node-a", taint="LadderEscalation",
          cause=f"{DEPLOYMENT} stuck again on this node within escalate_within of its restart here", template=0)),
]


@pytest.mark.parametrize("alert, fleet_view, journal, policy, plan", [c[1:] for c in PLAN_CASES],
                         ids=[c[0] for c in PLAN_CASES])
def test_the_plan_says_what_is_acted_on_by_uid_and_for_how_long(alert, fleet_view, journal, policy, plan):
    assert decide(alert, fleet_view, journal, policy, T0).plan == plan


def test_a_percentage_limit_is_taken_of_the_fleet_the_templates_make():
    """Six targets (five static, one discovered) at 40%: two may be unhealthy, three is a storm."""
    policy = replace(TEMPLATED, max_unhealthy_percent=40.0)
    alert = POD_ALERT
    idle = TargetStatus("idle", OLD)
    two = fleet(**{"llm/p1": POD}, a=idle, b=TargetStatus("stuck", OLD))
    assert decide(alert, two, JOURNAL, policy, T0).reason == "allowed"
    three = fleet(**{"llm/p1": POD}, a=idle, b=TargetStatus("stuck", OLD), c=TargetStatus("down"))
    assert decide(alert, three, JOURNAL, policy, T0).reason == "fleet_gate"
    # Unmatched targets the exporter reports are not part of the fleet.
    other = fleet(**{"llm/p1": POD, "dev/x": replace(POD, namespace="dev", state="down")}, a=idle,
                  b=TargetStatus("stuck", OLD))
    assert decide(alert, other, JOURNAL, policy, T0).reason == "allowed"

    # One view asked by two policies: each policy's fleet, each computed once and kept with the view.
    view = fleet(**{"llm/p1": POD}, a=idle)
    assert managed_targets(POLICY, view) == ["a", "b", "c", "d", "e"]
    assert managed_targets(policy, view) == ["a", "b", "c", "d", "e", "llm/p1"]
    assert managed_targets(POLICY, view) == ["a", "b", "c", "d", "e"] and len(view.managed) == 2
    assert view == fleet(**{"llm/p1": POD}, a=idle)  # what it keeps is not part of the view


HELD_BACKOFF = {"a": HeldAlert("a", "backoff", T0 - 600, T0 - 60, ALERT.fingerprint, ALERT.starts_at, "LLMServerStuck")}

EFFECT_CASES = [
    ("allowed: intent", ALERT, FLEET, JOURNAL, POLICY, Effects(intent=True, workload="a", backoff=(1, T0))),
    # A backoff refusal is written (LLMVitalsRemediatorBackoffHolding tells a human), its copies soon after are not.
    ("a backoff refusal is recorded", ALERT, FLEET, GateState(backoff={"a": (3, T0 - 60)}), POLICY,
     Effects(workload="a", backoff_refused=True, hold="backoff")),
    ("a backoff refusal's copy within 5 minutes writes nothing", ALERT, FLEET,
     GateState(backoff={"a": (3, T0 - 60)}, backoff_refused={"a": (T0 - 600, T0 - 299)}, held=HELD_BACKOFF),
     POLICY, Effects(workload="a")),
    ("a backoff refusal's re-send 5 minutes on is recorded", ALERT, FLEET,
     GateState(backoff={"a": (3, T0 - 60)}, backoff_refused={"a": (T0 - 600, T0 - 300)}), POLICY,
     Effects(workload="a", backoff_refused=True, hold="backoff")),
    # A hold is written when it starts, changes reason or is HELD_REFRESH old; it ends when the target
    # is decided otherwise.
    ("a held target's hold refreshed", ALERT, FLEET,
     GateState(backoff={"a": (3, T0 - 60)}, backoff_refused={"a": (T0 - 600, T0 - 299)},
                  held={"a": replace(HELD_BACKOFF["a"], at=T0 - 120)}), POLICY, Effects(workload="a", hold="backoff")),
    ("a held target's hold changes reason", ALERT, FLEET,
     GateState(held={"a": replace(HELD_BACKOFF["a"], reason="paused")}, last_restart_started=T0 - 5), POLICY,
     Effects(workload="a", hold="cooldown")),
    ("a held target restarted: its hold ends", ALERT, FLEET, GateState(held=HELD_BACKOFF), POLICY,
     Effects(intent=True, workload="a", backoff=(1, T0), unhold=True)),
    ("a held target no longer stuck: its hold ends", ALERT, fleet(a=TargetStatus("busy", OLD)),
     GateState(held=HELD_BACKOFF), POLICY, Effects(workload="a", unhold=True)),
    ("a held target not judged (exporter down): held as it was", ALERT, None, GateState(held=HELD_BACKOFF),
     POLICY, Effects(workload="a")),
    ("a held target's alert already decided (a restart by another replica): its hold ends", ALERT, FLEET,
     GateState(held=HELD_BACKOFF, decided_keys=frozenset({ALERT.key})), POLICY, Effects(workload="a", unhold=True)),
    ("last of the budget opens the circuit", ALERT, FLEET, GateState(restart_times={"a": (T0 - 3000, T0 - 2000)}),
     POLICY, Effects(intent=True, open_circuit=True, workload="a", backoff=(1, T0))),
    ("budget used up opens the circuit once", ALERT, FLEET,
     GateState(restart_times={"a": (T0 - 3000, T0 - 2000, T0 - 1000)}), POLICY,
     Effects(open_circuit=True, workload="a", hold="circuit_open")),
    ("already open: held", ALERT, FLEET, GateState(open_circuits=frozenset({"a"})), POLICY,
     Effects(workload="a", hold="circuit_open")),
    ("storm recorded", ALERT, fleet(b=TargetStatus("stuck", OLD), c=TargetStatus("down")), JOURNAL,
     replace(POLICY, storm_cooldown=600), Effects(storm_seen_at=T0, workload="a", hold="fleet_gate")),
    ("storm recorded under a cooldown too", ALERT, fleet(b=TargetStatus("stuck", OLD), c=TargetStatus("down")),
     GateState(last_restart_started=T0 - 5), replace(POLICY, storm_cooldown=600),
     Effects(storm_seen_at=T0, workload="a", hold="cooldown")),
    ("storm just recorded: no second write", ALERT, fleet(b=TargetStatus("stuck", OLD), c=TargetStatus("down")),
     GateState(storm_seen_at=T0 - 0.5, held={"a": replace(HELD_BACKOFF["a"], reason="fleet_gate")}),
     replace(POLICY, storm_cooldown=600), Effects(workload="a")),
    # Every replica's backstop word holds the fleet after a storm, whatever the storm cooldown.
    ("no storm cooldown configured: recorded all the same", ALERT,
     fleet(b=TargetStatus("stuck", OLD), c=TargetStatus("down")), JOURNAL, POLICY,
     Effects(storm_seen_at=T0, workload="a", hold="fleet_gate")),
    # The node is marked only once its cordon succeeded (acting.py), never by the decision.
    ("gpu move: the node is not marked yet", POD_ALERT, fleet(**{"llm/p1": GPU_POD}), JOURNAL, MOVING,
     Effects(intent=True, workload="llm/p1", backoff=(1, T0))),
    ("duplicate: nothing", ALERT, FLEET, GateState(decided_keys=frozenset({ALERT.key})), POLICY,
     Effects(workload="a")),
    # Budgets, circuits and the ladder count the workload, not the pod.
    ("a pod's restart counts against its Deployment", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(restart_times={DEPLOYMENT: (T0 - 3000, T0 - 2000)}), TEMPLATED,
     Effects(intent=True, open_circuit=True, workload=DEPLOYMENT, backoff=(1, T0))),
    ("ladder on: the restart is its first step", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}), JOURNAL, LADDERED,
     Effects(intent=True, workload=DEPLOYMENT, step="restart", node="node-a", backoff=(1, T0))),
    ("ladder: stuck again, the move is its second step", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("restart", T0 - 60), OTHER: ("restart", T0 - 120)},
                  ladder_nodes={DEPLOYMENT: "node-a", OTHER: "node-a"},
                  backoff={DEPLOYMENT: (1, T0 - 900)}), LADDERED,
     Effects(intent=True, workload=DEPLOYMENT, step="cordon_and_move", node="node-a", backoff=(2, T0))),
    ("ladder: the page is written once", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("cordon_and_move", T0 - 60)}), LADDERED,
     Effects(workload=DEPLOYMENT, step="page", page=True, hold="escalated_to_human")),
    ("a page held already: held", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(pages={DEPLOYMENT: T0 - 7200}), LADDERED, Effects(workload=DEPLOYMENT, hold="escalated_to_human")),
    ("a ladder cordon refused by the limit pages (the ladder must not start over)", POD_ALERT,
     fleet(**{"llm/p1": DEPLOYED}), GateState(ladder={DEPLOYMENT: ("restart", T0 - 60)},
                                                 ladder_nodes={DEPLOYMENT: "node-a"}, cordoned_nodes=frozenset({"node-z"})),
     LADDERED, Effects(workload=DEPLOYMENT, step="page", page=True, hold="escalated_to_human")),
    ("a GPU cordon refused by the limit is no page, but held", POD_ALERT, fleet(**{"llm/p1": GPU_POD}),
     GateState(cordoned_nodes=frozenset({"node-z"})), replace(MOVING, escalate_within=1800.0),
     Effects(workload="llm/p1", hold="cordon_limit")),
    ("the backoff streak goes on", ALERT, FLEET, GateState(backoff={"a": (2, T0 - 1800)}), POLICY,
     Effects(intent=True, workload="a", backoff=(3, T0))),
    ("the backoff streak starts again after a quiet reset_after", ALERT, FLEET,
     GateState(backoff={"a": (5, T0 - 12 * 3600)}), POLICY, Effects(intent=True, workload="a", backoff=(1, T0))),
    ("backoff off: no streak kept", ALERT, FLEET, JOURNAL, replace(POLICY, backoff_initial=0),
     Effects(intent=True, workload="a")),
    ("ladder: paged already, held", POD_ALERT, fleet(**{"llm/p1": DEPLOYED}),
     GateState(ladder={DEPLOYMENT: ("page", T0 - 60)}), LADDERED, Effects(workload=DEPLOYMENT, hold="escalated_to_human")),
    ("a group's restart counts once, against the group", replace(ALERT, labels=labels(target="llm/g1")),
     fleet(**{f"llm/g{i}": replace(POD, pod=f"g{i}", pod_uid=f"ug{i}", workload=GROUP) for i in range(3)}),
     JOURNAL, TEMPLATED, Effects(intent=True, workload=GROUP, backoff=(1, T0))),
]


@pytest.mark.parametrize("alert, fleet_view, journal, policy, expected", [c[1:] for c in EFFECT_CASES],
                         ids=[c[0] for c in EFFECT_CASES])
def test_effects_of_a_decision(alert, fleet_view, journal, policy, expected):
    decision = decide(alert, fleet_view, journal, policy, T0)
    assert effects_of(decision, alert, fleet_view, journal, policy, T0) == expected
    assert bool(expected) == (expected != Effects(workload=expected.workload))


@pytest.mark.parametrize("status, group", [
    (replace(POD, workload="LeaderWorkerSet/llm/big/0"), Group("llm", "big", "0")),
    (replace(POD, workload="LeaderWorkerSet/llm/big/12"), Group("llm", "big", "12")),
    (replace(POD, workload="Deployment/llm/big"), None),
    (replace(POD, workload="LeaderWorkerSet/dev/big/0"), None),  # not the pod's own namespace
    (replace(POD, workload="LeaderWorkerSet/llm/big"), None),
    (replace(POD, workload="LeaderWorkerSet/llm//0"), None),
    (replace(POD, workload=None), None),
    (TargetStatus("stuck", OLD, workload="LeaderWorkerSet/llm/big/0"), None),  # not a pod: nothing to list
], ids=["group", "two-digit index", "deployment", "other namespace", "no index", "no name", "older exporter",
        "static target"])
def test_a_group_is_a_leaderworkerset_workload_of_a_pod_in_its_namespace(status, group):
    assert status.group == group
    if group is not None:
        assert group.selector == "leaderworkerset.sigs.k8s.io/name=big,leaderworkerset.sigs.k8s.io/group-index=" + group.index


@pytest.mark.parametrize("ladder, now, step", [
    ({}, T0, "restart"),
    ({"w": ("restart", T0 - 10)}, T0, "cordon_and_move"),  # on the node the restart left it on (n1)
    ({"w": ("cordon_and_move", T0 - 10)}, T0, "page"),
    ({"w": ("page", T0 - 10)}, T0, "page"),
    ({"w": ("restart", T0 - 600)}, T0, "restart"),  # escalate_within (600 s) has passed: a new cycle
    ({"w": ("page", T0 - 600)}, T0, "restart"),
    ({"w": ("something newer", T0 - 10)}, T0, "restart"),
    ({"v": ("cordon_and_move", T0 - 10)}, T0, "restart"),
])
def test_the_ladder_takes_the_next_step_within_escalate_within(ladder, now, step):
    policy = replace(POLICY, escalate_within=600.0)
    neighbour = {"x": ("restart", T0 - 5)}  # another workload restarted on n1 meanwhile: the node's own evidence
    state = GateState(ladder={**ladder, **neighbour}, ladder_nodes={w: "n1" for w in {**ladder, **neighbour}})
    assert ladder_step(state, policy, "w", now, "n1") == step
    assert ladder_step(state, POLICY, "w", now, "n1") == "restart"  # the ladder off


@pytest.mark.parametrize("recorded, node, step", [
    ("n1", "n1", "cordon_and_move"),
    ("n1", "n2", "page"),  # the hang followed the software to another node
    ("n1", None, "page"),  # a static target, or no node known now
    (None, "n1", "page"),  # a step recorded without a node (an older state) is no evidence
])
def test_the_ladder_cordons_only_the_node_the_hang_came_back_on(recorded, node, step):
    nodes = ({"w": recorded} if recorded else {}) | {"x": "n1"}
    state = GateState(ladder={"w": ("restart", T0 - 10), "x": ("restart", T0 - 20)}, ladder_nodes=nodes)
    assert ladder_step(state, replace(POLICY, escalate_within=600.0), "w", T0, node) == step


@pytest.mark.parametrize("others, suspect", [
    ({}, None),  # the workload alone hung again on its node: a pinned pod's own bug, not the node's
    ({"x": ("restart", T0 - 300, "n1")}, "x"),  # another workload was restarted on n1 meanwhile
    ({"x": ("cordon_and_move", T0 - 300, "n1")}, "x"),  # ... or moved off it
    ({"x": ("restart", T0 - 600, "n1")}, None),  # longer ago than escalate_within (600 s)
    ({"x": ("restart", T0 - 300, "n2")}, None),  # on another node
    ({"x": ("page", T0 - 300, None)}, None),  # a page acts on no node
    ({"w": ("restart", T0 - 300, "n1")}, None),  # the workload's own step is not another's
])
def test_a_node_is_suspect_only_where_another_workload_hung_on_it_within_escalate_within(others, suspect):
    ladder = {w: (step, at) for w, (step, at, _) in others.items()}
    nodes = {w: node for w, (_, _, node) in others.items() if node}
    state = GateState(ladder=ladder, ladder_nodes=nodes)
    assert node_suspect(state, replace(POLICY, escalate_within=600.0), "w", "n1", T0) == suspect
    assert node_suspect(state, POLICY, "w", "n1", T0) is None  # the ladder off


@pytest.mark.parametrize("restarts, delay", [(0, 0), (1, 900), (2, 1800), (3, 3600), (4, 7200), (5, 14400), (6, 14400),
                                             (10**6, 14400)])
def test_the_backoff_doubles_up_to_its_cap(restarts, delay):
    assert backoff_delay(POLICY, restarts) == delay


def test_an_allowed_restart_says_when_nothing_could_show_a_restart_since_the_alert():
    """Before: no process start time and no restart seen skipped the check in silence."""
    blind = decide(ALERT, fleet(a=TargetStatus("stuck", None)), JOURNAL, POLICY, T0)
    assert blind.allowed and "no process start time" in blind.detail
    seen = decide(ALERT, fleet(a=TargetStatus("stuck", STARTS - 3600)), JOURNAL, POLICY, T0)
    assert seen.allowed and seen.detail == ""


def test_a_degraded_replica_moved_off_a_suspect_node_says_why_and_taints_it_as_such():
    decision = decide(DEGRADED_ALERT, fleet(**{"llm/p1": DEGRADED, "llm/q1": NEIGHBOUR}), JOURNAL, MOVING, T0)
    assert decision.allowed and decision.plan is not None
    assert decision.plan.action == "cordon_and_move" and decision.plan.node == "node-a"
    assert decision.plan.taint == "PaceDegraded" and "degraded beside its peers" in (decision.plan.cause or "")
    assert f"where {OTHER} (degraded there) too" in decision.detail
    alone = decide(DEGRADED_ALERT, fleet(**{"llm/p1": DEGRADED}), JOURNAL, MOVING, T0)
    assert "degraded alone never restarts or moves anything" in alone.detail
