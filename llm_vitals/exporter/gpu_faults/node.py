"""The `node` source: the Kubernetes node's conditions and taints, as the node watch last saw them.

llm_vitals/exporter/gpu_faults/node_watch.py lists and watches the nodes and fills a `NodeCache`; it writes
nothing else. This source reads the cache for each target at each poll (no I/O) and judges it with
the pure rule `node_fault`: the poller's aggregate is the one writer of a target's node fault, and
a target discovered on an already faulty node is flagged within a poll.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llm_vitals.exporter.gpu_faults import GpuFault, GpuTarget, NodeRules, SourceRead, node_fault


@dataclass(frozen=True)
class NodeView:
    """What the GPU-fault rule reads of a Node: its conditions and taints, as plain dicts."""

    conditions: tuple[Mapping[str, Any], ...] = ()
    taints: tuple[Mapping[str, Any], ...] = ()


def node_view(node: Mapping[str, Any]) -> NodeView:
    """A Node, as the API server's JSON, as a NodeView."""
    status, spec = node.get("status") or {}, node.get("spec") or {}
    return NodeView(tuple(status.get("conditions") or ()), tuple(spec.get("taints") or ()))


@dataclass
class NodeCache:
    """The nodes as last listed or watched, and why the watch is not working (None when it is)."""

    nodes: dict[str, NodeView] = field(default_factory=dict)
    synced: bool = False  # a list has succeeded at least once
    error: str | None = None

    def fault_for(self, name: str, rules: NodeRules) -> tuple[GpuFault | None, str | None]:
        """(fault or None, error or None) for the node `name`; an unknown node is an error, never a fault."""
        view = self.nodes.get(name)
        if view is None:
            if not self.synced:
                return None, self.error or "the node watch has not listed the nodes yet"
            return None, self.error or f"node {name} not found in the API server"
        return node_fault(name, view.conditions, view.taints, rules), self.error


class NodeSource:
    """The `node` source (FaultSource): the cache, judged by the rules of the current config."""

    name = "node"

    def __init__(self, cache: NodeCache | None, rules: NodeRules) -> None:
        self.cache = cache  # None while no node watch runs (no target names a node)
        self.rules = rules

    def wants(self, target: GpuTarget) -> bool:
        return target.node is not None and self.cache is not None

    async def read(self, target: GpuTarget, before: SourceRead) -> SourceRead:
        assert self.cache is not None and target.node is not None  # wants() said so
        return SourceRead(*self.cache.fault_for(target.node, self.rules))

    def release(self, target: GpuTarget) -> None:
        """Nothing held: a node condition or taint is read as it is."""
