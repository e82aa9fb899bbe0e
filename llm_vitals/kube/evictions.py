"""Removing a pod by UID, with one set of rules for what the API server answers; and the Eviction
API as this API server serves it, found once: `policy/v1` (1.22 and later) or `policy/v1beta1`
(1.20, 1.21), read from the core group's resource list, as `kubectl drain` does.

Every eviction and delete of the project goes through `remove_pod`, and what its answer means is
decided once (`judged`, pure), by status, reason and causes, never by the message text:

- 429 with a `DisruptionBudget` cause: a PodDisruptionBudget forbids it; nothing was deleted
  (`disruption_budget`);
- any other 429 (API Priority and Fairness, a rate limit): nothing was done, try again later
  (`api_throttled`), never read as a disruption budget;
- 404: the pod is gone already (`gone`); 409: the UID precondition failed, the name belongs to a
  newer pod (`replaced`): either way the pod that was meant is not there to remove;
- anything else: `failed`.

A failed lookup (the API server away) is tried again at the next eviction; an error answer to it, or
a server that serves no eviction at all, is a `KubeConfigError` naming it (never an `ApiError`, which
callers read as an answer about the pod). The answer, once read, is kept for the process.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from .client import KubeClient
from .errors import ApiError, KubeConfigError
from .objects import delete_pod, evict_pod, served_eviction_version

Outcome = Literal["done", "gone", "replaced", "disruption_budget", "api_throttled", "failed"]
# The cause an eviction's 429 carries when a PodDisruptionBudget refused it (StatusCause `reason`).
DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"


@dataclass(frozen=True)
class Removal:
    """What one eviction or delete of a pod came to, and the sentence that says so."""

    outcome: Outcome
    detail: str

    @property
    def done(self) -> bool:
        return self.outcome == "done"

    @property
    def refused(self) -> str | None:
        """Why the API server refused it outright (nothing was done), or None."""
        return self.outcome if self.outcome in ("disruption_budget", "api_throttled") else None

    @property
    def blocked(self) -> bool:
        """A PodDisruptionBudget forbade the eviction (429): nothing was deleted."""
        return self.outcome == "disruption_budget"

    @property
    def absent(self) -> bool:
        """The pod meant is not there (gone, or its name taken by a newer pod): nothing left to remove."""
        return self.outcome in ("gone", "replaced")


def judged(error: ApiError, evicting: bool, where: str, uid: str) -> Removal:
    """What an error answer to an eviction (or a delete) of `where` by `uid` means (the module docstring)."""
    verb = "evicted" if evicting else "deleted"
    action = "evict" if evicting else "delete"
    if error.status == 429 and evicting and DISRUPTION_BUDGET_CAUSE in error.causes:
        return Removal("disruption_budget", f"the eviction of {where} was refused: {error.message or error};"
                                            f" nothing deleted")
    if error.status == 429:
        return Removal("api_throttled", f"the API server throttled the {action} of {where} (429 {error.reason},"
                                        f" no disruption budget named): nothing {verb}; tried again at the next alert")
    if error.status == 404:
        return Removal("gone", f"{where} is gone already; nothing {verb}")
    if error.status == 409:
        return Removal("replaced", f"{where} has another UID than {uid} now (recreated); nothing {verb}")
    return Removal("failed", f"{action} {where}: {error}")


async def remove_pod(kube: KubeClient, evictions: Evictions | None, namespace: str, name: str, uid: str) -> Removal:
    """Evict (with `evictions`) or delete one pod if it still has `uid`. An error answer becomes a
    Removal; no answer at all (KubeUnavailable, KubeTimeout) or no usable config is raised."""
    where = f"pod {namespace}/{name}"
    try:
        if evictions is not None:
            await evictions.evict(namespace, name, uid)
        else:
            await delete_pod(kube, namespace, name, uid)
    except ApiError as exc:
        return judged(exc, evictions is not None, where, uid)
    return Removal("done", f"{'evicted' if evictions is not None else 'deleted'} {where} (uid {uid})")


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
