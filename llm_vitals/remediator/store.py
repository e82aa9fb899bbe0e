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
  so `kubectl get lease` shows it too. A write keeps every label and annotation it did not set.

**One clock.** Every time in the shared state (a claim's expiry, the cooldown's start, the budget,
the storm marker, the ladder) is written and judged in the API server's time, not each replica's:
`LeaseStore.now()` is this replica's clock corrected by the `Date` headers of the API server's
answers to its Lease reads and writes (`ServerClock`: their bounds narrow the offset to well under
a second). Two replicas whose clocks disagree by a minute still agree on when a
claim expires. (One replica judges by its own clock: it is the only one.)

Each store keeps its health (`StoreHealth`): whether its last read or write worked, and its
failures by operation, for `llm_vitals_remediator_state_up` and `..._state_errors_total`.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from llm_vitals.kube.errors import KubeError
from llm_vitals.kube.leases import LeaseTransport
from llm_vitals.kube.times import micro_time

from . import shared
from .gate import JournalState
from .settings import LeaseRef

STATE_ANNOTATION = "llm-vitals.io/state"
# The epoch's marker: a second Lease beside the state's (`<name>-epoch`), holding the epoch of the state
# the fleet runs on. It outlives a deletion of the state's Lease, so that a replica with no memory of its
# own (no epoch file: scaled up, a new volume) still knows the fleet ran before (`LeaseStore.read`).
EPOCH_ANNOTATION = "llm-vitals.io/epoch"
MARKER_SUFFIX = "-epoch"
# A conflict means another writer committed in between: read again and retry, this many times.
CONFLICT_RETRIES = 8

V = TypeVar("V")
T = TypeVar("T")


class StateUnavailable(Exception):
    """The gate's state cannot be read or written now: nothing may be restarted (503, retry-safe)."""


class StateLost(StateUnavailable):
    """The shared state is gone or not ours (a Lease deleted, an annotation unparseable, another
    initialisation's state): nothing is restarted, nor paused or reset, until a human
    re-initialises it (`reinitialise`, POST /api/v1/state/reinit). Never a fresh state in silence:
    that would forget open circuits, spent budgets, the pause, the ladder and cordoned nodes."""


class Ambiguous(StateUnavailable):
    """A write whose answer was lost: the store may or may not hold it now. `result` is what the
    step decided with it; the caller re-reads to learn which (`GateLoop`: carried out once, or released)."""

    def __init__(self, message: str, result: Any):
        super().__init__(message)
        self.result = result


class Conflicted(StateUnavailable):
    """Every try met a conflict: other writers keep committing first (retry-safe, as unavailable)."""


@dataclass
class StoreHealth:
    """Whether the gate's state could be read and written lately: the metrics and the follower's log."""

    up: bool = True  # the last read or write worked
    errors: dict[str, int] = field(default_factory=dict)  # failures by operation: read, write, follow
    last_error: str = ""
    lost: str = ""  # why the state is lost (StateLost) until a human re-initialises it; "" when it is not
    # Restart intents whose commit's outcome this replica could not learn yet (a write's answer lost and
    # the state unreadable since): each is re-read until it is carried out or released.
    unresolved: int = 0

    def ok(self) -> None:
        self.up = True
        self.lost = ""

    def failed(self, operation: str, error: str) -> None:
        self.up = False
        self.errors[operation] = self.errors.get(operation, 0) + 1
        self.last_error = error[:500]


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


