"""The gate's state for replicas: one Kubernetes Lease (`store.GateStore`).

The whole `GateState` (restart in progress with its expiry, cooldown, budgets, open circuits,
pause, storm marker, cordoned nodes, holds, recent alert keys) is JSON (state_codec.py) in one
annotation of a `coordination.k8s.io/v1` Lease, written only with the `resourceVersion` it read:
the API server refuses a stale write with 409, and so exactly one replica's intent wins. The
Lease's own fields say who holds the restart (client-go's shape: `holderIdentity`,
`leaseDurationSeconds` = the restart's timeout, `acquireTime`, `renewTime`, `leaseTransitions`),
so `kubectl get lease` shows it too. A write keeps every label and annotation it did not set.

**One clock.** Every time in the shared state (a claim's expiry, the cooldown's start, the budget,
the storm marker, the ladder) is written and judged in the API server's time, not each replica's:
`LeaseStore.now()` is this replica's clock corrected by the `Date` headers of the API server's
answers to its Lease reads and writes (`ServerClock`: their bounds narrow the offset to well under
a second). Two replicas whose clocks disagree by a minute still agree on when a
claim expires. (One replica judges by its own clock: it is the only one.)
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_vitals.kube.errors import KubeError
from llm_vitals.kube.leases import LeaseTransport
from llm_vitals.kube.times import micro_time

from .. import state_codec
from ..model import GateState
from ..settings import LeaseRef
from ..state import claim_lapsed, prune_window, pruned
from . import CONFLICT_RETRIES, Conflicted, ReadStepCommit, StateLost, StateUnavailable, StoreHealth

STATE_ANNOTATION = "llm-vitals.io/state"
# The epoch's marker: a second Lease beside the state's (`<name>-epoch`), holding the epoch of the state
# the fleet runs on. It outlives a deletion of the state's Lease, so that a replica with no memory of its
# own (no epoch file: scaled up, a new volume) still knows the fleet ran before (`LeaseStore.read`).
EPOCH_ANNOTATION = "llm-vitals.io/epoch"
MARKER_SUFFIX = "-epoch"


# Bounds on the API server's clock older than this are dropped (they would hold a clock that was stepped).
CLOCK_BOUNDS_SECONDS = 600.0


@dataclass(frozen=True)
class ServerClock:
    """How far the API server's clock is ahead of this replica's, from the `Date` of its answers.

    A Date is whole seconds, truncated: the server answered at a time within [Date, Date + 1), and
    between this replica's sending and its receiving. So each answer bounds the offset to
    [Date - received, Date + 1 - sent], and the bounds of successive answers, which fall at other
    fractions of a second, narrow it to well under a second (as NTP narrows its own). Bounds that
    no longer overlap (a clock was stepped), or older than CLOCK_BOUNDS_SECONDS, start again."""

    low: float = -math.inf
    high: float = math.inf
    since: float = 0.0  # local time of the first answer the bounds hold

    def observed(self, date: float, sent: float, received: float) -> ServerClock:
        low, high = date - received, date + 1.0 - sent
        if received - self.since > CLOCK_BOUNDS_SECONDS or max(self.low, low) > min(self.high, high):
            return ServerClock(low, high, received)
        return ServerClock(max(self.low, low), min(self.high, high), self.since)

    @property
    def offset(self) -> float:
        """The middle of the bounds; 0 before any answer."""
        return 0.0 if math.isinf(self.low) else (self.low + self.high) / 2


@dataclass(frozen=True)
class Snapshot:
    """The version of a Lease as read: its resourceVersion (None: no Lease yet), the object itself,
    and its document as read (the fields a newer version wrote are written back with it)."""

    version: str | None
    lease: dict[str, Any] = field(default_factory=dict, compare=False)
    stored: state_codec.Stored | None = field(default=None, compare=False)


# What a replica remembers of a Lease written before states had an epoch (an upgrade adds one).
LEGACY_EPOCH = ""


class EpochMemory:
    """Which initialisation of the shared state this replica has seen (its `epoch`), kept in a small
    file beside its journal, so that a replica restarted after the Lease was deleted still knows a
    state existed. A replica that never saw one (the first start of all) creates it."""

    def __init__(self, path: Path | None):
        self.path = path
        self.epoch: str | None = None
        if path is not None and path.exists():
            try:
                epoch = json.loads(path.read_text()).get("epoch")
            except (OSError, ValueError, AttributeError) as exc:
                raise state_codec.BadState(f"{path}: not readable ({type(exc).__name__}); remove it only if the"
                                      " shared state is known to be new") from None
            self.epoch = epoch if isinstance(epoch, str) else None

    def remember(self, epoch: str) -> None:
        if epoch == self.epoch:
            return
        self.epoch = epoch
        if self.path is not None:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps({"epoch": epoch}))
            os.replace(tmp, self.path)


def accepts(seen: str | None, stored: state_codec.Stored) -> bool:
    """Whether a replica that has seen epoch `seen` may use `stored` (pure): the same initialisation,
    the first it sees, an older version's write (no epoch), an upgrade giving a legacy state its
    epoch, or a human's re-initialisation. Anything else is another initialisation: the state it saw
    was lost."""
    if seen is None or stored.epoch == seen:
        return True
    if stored.epoch is None:
        # An older version's write (it knows no epoch and drops it): a rolling upgrade, not a loss.
        return True
    if seen == LEGACY_EPOCH and stored.epoch is not None:
        return True
    return stored.epoch is not None and (stored.reinitialised or {}).get("epoch") == stored.epoch


class LeaseStore(ReadStepCommit):
    """The shared state in one Lease, read and written with resourceVersion preconditions; its
    transactions (`ReadStepCommit.transact`) take the time after each read."""

    last_is_current = False  # another replica may have written since
    claims_expire = True

    def __init__(
        self, leases: LeaseTransport, ref: LeaseRef, identity: str, budget_window: float, clock: Callable[[], float],
        memory: EpochMemory | None = None, local_state: Callable[[], GateState | None] | None = None,
    ):
        self.leases = leases
        self.ref = ref
        self.identity = identity
        self.budget_window = budget_window
        self.clock = clock
        self.memory = memory or EpochMemory(None)
        # This replica's own SQLite state (it ran alone before): what a first Lease starts from.
        self.local_state = local_state or (lambda: None)
        self.health = StoreHealth()
        # The API server's clock against this replica's, from its dated answers.
        self.server_clock = ServerClock()
        # The last state read or written, for the metrics (a scrape does no I/O).
        self.last = GateState()
        self._marked: str | None = None  # the epoch the marker was last seen or written to hold

    def now(self) -> float:
        return self.clock() + self.server_clock.offset

    def _observe(self, server_time: float | None, sent: float) -> None:
        if server_time is not None:
            self.server_clock = self.server_clock.observed(server_time, sent, self.clock())

    async def _get(self, name: str | None = None) -> dict[str, Any] | None:
        sent = self.clock()
        name = name or self.ref.name
        try:
            answer = await self.leases.get_lease(self.ref.namespace, name)
        except KubeError as exc:
            self.health.failed("read", str(exc))
            raise StateUnavailable(f"read Lease {name}: {exc}") from None
        self._observe(answer.server_time, sent)
        return answer.value

    @property
    def marker_name(self) -> str:
        return self.ref.name + MARKER_SUFFIX

    async def _marked_epoch(self) -> str | None:
        """The epoch the marker beside the Lease holds (None: no marker). Raises StateUnavailable."""
        marker = await self._get(self.marker_name)
        epoch = ((marker or {}).get("metadata", {}).get("annotations") or {}).get(EPOCH_ANNOTATION)
        self._marked = epoch if isinstance(epoch, str) and epoch else None
        return self._marked

    async def _mark(self, epoch: str) -> None:
        """Write `epoch` into the marker (create it, or replace it at the version read). A failure is
        counted and tried again after the next commit: the state's commit stands."""
        try:
            marker = await self._get(self.marker_name)
            old = ((marker or {}).get("metadata", {}).get("annotations") or {}).get(EPOCH_ANNOTATION)
            if old == epoch:
                self._marked = epoch
                return
            meta = {k: v for k, v in (marker or {}).get("metadata", {}).items() if k != "managedFields"}
            meta.update(name=self.marker_name, namespace=self.ref.namespace,
                        annotations={**(meta.get("annotations") or {}), EPOCH_ANNOTATION: epoch},
                        labels={**(meta.get("labels") or {}), "app.kubernetes.io/name": "llm-vitals-remediator"})
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": {}}
            if marker is None:
                written = await self.leases.create_lease(self.ref.namespace, body)
            else:
                written = await self.leases.replace_lease(self.ref.namespace, self.marker_name, body)
        except (KubeError, StateUnavailable) as exc:
            self.health.failed("write", f"marker {self.marker_name}: {exc}")
            return
        if written.value:
            self._marked = epoch

    def _lost(self, why: str) -> StateLost:
        self.health.failed("read", why)
        self.health.lost = why[:500]
        return StateLost(f"{why}; nothing is restarted until it is re-initialised (POST /api/v1/state/reinit)")

    def _first(self) -> GateState:
        """The state a first Lease starts from: this replica's own SQLite state, else empty."""
        local = self.local_state()
        if local is None:
            return GateState()
        return claim_lapsed(local)

    async def read(self) -> tuple[GateState, Snapshot]:
        seen = self.memory.epoch
        if seen is None:
            # No memory of its own (no epoch file): the marker beside the Lease is the fleet's. Read
            # before the Lease: a marker is written after its Lease, so the marker read first and the
            # Lease absent after it is a deletion, never another replica's first commit landing
            # between the two reads (the k8s tier's two replicas starting at once read `state_lost`).
            seen = await self._marked_epoch()
        lease = await self._get()
        where = f"Lease {self.ref.namespace}/{self.ref.name}"
        text = ((lease or {}).get("metadata", {}).get("annotations") or {}).get(STATE_ANNOTATION)
        if not text:
            if seen is not None:
                held = f"epoch {seen}" if seen else "a state"
                witness = "" if self.memory.epoch is not None else f" (its marker {self.marker_name} says so)"
                raise self._lost((f"{where} is gone" if lease is None else f"{where} lost its state annotation")
                                 + f" (it held {held}){witness}")
            # Nothing was ever seen here: the first start of all (the first commit creates it).
            self.health.ok()
            first = self._first()
            version = None if lease is None else lease["metadata"]["resourceVersion"]
            return first, Snapshot(version, lease or {}, state_codec.Stored(first))
        try:
            stored = state_codec.load(state_codec.decode_annotation(text))
        except state_codec.BadState as exc:
            raise self._lost(f"{where}: {exc}") from None
        if not accepts(seen, stored):
            raise self._lost(f"{where} holds epoch {stored.epoch!r}, not {seen!r} that this replica saw: it was"
                             " deleted and created again")
        assert lease is not None  # it has a state annotation
        self.memory.remember(stored.epoch if stored.epoch is not None else LEGACY_EPOCH)
        self.health.ok()
        # A claim past its expiry is over, its alert judged afresh (written with the next commit).
        state = claim_lapsed(stored.state, self.now())
        self.last = state
        return state, Snapshot(lease["metadata"]["resourceVersion"], lease, stored)

    async def commit(self, snap: Snapshot, new: GateState) -> bool:
        """Write `new` if the Lease is still at `snap`'s version. False on a conflict (someone else wrote)."""
        old = snap.stored or state_codec.Stored(GateState())
        window = prune_window(self.budget_window, old.budget_window)
        stored = state_codec.Stored(pruned(new, self.now(), window), old.epoch or uuid.uuid4().hex, window,
                               old.reinitialised, old.carried)
        return await self._write(snap, stored)

    async def _write(self, snap: Snapshot, stored: state_codec.Stored) -> bool:
        now = self.now()
        try:
            body = self._lease_body(snap, stored, now)
        except state_codec.TooLarge as exc:
            self.health.failed("write", str(exc))
            raise StateUnavailable(f"write Lease {self.ref.name}: {exc}") from None
        sent = self.clock()
        try:
            if snap.version is None:
                written = await self.leases.create_lease(self.ref.namespace, body)
            else:
                written = await self.leases.replace_lease(self.ref.namespace, self.ref.name, body)
        except KubeError as exc:
            self.health.failed("write", str(exc))
            raise StateUnavailable(f"write Lease {self.ref.name}: {exc}") from None
        self.health.ok()
        self._observe(written.server_time, sent)
        if not written.value:  # stale resourceVersion, or created by another replica meanwhile
            return False
        assert stored.epoch is not None
        self.memory.remember(stored.epoch)
        self.last = stored.state
        if self._marked != stored.epoch:
            await self._mark(stored.epoch)
        return True

    async def reinitialise(self, source: GateState, by: str, reason: str, origin: str) -> dict[str, Any]:
        """A human's re-initialisation: a new epoch holding `source` (empty, or this replica's own
        journal), whatever the Lease holds now. Returns what it discarded. Raises StateUnavailable."""
        for _ in range(CONFLICT_RETRIES):
            lease = await self._get()
            text = ((lease or {}).get("metadata", {}).get("annotations") or {}).get(STATE_ANNOTATION)
            discarded: dict[str, Any]
            if lease is None:
                discarded = {"lease": "absent"}
            elif not text:
                discarded = {"lease": "present, with no state"}
            else:
                try:
                    old = state_codec.load(state_codec.decode_annotation(text))
                    discarded = {"lease": "present", "epoch": old.epoch, **state_codec.summary(old.state),
                                 "fields_of_a_newer_version": sorted(old.carried)}
                except state_codec.BadState as exc:
                    discarded = {"lease": "present, unreadable", "error": str(exc)[:300], "characters": len(text)}
            epoch = uuid.uuid4().hex
            record = {"epoch": epoch, "at": self.now(), "by": by[:200], "reason": reason[:500], "from": origin}
            fresh = claim_lapsed(source)
            version = None if lease is None else lease["metadata"]["resourceVersion"]
            stored = state_codec.Stored(pruned(fresh, self.now(), self.budget_window), epoch, self.budget_window,
                                   record)
            if await self._write(Snapshot(version, lease or {}), stored):
                return discarded
        raise Conflicted(f"the Lease kept changing ({CONFLICT_RETRIES} conflicts)")

    def _lease_body(self, snap: Snapshot, stored: state_codec.Stored, now: float) -> dict[str, Any]:
        new = stored.state
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
        # What others put on the Lease (labels, annotations, owner references) stays as it was.
        old_meta = {k: v for k, v in (snap.lease.get("metadata") or {}).items() if k != "managedFields"}
        metadata: dict[str, Any] = {
            **old_meta,
            "name": self.ref.name,
            "namespace": self.ref.namespace,
            "annotations": {**(old_meta.get("annotations") or {}),
                            STATE_ANNOTATION: state_codec.encode_annotation(state_codec.dump(stored))},
            "labels": {**(old_meta.get("labels") or {}), "app.kubernetes.io/name": "llm-vitals-remediator"},
        }
        if snap.version is not None:
            metadata["resourceVersion"] = snap.version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def _duration(self, new: GateState, now: float) -> int:
        if new.in_progress is not None and new.in_progress_expires is not None:
            return max(1, math.ceil(new.in_progress_expires - now))
        return max(1, math.ceil(self.ref.duration))
