"""The plan of an allowed decision: what to act on and for how long, worked out once by the gate
(`plan_of`) and carried out as it is by acting.py.

`restart`: the static target's own executor. `restart_pod`: the target's pod, by its UID.
`restart_group`: every pod of its LeaderWorkerSet group, by UID. `cordon_and_move`: cordon and taint
the pod's node (the taint's value says why), then move the pod by its UID.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from llm_vitals.targets import RESTARTABLE_STATES

from .model import Group, TargetStatus
from .policy import DEFAULT_POD_TIMEOUT, GatePolicy, template_index

# The taint value of the ladder's cordon (a GPU fault's is the fault's reason: `taint_value`).
LADDER_TAINT = "LadderEscalation"
DEGRADED_TAINT = "PaceDegraded"

Action = Literal["restart", "restart_pod", "restart_group", "cordon_and_move"]


@dataclass(frozen=True)
class Plan:
    """What an allowed decision does, decided once: the edge (acting.py) carries it out as it is.

    `restart`: the static target's own executor. `restart_pod`: the target's pod, by its UID.
    `restart_group`: every pod of its LeaderWorkerSet group, by UID. `cordon_and_move`: cordon and
    taint `node`, then move the pod by its UID."""

    target: str
    workload: str
    action: Action
    timeout: float  # the executor's
    claim_for: float  # how long the restart may hold the claim: pre_restart's timeout and the executor's
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None
    node: str | None = None
    group: Group | None = None
    taint: str | None = None  # cordon_and_move: the node's taint value
    cause: str | None = None  # cordon_and_move: why, for the node's annotation and Events
    template: int | None = None  # the target_templates entry taking the target; None for a static target


def plan_of(target: str, workload: str, status: TargetStatus, policy: GatePolicy, moving: bool) -> Plan:
    """What an allowed decision acts on, and for how long: worked out once, carried out by acting.py."""
    static = target in policy.targets
    index = None if static else template_index(policy, target, status)
    template = policy.templates[index] if index is not None else None
    if static:
        timeout = policy.target_timeouts.get(target, DEFAULT_POD_TIMEOUT)
        pre = policy.pre_restart_timeouts.get(target, 0.0)
    else:
        timeout = template.timeout if template is not None else DEFAULT_POD_TIMEOUT
        pre = template.pre_restart_timeout if template is not None else 0.0
    if moving:
        # A move acts on the pod whatever the target's executor: the template's timeout, else the default.
        timeout = template.timeout if template is not None else DEFAULT_POD_TIMEOUT
        if status.gpu_fault:
            detail = str(status.raw.get("gpu_fault_detail") or status.gpu_fault_detail or "GPU fault")
            cause, taint = f"GPU fault ({detail})", taint_value(detail)
        elif status.degraded and status.state not in RESTARTABLE_STATES:
            cause, taint = f"{workload} degraded beside its peers on this node", DEGRADED_TAINT
        else:
            cause, taint = f"{workload} stuck again on this node within escalate_within of its restart here", LADDER_TAINT
        return Plan(target, workload, "cordon_and_move", timeout, pre + timeout, status.namespace, status.pod,
                    status.pod_uid, status.node, taint=taint, cause=cause, template=index)
    if static:
        return Plan(target, workload, "restart", timeout, pre + timeout, status.namespace, status.pod, status.pod_uid,
                    status.node)
    group = status.group
    action: Action = "restart_group" if group is not None else "restart_pod"
    return Plan(target, workload, action, timeout, pre + timeout, status.namespace, status.pod, status.pod_uid,
                status.node, group, template=index)


def taint_value(detail: str) -> str:
    """The fault's reason as a taint value (a label value: 63 chars of [A-Za-z0-9_.-], alphanumeric ends)."""
    word = re.sub(r"[^A-Za-z0-9_.-]+", "-", detail.split(":", 1)[0].strip())[:63].strip("-_.")
    return word or "GpuFault"
