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

It fills the `NodeCache` (llm_vitals/exporter/gpu_faults/node.py: a small view of each node, its
conditions and taints) and writes nothing else: the `node` GPU-fault source reads the cache for
each target at each poll, so the poller's aggregate is the one writer of a target's node fault, and
a target discovered on an already faulty node is flagged within a poll.

`NodeWatchRunner` follows the config: started when a target names a node or pods are discovered,
stopped when a reload leaves none (its cache emptied, so no target keeps a node fault from it),
and started again on another kubeconfig. The rules live with the source (a reload gives the
poller's source the new rules at once).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from llm_vitals.config import KubeAccess
from llm_vitals.exporter.gpu_faults.node import NodeCache, NodeView, node_view
from llm_vitals.kube.client import KubeClient
from llm_vitals.kube.errors import ApiError, KubeError
from llm_vitals.kube.informer import Health, Informer
from llm_vitals.kube.objects import Query
from llm_vitals.logs import log_event

log = logging.getLogger("llm_vitals.exporter")

RBAC_HINT = "the exporter needs a ClusterRole with list and watch on nodes (deploy/kubernetes/base/exporter.yaml)"


__all__ = ["NodeCache", "NodeView", "NodeWatch", "NodeWatchRunner", "node_view"]


class NodeWatch:
    """An informer on all Nodes, kept in the cache (the `node` source reads it at each poll)."""

    def __init__(self, cache: NodeCache, kube: KubeClient) -> None:
        self.cache = cache
        self.kube = kube
        self.informer: Informer[NodeView] = Informer(kube, Query("nodes"), node_view, self._changed,
                                                     on_health=self._health)

    @property
    def relists(self) -> int:
        """Lists after the first: after a 410 Gone or a failure."""
        return self.informer.relists

    async def run(self) -> None:
        """Until cancelled: never raises for API trouble, which is kept in the cache and logged once per change."""
        try:
            await self.informer.run()
        finally:
            await self.kube.close()

    def _changed(self, name: str | None) -> None:
        self.cache.nodes = self.informer.objects  # a list replaces the dict; an event changes it in place
        self.cache.synced = self.informer.synced

    def _health(self, health: Health) -> None:
        self._set_error(None if health.up or health.error is None else nodes_error(health.error))

    def _set_error(self, error: str | None) -> None:
        if error != self.cache.error:
            if error:
                log_event(log, "node watch failing", logging.WARNING, error=error)
            else:
                log_event(log, "node watch working", logging.INFO, nodes=len(self.cache.nodes))
            self.cache.error = error


def nodes_error(error: KubeError) -> str:
    """Why nodes cannot be listed or watched, in one sentence; a 401/403 names the right the exporter lacks."""
    if not isinstance(error, ApiError):
        return str(error)  # the API server cannot be reached, a kubeconfig that cannot be used
    if error.status in (401, 403):
        return f"HTTP {error.status} {error.reason} listing nodes: {RBAC_HINT}".replace("  ", " ")
    return f"HTTP {error.status} {error.reason} listing nodes: {error.message}".replace("  ", " ")


class NodeWatchRunner:
    """The one node watch, as the current config wants it: `follow(settings.node_watch_access())` at start and
    after each reload."""

    def __init__(self, cache: NodeCache, client: Callable[[KubeAccess], KubeClient] = KubeClient) -> None:
        self.cache = cache
        self.client = client
        self.watch: NodeWatch | None = None
        self._task: asyncio.Task[None] | None = None
        self._access: KubeAccess | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    async def follow(self, access: KubeAccess | None) -> None:
        """Start, stop (None: the config needs no watch) or restart (another API server) the watch."""
        if self._task is not None and access != self._access:
            await self.stop()
        if access is None:
            return
        if self.watch is None or self._task is None:
            self._access = access
            self.watch = NodeWatch(self.cache, self.client(access))
            self._task = asyncio.create_task(self.watch.run(), name="node-watch")
            log_event(log, "node watch started", logging.INFO)

    async def stop(self) -> None:
        """Stop the watch and forget what it saw: no target keeps a node fault (or error) from it at its next poll."""
        task, self._task, self.watch = self._task, None, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        self.cache.nodes, self.cache.synced, self.cache.error = {}, False, None
        log_event(log, "node watch stopped", logging.INFO)
