"""The escalation ladder, per workload: restart, then cordon and move, then page a human.

A workload stuck again within `escalate_within` of its last step takes the next one; what makes the
ladder cordon a node is evidence against that node (`node_suspect`), never one workload hanging again
on it alone. `page_detail` is what a human reads when it pages.
"""

from __future__ import annotations

from typing import Literal

from .model import FleetView, GateState, TargetStatus, workload_of
from .policy import GatePolicy

# The escalation ladder, per workload (NodeHealthCheck's escalating remediations): a workload stuck
# again within `escalate_within` of its last step takes the next one. `page` is a refusal, and it
# holds (`GateState.pages`) until a human releases the workload: Alertmanager's re-sends of the
# alert, or a new alert once `escalate_within` has passed, never start the ladder over.
# The ladder's cordon is evidence about a node: it is taken only when the hang came back on the node
# the restart left it on (`GateState.ladder_nodes`) *and* another workload's pod was restarted or
# moved on that node within `escalate_within` too (`node_suspect`). A pinned pod (a StatefulSet's, a
# LeaderWorkerSet group's, any pod held by its model cache) comes back on its node by design, so its
# own bug hanging it again there says nothing about the node; two workloads hanging on one node do.
# A hang that comes back on another node, or on the same node alone, pages.
Step = Literal["restart", "cordon_and_move", "page"]
LADDER: tuple[Step, ...] = ("restart", "cordon_and_move", "page")


def ladder_step(journal: GateState, policy: GatePolicy, workload: str, now: float, node: str | None = None,
                fleet: FleetView | None = None) -> Step:
    """The ladder's next step for `workload`, whose stuck pod is on `node` now: within `escalate_within`
    of a restart, `cordon_and_move` when the hang came back on the node the restart left it on and that
    node is suspect on its own (`node_suspect`), else `page`; after a move, `page`. Outside
    `escalate_within` (or with the ladder off): `restart`. A held page is not the ladder's to end (checks.py `paged`)."""
    last = journal.ladder.get(workload)
    if policy.escalate_within is None or last is None or now - last[1] >= policy.escalate_within:
        return "restart"
    if last[0] == "restart":
        same_node = node is not None and journal.ladder_nodes.get(workload) == node
        return "cordon_and_move" if same_node and node_suspect(journal, policy, workload, node, now, fleet) else "page"
    if last[0] in ("cordon_and_move", "page"):
        return "page"
    return "restart"


def node_suspect(journal: GateState, policy: GatePolicy, workload: str, node: str | None, now: float,
                 fleet: FleetView | None = None) -> str | None:
    """Another workload whose last ladder step (a restart or a move) acted on a pod on `node` within
    `escalate_within` of `now`, or (in `fleet`, as the exporter sees it now) whose replica on `node`
    is degraded beside its peers or has a GPU fault; None: the node has no evidence of its own. One
    workload hanging again on its node is not: its pod may be pinned there (a StatefulSet's, a
    LeaderWorkerSet group's), and then its own bug comes back on that node whatever the node is worth;
    one replica degraded alone may be its own fault too."""
    if node is None:
        return None
    for name, status in sorted((fleet.targets if fleet is not None else {}).items()):
        other = workload_of(name, status)
        if status.node == node and other != workload and (status.degraded or status.gpu_fault):
            return f"{other} ({'a GPU fault' if status.gpu_fault else 'degraded'} there)"
    if policy.escalate_within is None:
        return None
    for other, (step, at) in sorted(journal.ladder.items()):
        if (other != workload and step in ("restart", "cordon_and_move") and now - at < policy.escalate_within
                and journal.ladder_nodes.get(other) == node):
            return other
    return None


def page_detail(journal: GateState, workload: str, status: TargetStatus) -> str:
    """Why the ladder pages: what its last step was, and where the hang came back."""
    last = (journal.ladder.get(workload) or ("",))[0]
    if last == "restart" and status.node is not None and journal.ladder_nodes.get(workload) == status.node:
        return (f"{workload} is stuck again within escalate_within of its restart, on the same node {status.node},"
                " and no other workload hung there: a pod pinned to its node comes back there by design, so this"
                " is no evidence against the node (it is not cordoned); a human must look")[:500]
    if last == "restart":
        was = journal.ladder_nodes.get(workload)
        where = f"on node {status.node}" if status.node else "with no node known"
        before = f"node {was}" if was else "an unknown node"
        return (f"{workload} is stuck again within escalate_within of its restart on {before}, now {where}: a hang"
                " that follows the software across nodes is no node's fault; a human must look")[:500]
    return f"{workload} is stuck again within escalate_within of its last step ({last}): a human must look"[:500]
