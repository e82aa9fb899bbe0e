"""Where the gate's state lives, behind one protocol: `read() -> (state, version)` and
`commit(version, state) -> bool`, as kured's lock and NodeHealthCheck's status are kept.

A commit writes the state that the gate's effects make of the state read at `version` (a pure
transition from `shared.py`), and only if nothing was committed since: False is a conflict, and
the caller reads again and decides again (`transact`). Two stores implement it:

- `SqliteStore` (`state_db.py`): one replica, one row in its SQLite file; the default.
- `LeaseStore` (here): replicas. The whole `JournalState` (restart in progress with its expiry,
  cooldown, budgets, open circuits, pause, storm marker, escalated nodes, recent alert keys) is JSON
  in one annotation of a `coordination.k8s.io/v1` Lease, written only with the `resourceVersion` it
  read: the API server refuses a stale write with 409, and so exactly one replica's intent wins.
  The Lease's own fields say who holds the restart (client-go's shape: `holderIdentity`,
  `leaseDurationSeconds` = the restart's timeout, `acquireTime`, `renewTime`, `leaseTransitions`),
  so `kubectl get lease` shows it too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from llm_vitals.kube.errors import KubeError
from llm_vitals.kube.leases import LeaseTransport
from llm_vitals.kube.times import micro_time

from . import shared
from .gate import JournalState
from .settings import LeaseRef

STATE_ANNOTATION = "llm-vitals.io/state"
# A conflict means another writer committed in between: read again and retry, this many times.
CONFLICT_RETRIES = 8

V = TypeVar("V")
T = TypeVar("T")


class StateUnavailable(Exception):
    """The gate's state cannot be read or written now: nothing may be restarted (503, retry-safe)."""


class Conflicted(StateUnavailable):
    """Every try met a conflict: other writers keep committing first (retry-safe, as unavailable)."""


class GateStore(Protocol[V]):
    """The gate's state with a version; `V` is whatever the store compares on commit."""

    @property
    def last(self) -> JournalState:
        """The state as last read or committed, without I/O (metrics, /healthz, the duplicate check)."""
        ...

    @property
    def last_is_current(self) -> bool:
        """True when `last` is always the committed state (this process is the only writer)."""
        ...

    @property
    def claims_expire(self) -> bool:
        """True when a restart's claim must end by itself: a replica that dies leaves it to the others."""
        ...

    async def read(self) -> tuple[JournalState, V]:
        """The committed state and its version. Raises StateUnavailable."""
        ...

    async def commit(self, version: V, state: JournalState) -> bool:
        """Make `state` the committed state if it is still at `version`; False on a conflict."""
        ...


async def transact(store: GateStore[Any], step: Callable[[JournalState], tuple[T, JournalState]]) -> T:
    """Read, apply `step` (no I/O: the state in, its result and the new state out), commit; on a
    conflict read again and step again. An unchanged state is not written. Raises StateUnavailable."""
    for _ in range(CONFLICT_RETRIES):
        state, version = await store.read()
        result, new = step(state)
        if new == state or await store.commit(version, new):
            return result
    raise Conflicted(f"the gate's state kept changing ({CONFLICT_RETRIES} conflicts)")


async def update(store: GateStore[Any], change: Callable[[JournalState], JournalState]) -> JournalState:
    """Apply a pure `change` to the state, retried on conflicts. Returns the state committed."""

    def step(state: JournalState) -> tuple[JournalState, JournalState]:
        new = change(state)
        return new, new

    return await transact(store, step)


@dataclass(frozen=True)
class Snapshot:
    """The version of a Lease as read: its resourceVersion (None: no Lease yet) and the object itself."""

    version: str | None
    lease: dict[str, Any] = field(default_factory=dict, compare=False)


class LeaseStore:
    """The shared state in one Lease, read and written with resourceVersion preconditions."""

    last_is_current = False  # another replica may have written since
    claims_expire = True

    def __init__(
        self, leases: LeaseTransport, ref: LeaseRef, identity: str, budget_window: float, clock: Callable[[], float]
    ):
        self.leases = leases
        self.ref = ref
        self.identity = identity
        self.budget_window = budget_window
        self.clock = clock
        # The last state read or written, for the metrics (a scrape does no I/O).
        self.last = JournalState()

    async def read(self) -> tuple[JournalState, Snapshot]:
        try:
            lease = await self.leases.get_lease(self.ref.namespace, self.ref.name)
        except KubeError as exc:
            raise StateUnavailable(f"read Lease {self.ref.name}: {exc}") from None
        if lease is None:
            return JournalState(), Snapshot(None)
        text = (lease.get("metadata", {}).get("annotations") or {}).get(STATE_ANNOTATION)
        try:
            state = shared.from_json(text)
        except shared.BadState as exc:
            raise StateUnavailable(f"Lease {self.ref.name}: {exc}") from None
        self.last = state
        return state, Snapshot(lease["metadata"]["resourceVersion"], lease)

    async def commit(self, snap: Snapshot, new: JournalState) -> bool:
        """Write `new` if the Lease is still at `snap`'s version. False on a conflict (someone else wrote)."""
        now = self.clock()
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
