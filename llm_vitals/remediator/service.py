"""The remediator's service: wires the policy, the gate's store, the ledger, the loop and acting,
and answers what the routes ask (a webhook's decisions, pause, circuit reset, the state now).

One alert goes through `loop.GateLoop` (decide once, commit once, carry out); every write, of the
state and of the journal, goes through `ledger.Ledger`, each change with its row; a restart runs in
`acting.Actor`; the state lives in a `store.GateStore` (`store_for`); `follow.follow` keeps a
replica's view of the Lease fresh. See each module for its part.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from llm_vitals.backstop_word import BackstopWord
from llm_vitals.kube.client import KubeClient
from llm_vitals.kube.leases import LeaseTransport
from llm_vitals.logs import log_event

from . import gate_word
from .acting import Actor, claim_seconds
from .executors import Executor, build_executor
from .exporter_client import FleetReader
from .gate import Decision
from .journal import Journal
from .ledger import Ledger
from .loop import GateLoop
from .metrics import RemediatorMetrics
from .model import AlertFacts, GateState
from .payload import Alert, WebhookPayload
from .pods import IdentityReader
from .policy import policy_from
from .settings import Settings
from .state_codec import summary
from .store import GateStore
from .store.lease import EpochMemory, LeaseStore
from .store.sqlite import SqliteStore, read_local_state

log = logging.getLogger("llm_vitals.remediator")

# GET /api/v1/pause answers from a read of the shared state no older than this.
STATE_MAX_AGE = 1.0

# Unknown workloads remembered at most (backstop_words): the oldest is forgotten first.
UNKNOWN_MEMORY = 1000

# Reasons for which nothing was decided for good and a redelivery is safe (503).
# `owner_pending` and `identity_unverified` pass too: the API server can answer on the next try.
# `state_lost` too: nothing is done until a human re-initialises the state, and then the re-send is judged.
RETRY_SAFE_REASONS = frozenset({"exporter_unreachable", "state_unreachable", "state_lost", "owner_pending",
                                "identity_unverified"})


def facts_of(alert: Alert) -> AlertFacts:
    return AlertFacts(
        status=alert.status, labels=alert.labels, fingerprint=alert.fingerprint, starts_at=alert.starts_at
    )


@dataclass
class PayloadOutcome:
    status: int
    decisions: list[dict] = field(default_factory=list)


class Remediator:
    def __init__(
        self,
        settings: Settings,
        journal: Journal,
        store: GateStore[Any],
        http_client: aiohttp.ClientSession,
        clock: Callable[[], float] = time.time,
        executors: dict[str, Executor] | None = None,
        kube: KubeClient | None = None,
    ):
        self.settings = settings
        self.policy = policy_from(settings)
        self.journal = journal
        self.store = store
        self.clock = clock
        self.identity = replica_identity(settings)
        # The gauges read from the shared state judge its times by the store's clock (the API server's, with replicas).
        self.metrics = RemediatorMetrics(settings.targets, journal, lambda: store.last, store.now,
                                         lambda: store.health, settings.budget.window,
                                         settings.budget.backoff.reset_after)
        executors = executors or {name: build_executor(config, http_client, settings.pod_action)
                                  for name, config in settings.targets.items()}
        self.ledger = Ledger(store, journal, self.metrics, self.policy, clock, self.identity, claim_seconds(0.0, 0.0),
                             {name: executor.kind for name, executor in executors.items()})
        self.actor = Actor(settings, executors, kube, self.identity, self.ledger)
        # Every exporter shard, read at once: the fleet gate needs the whole fleet in one view.
        exporter = FleetReader.of(settings.exporters(), http_client, settings.exporter_timeout, settings.exporter_max_age)
        self.loop = GateLoop(self.policy, self.ledger, exporter, self.actor, IdentityReader(kube) if kube is not None else None)
        self._read_lock = asyncio.Lock()  # GET /api/v1/pause: one read of the shared state at a time
        self._read_at = -math.inf
        # Workloads a backstop asked about that this remediator never heard of, and when first asked
        # (this replica's memory: the hold they get is bounded, gate_word.UNKNOWN_HOLD).
        self._unknown: dict[str, float] = {}

    def gate_state_now(self) -> GateState:
        """The state as last seen, without I/O (for the metrics and /healthz)."""
        return self.store.last

    # -- webhook ------------------------------------------------------------------------------

    async def handle_payload(self, payload: WebhookPayload) -> PayloadOutcome:
        """Decide every alert of one webhook. The status follows Alertmanager's retry rule.

        200 when anything was started or everything was decided. 503 (Alertmanager retries) only
        when nothing was started and an alert could not be decided for a passing reason: the
        exporter or the shared state could not be read, or the journal could not be written.
        """
        outcome = PayloadOutcome(status=200)
        started = retry_safe_failure = False
        for alert in payload.alerts:
            facts = facts_of(alert)
            entry = {"target": facts.target, "fingerprint": facts.fingerprint}
            try:
                decision = await self.handle_alert(facts)
            except Exception as exc:  # the journal failed: nothing was started for this alert
                log.exception("cannot decide an alert")
                entry.update(decision="error", reason="internal_error", detail=type(exc).__name__)
                retry_safe_failure = True
            else:
                entry.update(decision=decision.word, reason=decision.reason, detail=decision.detail)
                started |= decision.allowed
                retry_safe_failure |= decision.reason in RETRY_SAFE_REASONS
            outcome.decisions.append(entry)
        if retry_safe_failure and not started:
            outcome.status = 503
        return outcome

    async def handle_alert(self, facts: AlertFacts) -> Decision:
        """Decide one alert, journal the decision, and start the restart when it is allowed."""
        return await self.loop.handle(facts)

    async def wait_idle(self) -> None:
        """Wait for running restarts (tests and shutdown)."""
        await self.actor.wait_idle()

    async def shutdown(self) -> None:
        """Give a running restart a grace period, then cancel it (journaled as interrupted)."""
        await self.actor.shutdown()

    # -- operator actions ---------------------------------------------------------------------

    async def reset_circuits(self, workloads: list[str]) -> list[str]:
        """Close the circuits of `workloads`, forgive their budget so far and start their ladder again.
        Returns those that were open. Raises StateUnavailable."""
        return await self.ledger.reset_circuits(workloads)

    async def release_node(self, node: str) -> bool:
        """Forget that llm-vitals cordoned `node` (a human has dealt with it): it may be cordoned again.
        Returns whether it was cordoned. Raises StateUnavailable."""
        return await self.ledger.release_node(node)

    async def release_workload(self, workload: str) -> bool:
        """A human has looked at `workload`: its page ends and its ladder starts again. Returns whether it
        was paged. Raises StateUnavailable."""
        return await self.ledger.release_workload(workload)

    async def workloads_known(self) -> set[str]:
        """What a circuit reset may name: the static targets and every workload the state has a circuit,
        a budget or a ladder step for (read fresh from the Lease in the replicated mode). Raises StateUnavailable."""
        state, _ = await self.store.read()
        return (set(self.settings.targets) | set(state.open_circuits) | set(state.restart_times) | set(state.ladder)
                | set(state.backoff) | set(state.pages))

    async def set_pause(self, until: float | None, reason: str) -> GateState:
        """Pause (or, with `until` None, resume) every replica; journaled. Raises StateUnavailable."""
        return await self.ledger.set_pause(until, reason)

    async def recent_state(self) -> GateState:
        """The state read at most STATE_MAX_AGE ago (one read at a time, shared by the callers meanwhile):
        the pause a human just set on another replica shows here at once, and a flood of GETs costs the
        API server one read a second. Raises StateUnavailable."""
        if self.store.last_is_current:
            return self.store.last
        async with self._read_lock:
            # By the service's clock (the soak's is virtual: a real-time second there spans minutes);
            # a clock stepped back reads again too.
            age = self.clock() - self._read_at
            if not 0 <= age < STATE_MAX_AGE:
                await self.store.read()
                self._read_at = self.clock()
        return self.store.last

    async def backstop_words(self, workloads: list[str]) -> tuple[float, list[BackstopWord]]:
        """The gate's word for each workload's liveness backstop (gate_word.py), on the state read at
        most STATE_MAX_AGE ago, at the store's clock. Raises StateUnavailable (StateLost: lost)."""
        state = await self.recent_state()
        if any(not gate_word.known(w, state, self.policy, self.loop.reported) for w in workloads):
            await self.loop.read_fleet()  # a workload discovered since the last look is known (one cached read)
        now, lost = self.store.now(), bool(self.store.health.lost)
        return now, [gate_word.word_for(w, state, self.policy, now, lost=lost,
                                       unknown_since=self._unknown_since(w, state, now)) for w in workloads]

    def _unknown_since(self, workload: str, state: GateState, now: float) -> float | None:
        """When a backstop first asked about `workload`, which this remediator never heard of; None when known.
        Each such ask is counted (LLMVitalsBackstopUnknownWorkload), the first logged."""
        if gate_word.known(workload, state, self.policy, self.loop.reported):
            self._unknown.pop(workload, None)
            return None
        self.metrics.unknown_workload_asks.inc()
        if workload not in self._unknown:
            if len(self._unknown) >= UNKNOWN_MEMORY:  # bounded: a caller cannot grow it without end
                self._unknown.pop(next(iter(self._unknown)))
            self._unknown[workload] = now
            log_event(log, "backstop asked about an unknown workload", level=logging.WARNING, workload=workload[:200],
                      hold_seconds=gate_word.UNKNOWN_HOLD)
        return self._unknown[workload]

    def state_view(self) -> dict[str, Any]:
        """What the state holds as last seen (no I/O: the follower keeps a replica's view fresh), and
        whether it is lost: for GET /api/v1/state."""
        state, health = self.store.last, self.store.health
        return {"lost": health.lost or None, "up": health.up, **summary(state)}

    async def reinitialise(self, origin: str, reason: str, by: str) -> dict[str, Any]:
        """A human re-initialises the replicas' shared state (`origin`: `empty`, or `journal`: this
        replica's own SQLite state). Returns what it discarded and what it holds now. Raises
        StateUnavailable; ValueError when there is nothing to re-initialise or to import."""
        if not isinstance(self.store, LeaseStore):
            raise ValueError("this remediator keeps its state in its own SQLite file: it is never lost to"
                             " others, and there is no shared state to re-initialise")
        source = GateState()
        if origin == "journal":
            budget = self.settings.budget
            found = read_local_state(self.settings.state_path, budget.max_restarts, budget.window)
            if found is None:
                raise ValueError(f"{self.settings.state_path} holds no state to import")
            source = found
        discarded = await self.ledger.reinitialise(source, origin, reason, by)
        return {"discarded": discarded, "now": summary(self.store.last), "from": origin}


@asynccontextmanager
async def store_for(
    settings: Settings, kube: KubeClient | None, clock: Callable[[], float]
) -> AsyncIterator[GateStore[Any]]:
    """The gate's store the settings name: the replicas' Lease, else this replica's SQLite row (in
    the journal's file: open the journal first, it holds the file's lock)."""
    lease = settings.kubernetes.lease if settings.kubernetes else None
    if kube is not None and lease is not None:
        # Which state this replica has seen is kept beside its journal: a Lease deleted meanwhile is
        # then a lost state, never a fresh one (store.EpochMemory).
        memory = EpochMemory(Path(f"{settings.state_path}.lease-epoch.json"))
        yield LeaseStore(LeaseTransport(kube), lease, replica_identity(settings), settings.budget.window, clock,
                         memory, lambda: read_local_state(settings.state_path))
        return
    store = SqliteStore(settings.state_path, settings.budget.window, clock)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def replica_identity(settings: Settings) -> str:
    """This replica's name in the Lease and in Events: configured, $POD_NAME, else host name and pid."""
    if settings.kubernetes is not None and settings.kubernetes.identity:
        return settings.kubernetes.identity
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
