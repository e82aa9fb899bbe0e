"""The transport of a coordination.k8s.io/v1 Lease: read it, create it, replace it with its resourceVersion.

What the Lease holds and how a conflict is resolved is the caller's (the remediator's shared
state); this says only whether the write won: a 409 (a stale `resourceVersion`, or a Lease that
another replica created meanwhile) is `False`, every other failure a `KubeError`. Each answer
comes with the API server's time (`Dated`): replicas judge what they share by that one clock.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client import CoordinationV1Api

from .client import Dated, KubeClient
from .errors import ApiError
from .objects import as_json


class LeaseTransport:
    """Leases through the shared client, as JSON dicts."""

    def __init__(self, kube: KubeClient):
        self.kube = kube

    async def get_lease(self, namespace: str, name: str) -> Dated[dict[str, Any] | None]:
        """The Lease, or None when there is none of that name."""
        try:
            answer = await self.kube.call_dated(
                lambda api, options: CoordinationV1Api(api).read_namespaced_lease(name, namespace, **options))
        except ApiError as exc:
            if exc.status == 404:
                return Dated(None, None)
            raise
        return Dated(answer.value, answer.server_time)

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> Dated[bool]:
        """Create the Lease `body`; False when one of its name exists already (409)."""
        try:
            answer = await self.kube.call_dated(
                lambda api, options: CoordinationV1Api(api).create_namespaced_lease(namespace, as_json(body), **options))
        except ApiError as exc:
            if exc.status == 409:
                return Dated(False, None)
            raise
        return Dated(True, answer.server_time)

    async def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> Dated[bool]:
        """Replace the Lease with `body` (carrying the resourceVersion it was read at); False on a conflict (409)."""
        try:
            answer = await self.kube.call_dated(
                lambda api, options: CoordinationV1Api(api).replace_namespaced_lease(name, namespace, as_json(body), **options))
        except ApiError as exc:
            if exc.status == 409:
                return Dated(False, None)
            raise
        return Dated(True, answer.server_time)
