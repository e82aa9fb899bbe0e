"""The node watch: lists and then watches the cluster's Nodes, so each Kubernetes target knows its node's GPU fault.

One list-then-watch of all nodes (an informer's shape), not one watch per target's node: a fleet of
500 pods on 60 nodes is one stream. It needs a ClusterRole with `list` and `watch` on `nodes`
(deploy/kubernetes/base/exporter.yaml; no `get`: it never reads one node by name); without it every
target with a node shows the 403 in `gpu_fault_errors.node`, and no fault is ever inferred from it.

Each watch the server ends (every WATCH_SECONDS) is resumed from the last `resourceVersion`; a
410 Gone (compacted) relists. A failure (a lost API server, a 403) is retried with a capped backoff
by a fresh list; what was last seen of a node stays meanwhile (a node condition does not clear
because the API server is away), and the error is shown next to it.

`NodeCache` holds a small view of each node (conditions, taints) and `apply` turns it into each
record's `node_fault` through the pure rule `exporter.gpu_faults.node_fault`; the poller applies it
to its target on every poll, so a target discovered on an already faulty node is flagged within a poll.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from llm_vitals.exporter.gpu_faults import NodeRules, node_fault
from llm_vitals.exporter.kube import KubeConfigError
from llm_vitals.exporter.state import TargetRecord, log_gpu_fault_change
from llm_vitals.logs import log_event

log = logging.getLogger("llm_vitals.exporter")

WATCH_SECONDS = 300  # the server ends each watch after this; it is then resumed from the last resourceVersion
BACKOFF_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
RBAC_HINT = "the exporter needs a ClusterRole with list and watch on nodes (deploy/kubernetes/base/exporter.yaml)"


@dataclass(frozen=True)
class NodeView:
    """What the GPU-fault rule reads of a Node: its conditions and taints, as plain dicts."""

    conditions: tuple[Mapping[str, Any], ...] = ()
    taints: tuple[Mapping[str, Any], ...] = ()


def node_view(node: Any) -> NodeView:
    """A kubernetes-asyncio V1Node (or its JSON dict) as a NodeView."""
    if isinstance(node, Mapping):
        status, spec = node.get("status") or {}, node.get("spec") or {}
        return NodeView(tuple(status.get("conditions") or ()), tuple(spec.get("taints") or ()))
    conditions = (node.status.conditions or []) if node.status else []
    taints = (node.spec.taints or []) if node.spec else []
    return NodeView(
        tuple({"type": c.type, "status": c.status, "reason": c.reason, "message": c.message} for c in conditions),
        tuple({"key": t.key, "value": t.value, "effect": t.effect} for t in taints),
    )


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
        record.node_fault, error = self.fault_for(name, rules)
        if error is None:
            record.gpu_fault_errors.pop("node", None)
        else:
            record.gpu_fault_errors["node"] = error


def wants_node_watch(records: Iterable[TargetRecord]) -> bool:
    """Whether any target names a node (only then is the API server asked at all)."""
    return any(record.settings.node for record in records)


class NodeWatch:
    """List, then watch, all Nodes; after each change, apply the cache to every record."""

    def __init__(self, cache: NodeCache, rules: NodeRules, records: Callable[[], Iterable[TargetRecord]],
                 api: Callable[[], Awaitable[client.ApiClient]], request_timeout: float = 30.0,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.cache = cache
        self.rules = rules
        self.records = records
        self.api = api
        self.request_timeout = request_timeout
        self.sleep = sleep
        self.resource_version: str | None = None
        self.relists = 0  # lists after the first: a 410 Gone, or a reconnect without a resourceVersion

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
        failures = 0
        api_client: client.ApiClient | None = None
        try:
            while True:
                try:
                    if api_client is None:
                        api_client = await self.api()
                    await self._list_and_watch(client.CoreV1Api(api_client))
                    failures = 0
                    continue
                except asyncio.CancelledError:
                    raise
                except ApiException as exc:
                    if exc.status == 410:
                        self.resource_version = None  # compacted: relist
                        continue
                    error = _api_error(exc)
                except KubeConfigError as exc:
                    error = str(exc)
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    error = f"the API server cannot be reached: {type(exc).__name__}: {exc}"[:300]
                except Exception as exc:  # a bug here must not end the watch for good
                    log.exception("node watch failed unexpectedly")
                    error = f"node watch failed: {type(exc).__name__}"
                # After a failure, list again rather than resume the watch: a quiet watch that
                # reconnects sends nothing that would show it works again, and a list does (and
                # catches whatever changed meanwhile).
                self.resource_version = None
                self._set_error(error)
                await self.sleep(BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)])
                failures += 1
        finally:
            if api_client is not None:
                await api_client.close()

    async def _list_and_watch(self, core: client.CoreV1Api) -> None:
        if self.resource_version is None:
            listed = await core.list_node(_request_timeout=self.request_timeout)
            if self.cache.synced:
                self.relists += 1
            self.cache.nodes = {item.metadata.name: node_view(item) for item in listed.items}
            self.cache.synced = True
            self.resource_version = listed.metadata.resource_version
            self._set_error(None)
            self.apply_all()
        stream = watch.Watch()
        async with stream.stream(core.list_node, resource_version=self.resource_version,
                                 timeout_seconds=WATCH_SECONDS, allow_watch_bookmarks=True,
                                 _request_timeout=WATCH_SECONDS + self.request_timeout) as events:
            async for event in events:
                kind, node = event["type"], event["object"]
                self.resource_version = node.metadata.resource_version
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    self.cache.nodes.pop(node.metadata.name, None)
                else:
                    self.cache.nodes[node.metadata.name] = node_view(node)
                if self.cache.error is not None:
                    self._set_error(None)  # applies to every record
                else:
                    self.apply_all(node.metadata.name)

    def _set_error(self, error: str | None) -> None:
        if error != self.cache.error:
            if error:
                log_event(log, "node watch failing", logging.WARNING, error=error)
            else:
                log_event(log, "node watch working", logging.INFO, nodes=len(self.cache.nodes))
            self.cache.error = error
            self.apply_all()


def _api_error(exc: ApiException) -> str:
    if exc.status in (401, 403):
        return f"HTTP {exc.status} {exc.reason or ''} listing nodes: {RBAC_HINT}".replace("  ", " ")
    return f"HTTP {exc.status} {exc.reason or ''} listing nodes".strip()
