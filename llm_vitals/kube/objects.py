"""The API calls the project makes, one function each: list and watch (for the informer), pods, evictions, Events, nodes.

The informer follows pods, ReplicaSets (whose controller names a pod's Deployment) and nodes.

Each takes the shared `KubeClient`, returns the API server's JSON and raises a `KubeError`; none
judges a status (a 404 or a 409 means something different to each caller).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

from kubernetes_asyncio.client import AppsV1Api, CoreV1Api

from .client import KubeClient, Operation


def as_json(body: dict[str, Any]) -> Any:
    """A JSON body for a generated call typed for its model: it sends a dict as it is (no model round trip)."""
    return cast(Any, body)


@dataclass(frozen=True)
class Query:
    """What an informer follows: pods or ReplicaSets of one namespace (maybe by label selector), or all nodes."""

    resource: str  # "pods" | "replicasets" | "nodes"
    namespace: str | None = None
    label_selector: str | None = None

    def describe(self) -> str:
        where = f" in namespace {self.namespace}" if self.namespace else ""
        return f"{self.resource}{where}" + (f" ({self.label_selector})" if self.label_selector else "")

    def operation(self, **query: Any) -> Operation:
        """The generated list call for this query, with `query` (resource_version, watch, ...) added."""
        if self.label_selector:
            query["label_selector"] = self.label_selector
        if self.resource == "pods" and self.namespace:
            namespace = self.namespace
            return lambda api, options: CoreV1Api(api).list_namespaced_pod(namespace, **query, **options)
        if self.resource == "replicasets" and self.namespace:
            namespace = self.namespace
            return lambda api, options: AppsV1Api(api).list_namespaced_replica_set(namespace, **query, **options)
        if self.resource == "nodes" and self.namespace is None:
            return lambda api, options: CoreV1Api(api).list_node(**query, **options)
        raise ValueError(f"no list call for {self.describe()}")


async def list_objects(kube: KubeClient, query: Query) -> dict[str, Any]:
    """The List (its `items` and `metadata.resourceVersion`), read from etcd (no resourceVersion: the newest)."""
    return await kube.call(query.operation())


@contextlib.asynccontextmanager
async def watch_objects(kube: KubeClient, query: Query, resource_version: str,
                        seconds: int) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
    """A watch from `resource_version`, asking for BOOKMARK events, that the server ends after `seconds`."""
    operation = query.operation(watch=True, resource_version=resource_version, allow_watch_bookmarks=True,
                                timeout_seconds=seconds)
    async with kube.watch(operation, seconds) as events:
        yield events


async def list_pods(kube: KubeClient, namespace: str, label_selector: str) -> list[dict[str, Any]]:
    """The pods of `namespace` matching `label_selector`."""
    listed = await list_objects(kube, Query("pods", namespace, label_selector))
    return list(listed.get("items") or [])


async def delete_pod(kube: KubeClient, namespace: str, name: str, uid: str | None) -> dict[str, Any]:
    """DELETE one pod; with `uid`, only if the pod of that name still has it (else 409: a newer pod took the name)."""
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
    if uid:
        body["preconditions"] = {"uid": uid}
    return await kube.call(lambda api, options: CoreV1Api(api).delete_namespaced_pod(name, namespace, body=as_json(body), **options))


async def served_eviction_version(kube: KubeClient) -> str | None:
    """The group/version of the `pods/eviction` subresource this API server serves (`policy/v1`, or
    `policy/v1beta1` before 1.22), as the core group's resource list names it; None when it serves none."""
    listed = await kube.call(lambda api, options: CoreV1Api(api).get_api_resources(**options))
    for resource in listed.get("resources") or []:
        if isinstance(resource, dict) and resource.get("name") == "pods/eviction":
            group, version = resource.get("group") or "policy", resource.get("version")
            return f"{group}/{version}" if version else None
    return None


async def evict_pod(kube: KubeClient, namespace: str, name: str, uid: str, group_version: str) -> dict[str, Any]:
    """POST an Eviction of one pod, only if it still has `uid` (else 409). The API server refuses one
    that a PodDisruptionBudget forbids with 429, and deletes nothing then."""
    body = {"apiVersion": group_version, "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}}
    return await kube.call(
        lambda api, options: CoreV1Api(api).create_namespaced_pod_eviction(name, namespace, as_json(body), **options))


async def create_event(kube: KubeClient, namespace: str, event: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """POST one core/v1 Event (within `timeout`, else the client's)."""
    return await kube.call(lambda api, options: CoreV1Api(api).create_namespaced_event(namespace, as_json(event), **options),
                           timeout)


async def get_node(kube: KubeClient, name: str) -> dict[str, Any]:
    """GET one Node."""
    return await kube.call(lambda api, options: CoreV1Api(api).read_node(name, **options))


async def merge_patch_node(kube: KubeClient, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch of one Node (a `metadata.resourceVersion` in it makes it conditional: 409 if stale)."""
    merge: dict[str, Any] = {"_content_type": "application/merge-patch+json"}  # the generated call would send a JSON patch
    return await kube.call(lambda api, options: CoreV1Api(api).patch_node(name, as_json(patch), **options, **merge))


async def get_pod(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    """GET one Pod (the remediator's own read of what the exporter names)."""
    return await kube.call(lambda api, options: CoreV1Api(api).read_namespaced_pod(name, namespace, **options))


async def get_replica_set(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    """GET one ReplicaSet (its owner names a pod's Deployment)."""
    return await kube.call(lambda api, options: AppsV1Api(api).read_namespaced_replica_set(name, namespace, **options))
