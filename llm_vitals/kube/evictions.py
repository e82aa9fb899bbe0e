"""Removing a pod by UID, with one set of rules for what the API server answers; and the Eviction
API as this API server serves it, found once: `policy/v1` (1.22 and later) or `policy/v1beta1`
(1.20, 1.21), read from the core group's resource list, as `kubectl drain` does.

Every eviction and delete of the project goes through one `PodRemover` (a pod, by its UID; or pods
in turn, `remove_each`), and what its answer means is decided once (`judged`, pure), by status,
reason and causes, never by the message text:

- 429 with a `DisruptionBudget` cause: a PodDisruptionBudget forbids it; nothing was deleted
  (`disruption_budget`);
- any other 429 (API Priority and Fairness, a rate limit): nothing was done, try again later
  (`api_throttled`), never read as a disruption budget;
- 404: the pod is gone already (`gone`); 409: the UID precondition failed, the name belongs to a
  newer pod (`replaced`): either way the pod that was meant is not there to remove;
- no answer within the client's timeout: `no_answer` (nothing is known to be done);
- anything else: `failed`.

A failed lookup (the API server away) is tried again at the next eviction; an error answer to it, or
a server that serves no eviction at all, is a `KubeConfigError` naming it (never an `ApiError`, which
callers read as an answer about the pod). The answer, once read, is kept for the process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .client import KubeClient
from .errors import ApiError, KubeConfigError, KubeError, KubeTimeout
from .objects import delete_pod, evict_pod, served_eviction_version

Outcome = Literal["done", "gone", "replaced", "disruption_budget", "api_throttled", "no_answer", "failed"]
PodAction = Literal["evict", "delete"]
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


@dataclass(frozen=True)
class PodRef:
    """A pod as the remediator acts on it: by namespace, name and the UID it was seen with (and its node)."""

    namespace: str
    name: str
    uid: str | None
    node: str | None = None


@dataclass
class Sweep:
    """Pods removed in turn: each one's removal so far, and the removal that stopped the sweep (None: all went).

    Kept up to date while the sweep runs, so that a caller whose timeout cut it short still knows what was done.
    """

    passed: list[tuple[PodRef, Removal]] = field(default_factory=list)
    stopped: Removal | None = None

    @property
    def removed(self) -> list[PodRef]:
        """The pods this sweep evicted or deleted (not those found gone or replaced)."""
        return [pod for pod, removal in self.passed if removal.done]

    @property
    def refused(self) -> str | None:
        """Why the API server refused the restart outright: its first removal refused, nothing removed before."""
        return self.stopped.refused if self.stopped is not None and not self.removed else None


class PodRemover:
    """Evicts (the default) or deletes pods by UID, through the shared client: the project's one eviction path."""

    def __init__(self, client: KubeClient, action: PodAction, evictions: Evictions | None = None):
        self.client = client
        self.action = action
        self.evictions = evictions or Evictions(client)

    @property
    def verb(self) -> str:
        return "evicted" if self.action == "evict" else "deleted"

    async def remove(self, pod: PodRef) -> Removal:
        """Evict or delete one pod if it still has its UID; never raises for the API server's answers (or its silence)."""
        where = f"pod {pod.namespace}/{pod.name}"
        if not pod.uid:  # the gate refuses these (no_pod_uid); this is the last line
            return Removal("failed", f"{where} has no UID: never acted on by name; nothing {self.verb}")
        try:
            if self.action == "evict":
                await self.evictions.evict(pod.namespace, pod.name, pod.uid)
            else:
                await delete_pod(self.client, pod.namespace, pod.name, pod.uid)
        except ApiError as exc:
            return judged(exc, self.action == "evict", where, pod.uid)
        except KubeTimeout as exc:
            return Removal("no_answer", f"{self.action} {where}: {exc}")
        except KubeError as exc:  # no answer (or no usable config): nothing is known to be done
            return Removal("failed", f"{self.action} {where}: {exc}")
        return Removal("done", f"{self.verb} {where} (uid {pod.uid})")

    async def remove_each(self, pods: Sequence[PodRef], sweep: Sweep) -> Sweep:
        """Remove `pods` in order into `sweep`, stopping at the first refused or failed; a pod gone or
        replaced meanwhile is passed over (what was wanted: the pod that was listed is not there)."""
        for pod in pods:
            removal = await self.remove(pod)
            if not removal.done and not removal.absent:
                sweep.stopped = removal
                break
            sweep.passed.append((pod, removal))
        return sweep