class GateStore(Protocol[V]):
    """The gate's state with a version; `V` is whatever the store compares on commit."""

    health: StoreHealth

    def now(self) -> float:
        """The time the state is written and judged by (for replicas: the API server's)."""
        ...

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
        if new == state:
            return result
        try:
            committed = await store.commit(version, new)
        except StateLost:
            raise
        except StateUnavailable as exc:
            # The write may have been applied with its answer lost: the caller must find out.
            raise Ambiguous(str(exc), result) from None
        if committed:
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
    """The version of a Lease as read: its resourceVersion (None: no Lease yet), the object itself,
    and its document as read (the fields a newer version wrote are written back with it)."""

    version: str | None
    lease: dict[str, Any] = field(default_factory=dict, compare=False)
    stored: shared.Stored | None = field(default=None, compare=False)


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
                raise shared.BadState(f"{path}: not readable ({type(exc).__name__}); remove it only if the"
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


def accepts(seen: str | None, stored: shared.Stored) -> bool:
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


class LeaseStore:
    """The shared state in one Lease, read and written with resourceVersion preconditions."""

    last_is_current = False  # another replica may have written since
    claims_expire = True

    def __init__(
        self, leases: LeaseTransport, ref: LeaseRef, identity: str, budget_window: float, clock: Callable[[], float],
        memory: EpochMemory | None = None, local_state: Callable[[], JournalState | None] | None = None,
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
        self.last = JournalState()
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

    def _first(self) -> JournalState:
        """The state a first Lease starts from: this replica's own SQLite state, else empty."""
        local = self.local_state()
        if local is None:
            return JournalState()
        return shared.claim_lapsed(local)

    async def read(self) -> tuple[JournalState, Snapshot]:
        lease = await self._get()
        where = f"Lease {self.ref.namespace}/{self.ref.name}"
        seen = self.memory.epoch
        if seen is None:
            # No memory of its own (no epoch file): the marker beside the Lease is the fleet's.
            seen = await self._marked_epoch()
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
            return first, Snapshot(version, lease or {}, shared.Stored(first))
        try:
            stored = shared.load(shared.decode_annotation(text))
        except shared.BadState as exc:
            raise self._lost(f"{where}: {exc}") from None
        if not accepts(seen, stored):
            raise self._lost(f"{where} holds epoch {stored.epoch!r}, not {seen!r} that this replica saw: it was"
                             " deleted and created again")
        assert lease is not None  # it has a state annotation
        self.memory.remember(stored.epoch if stored.epoch is not None else LEGACY_EPOCH)
        self.health.ok()
        # A claim past its expiry is over, its alert judged afresh (written with the next commit).
        state = shared.claim_lapsed(stored.state, self.now())
        self.last = state
        return state, Snapshot(lease["metadata"]["resourceVersion"], lease, stored)

    async def commit(self, snap: Snapshot, new: JournalState) -> bool:
        """Write `new` if the Lease is still at `snap`'s version. False on a conflict (someone else wrote)."""
        old = snap.stored or shared.Stored(JournalState())
        window = shared.prune_window(self.budget_window, old.budget_window)
        stored = shared.Stored(shared.pruned(new, self.now(), window), old.epoch or uuid.uuid4().hex, window,
                               old.reinitialised, old.carried)
        return await self._write(snap, stored)

    async def _write(self, snap: Snapshot, stored: shared.Stored) -> bool:
        now = self.now()
        try:
            body = self._lease_body(snap, stored, now)
        except shared.TooLarge as exc:
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

    async def reinitialise(self, source: JournalState, by: str, reason: str, origin: str) -> dict[str, Any]:
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
                    old = shared.load(shared.decode_annotation(text))
                    discarded = {"lease": "present", "epoch": old.epoch, **shared.summary(old.state),
                                 "fields_of_a_newer_version": sorted(old.carried)}
                except shared.BadState as exc:
                    discarded = {"lease": "present, unreadable", "error": str(exc)[:300], "characters": len(text)}
            epoch = uuid.uuid4().hex
            record = {"epoch": epoch, "at": self.now(), "by": by[:200], "reason": reason[:500], "from": origin}
            fresh = shared.claim_lapsed(source)
            version = None if lease is None else lease["metadata"]["resourceVersion"]
            stored = shared.Stored(shared.pruned(fresh, self.now(), self.budget_window), epoch, self.budget_window,
                                   record)
            if await self._write(Snapshot(version, lease or {}), stored):
                return discarded
        raise Conflicted(f"the Lease kept changing ({CONFLICT_RETRIES} conflicts)")

    def _lease_body(self, snap: Snapshot, stored: shared.Stored, now: float) -> dict[str, Any]:
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
            "annotations": {**(old_meta.get("annotations") or {}), STATE_ANNOTATION: shared.encode_annotation(shared.dump(stored))},
            "labels": {**(old_meta.get("labels") or {}), "app.kubernetes.io/name": "llm-vitals-remediator"},
        }
        if snap.version is not None:
            metadata["resourceVersion"] = snap.version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def _duration(self, new: JournalState, now: float) -> int:
        if new.in_progress is not None and new.in_progress_expires is not None:
            return max(1, math.ceil(new.in_progress_expires - now))
        return max(1, math.ceil(self.ref.duration))
