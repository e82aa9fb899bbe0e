"""The node watch: lists and then watches the cluster's Nodes, so each Kubernetes target knows its node's GPU fault.

One list-then-watch of all nodes, not one watch per target's node: a fleet of 500 pods on 60 nodes
is one stream. It runs on the one informer of `llm_vitals.kube` (shared with pod discovery): the
watch is resumed from the last `resourceVersion` (bookmarks included) when the server ends it, a 410
Gone relists after client-go's jittered backoff, and a failure (a lost API server, a 403) is retried
with that backoff too. It needs a ClusterRole with `list` and `watch` on `nodes`
(deploy/kubernetes/base/exporter.yaml; no `get`: it never reads one node by name); without it every
target with a node shows the 403 in `gpu_fault_errors.node`, and no fault is ever inferred from it.
What was last seen of a node stays meanwhile (a node condition does not clear because the API
server is away), and the error is shown next to it.

`NodeCache` holds a small view of each node (conditions, taints) and `apply` turns it into each
record's `node_fault` through the pure rule `exporter.gpu_faults.node_fault`; the poller applies it
to its target on every poll, so a target discovered on an already faulty node is flagged within a poll.

`NodeWatchRunner` follows the config: started when a target names a node or pods are discovered,
stopped when a reload leaves none, started again on another kubeconfig, and given a reload's new
rules at once (the poller gets the same rules at the same moment, so the two never disagree).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_vitals.exporter.gpu_faults import NodeRules, node_fault
from llm_vitals.exporter.settings import ExporterSettings
from llm_vitals.exporter.state import TargetRecord, log_gpu_fault_change
from llm_vitals.kube.client import KubeClient
from llm_vitals.kube.connect import Access
from llm_vitals.kube.errors import ApiError, KubeError
from llm_vitals.kube.informer import Health, Informer
from llm_vitals.kube.objects import Query
from llm_vitals.logs import log_event

log = logging.getLogger("llm_vitals.exporter")

RBAC_HINT = "the exporter needs a ClusterRole with list and watch on nodes (deploy/kubernetes/base/exporter.yaml)"


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

    def fault_for(self, name: str, rules: NodeRules):
        """(fault or None, error or None) for the node `name`; an unknown node is an error, never a fault."""
        view = self.nodes.get(name)
        if view is None:
            if not self.synced:
                return None, self.error or "the node watch has not listed the nodes yet"
            return None, self.error or f"node {name} not found in the API server"
        return node_fault(name, view.conditions, view.taints, rules), self.error

    def apply(self, record: TargetRecord, rules: NodeRules) -> None:
        """Set the record's node fault and node error from the cache (no I/O)."""
        name = record.settings.node
        if name is None:
            return
        record.set_node_fault(*self.fault_for(name, rules))


def wants_node_watch(records: Iterable[TargetRecord]) -> bool:
    """Whether any target names a node (only then is the API server asked at all)."""
    return any(record.settings.node for record in records)


def node_watch_wanted(settings: ExporterSettings) -> bool:
    """Whether a config needs the node watch: a static target names a node, or pods are discovered."""
    return any(target.node for target in settings.targets) or any(entry.kubernetes for entry in settings.discovery)


def node_watch_kubeconfig(settings: ExporterSettings) -> Path | None:
    """The node watch's API server: the gpu_faults section's kubeconfig, else pod discovery's, else in-cluster."""
    return settings.gpu_faults.kubeconfig or next(
        (entry.kubernetes.kubeconfig for entry in settings.discovery if entry.kubernetes), None)


class NodeWatch:
    """An informer on all Nodes; after each change, the cache is applied to the records on that node (or all)."""

    def __init__(self, cache: NodeCache, rules: NodeRules, records: Callable[[], Iterable[TargetRecord]],
                 kube: KubeClient) -> None:
        self.cache = cache
        self.rules = rules
        self.records = records
        self.kube = kube
        self.informer: Informer[NodeView] = Informer(kube, Query("nodes"), node_view, self._changed,
                                                     on_health=self._health)

    @property
    def relists(self) -> int:
        """Lists after the first: after a 410 Gone or a failure."""
        return self.informer.relists

    def apply_all(self, node: str | None = None) -> None:
        """Apply the cache to every record (or to those on `node` only) and log each fault that changes."""
        for record in list(self.records()):
            if node is not None and record.settings.node != node:
                continue
            before = record.gpu_fault
            self.cache.apply(record, self.rules)
            log_gpu_fault_change(record, before)

    async def run(self) -> None:
        """Until cancelled: never raises for API trouble, which is kept in the cache and logged once per change."""
        try:
            await self.informer.run()
        finally:
            await self.kube.close()

    def _changed(self, name: str | None) -> None:
        self.cache.nodes = self.informer.objects  # a list replaces the dict; an event changes it in place
        self.cache.synced = self.informer.synced
        self.apply_all(name)

    def _health(self, health: Health) -> None:
        self._set_error(None if health.up or health.error is None else nodes_error(health.error))

    def _set_error(self, error: str | None) -> None:
        if error != self.cache.error:
            if error:
                log_event(log, "node watch failing", logging.WARNING, error=error)
            else:
                log_event(log, "node watch working", logging.INFO, nodes=len(self.cache.nodes))
            self.cache.error = error
            self.apply_all()


def nodes_error(error: KubeError) -> str:
    """Why nodes cannot be listed or watched, in one sentence; a 401/403 names the right the exporter lacks."""
    if not isinstance(error, ApiError):
        return str(error)  # the API server cannot be reached, a kubeconfig that cannot be used
    if error.status in (401, 403):
        return f"HTTP {error.status} {error.reason} listing nodes: {RBAC_HINT}".replace("  ", " ")
    return f"HTTP {error.status} {error.reason} listing nodes: {error.message}".replace("  ", " ")


class NodeWatchRunner:
    """The one node watch, as the current config wants it: `follow(settings)` at start and after each reload."""

    def __init__(self, cache: NodeCache, records: Callable[[], Iterable[TargetRecord]],
                 client: Callable[[Path | None], KubeClient] = lambda kubeconfig: KubeClient(Access(kubeconfig=kubeconfig))
                 ) -> None:
        self.cache = cache
        self.records = records
        self.client = client
        self.watch: NodeWatch | None = None
        self._task: asyncio.Task[None] | None = None
        self._kubeconfig: Path | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    async def follow(self, settings: ExporterSettings) -> None:
        """Start, stop, restart (another kubeconfig) or re-rule the watch to match `settings`."""
        kubeconfig = node_watch_kubeconfig(settings)
        if self._task is not None and (not node_watch_wanted(settings) or kubeconfig != self._kubeconfig):
            await self.stop()
        if not node_watch_wanted(settings):
            return
        rules = settings.gpu_faults.node_rules
        if self.watch is None or self._task is None:
            self._kubeconfig = kubeconfig
            self.watch = NodeWatch(self.cache, rules, self.records, self.client(kubeconfig))
            self._task = asyncio.create_task(self.watch.run(), name="node-watch")
            log_event(log, "node watch started", logging.INFO)
        elif rules != self.watch.rules:
            self.watch.rules = rules
            self.watch.apply_all()  # every target on the new rules now, not at its node's next event

    async def stop(self) -> None:
        """Stop the watch and forget what it saw: no target keeps a node fault (or error) from it."""
        task, self._task, self.watch = self._task, None, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        self.cache.nodes, self.cache.synced, self.cache.error = {}, False, None
        for record in list(self.records()):
            before = record.gpu_fault
            record.set_node_fault(None, None)
            log_gpu_fault_change(record, before)
        log_event(log, "node watch stopped", logging.INFO)
