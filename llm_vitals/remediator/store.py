"""Where the gate's state lives: this replica's SQLite journal, or a Kubernetes Lease shared by all.

`LeaseStore` keeps the whole `JournalState` (restart in progress with its expiry, cooldown,
budgets, open circuits, pause, storm marker, escalated nodes, recent alert keys) as JSON in one
annotation of a `coordination.k8s.io/v1` Lease, and writes it only with the `resourceVersion` it
read: the API server refuses a stale write with 409, the caller decides again on a fresh read,
and so exactly one replica's intent wins. The Lease's own fields say who holds the restart
(client-go's shape: `holderIdentity`, `leaseDurationSeconds` = the restart's timeout,
`acquireTime`, `renewTime`, `leaseTransitions`), so `kubectl get lease` shows it too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llm_vitals.kube.errors import KubeError
from llm_vitals.kube.leases import LeaseTransport
from llm_vitals.kube.times import micro_time

from . import shared
from .gate import JournalState
from .settings import LeaseRef

STATE_ANNOTATION = "llm-vitals.io/state"
# A conflict means another replica wrote in between: read again and retry, this many times.
CONFLICT_RETRIES = 8


class StateUnavailable(Exception):
    """The shared state cannot be read or written now: nothing may be restarted (503, retry-safe)."""


@dataclass(frozen=True)
class Snapshot:
    state: JournalState
    version: str | None  # the Lease's resourceVersion; None: the Lease does not exist yet
    lease: dict[str, Any] = field(default_factory=dict, compare=False)


class LeaseStore:
    """The shared state in one Lease, read and written with resourceVersion preconditions."""

    def __init__(self, leases: LeaseTransport, ref: LeaseRef, identity: str, budget_window: float):
        self.leases = leases
        self.ref = ref
        self.identity = identity
        self.budget_window = budget_window
        # The last state read or written, for the metrics (a scrape does no I/O).
        self.last: JournalState | None = None

    async def read(self) -> Snapshot:
        try:
            lease = await self.leases.get_lease(self.ref.namespace, self.ref.name)
        except KubeError as exc:
            raise StateUnavailable(f"read Lease {self.ref.name}: {exc}") from None
        if lease is None:
            return Snapshot(JournalState(), None)
        text = (lease.get("metadata", {}).get("annotations") or {}).get(STATE_ANNOTATION)
        try:
            state = shared.from_json(text)
        except shared.BadState as exc:
            raise StateUnavailable(f"Lease {self.ref.name}: {exc}") from None
        self.last = state
        return Snapshot(state, lease["metadata"]["resourceVersion"], lease)

    async def write(self, snap: Snapshot, new: JournalState, now: float) -> bool:
        """Write `new` if the Lease is still at `snap`'s version. False on a conflict (someone else wrote)."""
        new = shared.pruned(new, now, self.budget_window)
        body = self._lease_body(snap, new, now)
        try:
            if snap.version is None:
                written = await self.leases.create_lease(self.ref.namespace, body)
            else:
                written = await self.leases.replace_lease(self.ref.namespace, self.ref.name, body)
        except KubeError as exc:
            raise StateUnavailable(f"write Lease {self.ref.name}: {exc}") from None
        if not written:  # stale resourceVersion, or created by another replica meanwhile
            return False
        self.last = new
        return True

    async def update(self, change: Callable[[JournalState], JournalState], now: Callable[[], float]) -> JournalState:
        """Apply `change` to the current state, re-reading on each conflict. Returns the state written."""
        for _ in range(CONFLICT_RETRIES):
            snap = await self.read()
            new = change(snap.state)
            if new == snap.state:
                return new
            if await self.write(snap, new, now()):
                return new
        raise StateUnavailable(f"Lease {self.ref.name}: still conflicting after {CONFLICT_RETRIES} tries")

    def _lease_body(self, snap: Snapshot, new: JournalState, now: float) -> dict[str, Any]:
        old_spec = snap.lease.get("spec") or {}
        holder = new.in_progress_by.split("/", 1)[0] if new.in_progress_by else ""
        spec: dict[str, Any] = {
            "holderIdentity": holder,
            "leaseDurationSeconds": self._duration(new, now),
            "renewTime": micro_time(now),
            "leaseTransitions": int(old_spec.get("leaseTransitions") or 0),
        }
        if holder and holder != old_spec.get("holderIdentity"):
            spec["acquireTime"] = micro_time(now)
            if old_spec.get("holderIdentity"):
                spec["leaseTransitions"] += 1  # a takeover of an expired holder's claim
        elif old_spec.get("acquireTime"):
            spec["acquireTime"] = old_spec["acquireTime"]
        metadata: dict[str, Any] = {
            "name": self.ref.name,
            "namespace": self.ref.namespace,
            "annotations": {**(snap.lease.get("metadata", {}).get("annotations") or {}),
                            STATE_ANNOTATION: shared.to_json(new)},
            "labels": {"app.kubernetes.io/name": "llm-vitals-remediator"},
        }
        if snap.version is not None:
            metadata["resourceVersion"] = snap.version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def _duration(self, new: JournalState, now: float) -> int:
        if new.in_progress is not None and new.in_progress_expires is not None:
            return max(1, math.ceil(new.in_progress_expires - now))
        return max(1, math.ceil(self.ref.duration))
