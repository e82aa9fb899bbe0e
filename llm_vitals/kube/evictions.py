"""The Eviction API as this API server serves it, found once: `policy/v1` (1.22 and later) or
`policy/v1beta1` (1.20, 1.21), read from the core group's resource list, as `kubectl drain` does.

A failed lookup (the API server away) is tried again at the next eviction; an error answer to it, or
a server that serves no eviction at all, is a `KubeConfigError` naming it (never an `ApiError`, which
callers read as an answer about the pod). The answer, once read, is kept for the process.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .client import KubeClient
from .errors import ApiError, KubeConfigError
from .objects import evict_pod, served_eviction_version


class Evictions:
    """Evicts pods by UID through the shared client, in the eviction version the server serves."""

    def __init__(self, kube: KubeClient):
        self.kube = kube
        self._version: str | None = None
        self._lock = asyncio.Lock()

    async def version(self) -> str:
        """`policy/v1` or `policy/v1beta1`, read once. Raises a KubeError."""
        if self._version is None:
            async with self._lock:
                if self._version is None:
                    try:
                        found = await served_eviction_version(self.kube)
                    except ApiError as exc:  # never read as an answer about the pod (a 404 is not "pod gone")
                        raise KubeConfigError(f"cannot tell which Eviction API the server serves: {exc}") from None
                    if found is None:
                        raise KubeConfigError("the API server serves no pods/eviction subresource")
                    self._version = found
        return self._version

    async def evict(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        """Evict one pod if it still has `uid`. Raises a KubeError (429: a PodDisruptionBudget forbids it)."""
        return await evict_pod(self.kube, namespace, name, uid, await self.version())
