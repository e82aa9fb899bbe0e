"""Every reason a decision can give, and which of them hold a stuck target back on purpose.

The reason is the `llm_vitals_remediator_decisions_total{reason}` label, the journal's word and,
for a hold, the backstop's word (gate_word.py): the alert rules and dashboards read these names.
"""

from __future__ import annotations

from typing import Literal, get_args

# The `reason` of every decision: the `..._decisions_total{reason}` label and the journal's word.
Reason = Literal[
    "not_firing",
    "no_restart_label",
    "unknown_target",
    "duplicate",
    "paused",
    "state_unreachable",
    # The shared state is gone or unreadable (a Lease deleted, an annotation not ours): nothing is
    # restarted until a human re-initialises it (POST /api/v1/state/reinit).
    "state_lost",
    "exporter_unreachable",
    # The pod the exporter names is not the target's at the API server (identity.py), or its owner
    # cannot be read now, or the API server could not be asked.
    "identity_mismatch",
    "owner_pending",
    "identity_unverified",
    "unknown_verdict",
    "not_stuck",
    "restarted_since_alert",
    "no_pod_uid",
    "gpu_fault",
    "escalated_to_human",
    "restart_in_progress",
    "cooldown",
    "storm_cooldown",
    "circuit_open",
    "fleet_gate",
    "dry_run",
    "allowed",
    "cordon_and_move",
    # A cordon the ladder or a GPU fault calls for, refused: max_cordoned_nodes are cordoned and unreleased.
    "cordon_limit",
    # The workload was restarted lately, and its growing backoff has not passed (slow loops).
    "backoff",
    # Not the gate's: the API server refused an allowed eviction (a PodDisruptionBudget, 429).
    "disruption_budget",
    # Not the gate's: the API server throttled an allowed eviction (429 without a disruption budget).
    "api_throttled",
]
REASONS: tuple[Reason, ...] = get_args(Reason)
# Reasons that come after the gate allowed, from what acting met (acting.py), never from `decide`.
AFTER_GATE: frozenset[Reason] = frozenset({"disruption_budget", "api_throttled"})
# Reasons the loop gives from what its edges met before the gate could decide (loop.py: the state is
# lost, the pod the exporter names is not confirmed by the API server), never from `decide`.
AT_EDGE: frozenset[Reason] = frozenset({"state_lost", "identity_mismatch", "owner_pending", "identity_unverified"})
# Refusals a human must see on the pod itself (as a Kubernetes Event).
HUMAN_REFUSALS = frozenset({"gpu_fault", "circuit_open", "fleet_gate", "escalated_to_human", "disruption_budget",
                            "cordon_limit"})

# Refusals that leave a stuck target unhandled on purpose (the checks' reasons): the target is kept in
# `JournalState.held`, its workload's backstop holds, and the remediator re-decides it when the hold ends.
# The API server's refusals of an allowed restart (AFTER_GATE: a PodDisruptionBudget, throttling) hold it too.
HOLDING: frozenset[Reason] = frozenset({"paused", "escalated_to_human", "gpu_fault", "cordon_limit",
                                        "restart_in_progress", "cooldown", "circuit_open", "backoff", "fleet_gate",
                                        "storm_cooldown", "disruption_budget", "api_throttled"})
# Decisions that end a target's hold: it was acted on, or is no longer a hang the gate may act on.
UNHOLDING: frozenset[Reason] = frozenset({"allowed", "cordon_and_move", "dry_run", "duplicate", "not_firing",
                                          "not_stuck", "restarted_since_alert", "unknown_target", "no_restart_label",
                                          "no_pod_uid"})
