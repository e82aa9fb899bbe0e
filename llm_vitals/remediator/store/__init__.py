"""Where the gate's state lives, behind one protocol: `read() -> (state, version)` and
`commit(version, state) -> bool`, as kured's lock and NodeHealthCheck's status are kept, and one
door on them, `transact(step)`.

A transaction reads the state and the store's time once, calls a pure step (state.py's transitions:
the state read and the time in, its result and the new state out) and commits the new state only if
nothing was committed since the read: a conflict reads again and steps again. The ledger is the
only caller, each change with its journal row (ledger.py). Two stores implement the protocol:

- `sqlite.SqliteStore`: one replica, one row in its SQLite file (beside the journal); the default.
- `lease.LeaseStore`: replicas, one annotation of a `coordination.k8s.io/v1` Lease, written only
  with the `resourceVersion` it read, judged by the API server's clock.

Each store keeps its health (`StoreHealth`): whether its last read or write worked, and its
failures by operation, for `llm_vitals_remediator_state_up` and `..._state_errors_total`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ..model import GateState
from ..state import Step

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


class GateStore(Protocol[V]):
    """The gate's state with a version; `V` is whatever the store compares on commit."""

    health: StoreHealth

    def now(self) -> float:
        """The time the state is written and judged by (for replicas: the API server's)."""
        ...

    @property
    def last(self) -> GateState:
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

    async def read(self) -> tuple[GateState, V]:
        """The committed state and its version. Raises StateUnavailable."""
        ...

    async def commit(self, version: V, state: GateState) -> bool:
        """Make `state` the committed state if it is still at `version`; False on a conflict."""
        ...

    async def transact(self, step: Step[T]) -> T:
        """Read the state and the time once, apply `step`, commit what it makes (`ReadStepCommit`).
        Raises StateUnavailable (Ambiguous: the commit's answer was lost; Conflicted)."""
        ...


class ReadStepCommit:
    """The door, for a store whose every `read` may be stale (another replica, the Lease): read, take
    the time after the read (the Lease's read corrects its clock by the API server's answer), step,
    commit at the version read; on a conflict read again and step again. An unchanged state is not
    written."""

    async def transact(self: GateStore[Any], step: Step[T]) -> T:
        for _ in range(CONFLICT_RETRIES):
            state, version = await self.read()
            result, new = step(state, self.now())
            if new == state:
                return result
            try:
                committed = await self.commit(version, new)
            except StateLost:
                raise
            except StateUnavailable as exc:
                # The write may have been applied with its answer lost: the caller must find out.
                raise Ambiguous(str(exc), result) from None
            if committed:
                return result
        raise Conflicted(f"the gate's state kept changing ({CONFLICT_RETRIES} conflicts)")
