"""The gate loop, one alert at a time: decide once, commit once with its journal row, then carry out.

For one alert, each module entered once:
  1. the gate on this alert is started (`gate.on_alert`: one frame from its look to its decision,
     the shape of the exporter's read). Its look: steps 1-3 on the store's last state, without I/O
     and without a time (`gate.precheck`). Most of a storm ends here as `duplicate`, its row written
     by the ledger; the one alert whose restart holds the claim goes on, for the transaction to tell
     whether its claim lapsed. Every time is the store's (`GateStore.now`: replicas judge by the API
     server's clock);
  2. re-check through the exporter, or every exporter shard at once (`exporter_client`);
  3. under this replica's decision lock, the ledger's one transaction through the store's door
     (`GateStore.transact`): the state and the store's time read once, the decision on them
     (`state.alert_decided`: the gate of step 1 resumed on them, the state its effects make and, for
     a restart, the claim), committed at the version read (a conflict reads again and the gate
     rules again), then its journal row (ledger.py): a refusal queued, a restart's row committed
     before it runs;
  3b. a restart of a pod the exporter names commits nothing yet: the pod is read from the API
     server (identity.py: its UID, IP and node must match, its workload is read from its owners),
     and step 3 runs again on what the API server says, or the alert is refused `identity_mismatch`
     / `owner_pending` / `identity_unverified`;
  4. the committed decision is carried out (`acting.Actor.carry_out`): a restart runs in the
     background (its intent was durable before, so a crash from here on still counts against the
     cooldown and the budget), and ends through the ledger; a refusal a human must see becomes an
     Event. The answer waits for neither.

Between Alertmanager's re-sends the loop also looks on its own (`redecide`, holds.py): restarts no
remediator made are counted, and held targets whose hold ended are decided again, as step 1-4.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from itertools import chain
from typing import Protocol

from . import gate, holds, identity
from .acting import Actor
from .gate import Decision, GatePolicy
from .ledger import Ledger
from .model import AlertFacts, FleetView, TargetStatus, workload_of
from .store import StateUnavailable

log = logging.getLogger("llm_vitals.remediator")


class FleetSource(Protocol):
    async def fleet(self) -> FleetView | None:
        """The exporter's view of the whole fleet now, or None when it cannot be read."""
        ...


class IdentitySource(Protocol):
    async def check(self, status: TargetStatus) -> identity.Checked:
        """The status as the API server confirms it, or the refusal (pods.IdentityReader)."""
        ...


class GateLoop:
    """Decides alerts over a store: the same loop for one replica (SQLite) and for replicas (the Lease)."""

    def __init__(self, policy: GatePolicy, ledger: Ledger, exporter: FleetSource, actor: Actor,
                 identities: IdentitySource | None = None):
        self.policy, self.ledger, self.exporter, self.actor, self.identities = policy, ledger, exporter, actor, identities
        self.store = ledger.store
        self._decision_lock = asyncio.Lock()
        # The workloads the exporter reported at the last look (redecide): what a backstop may ask about.
        self.reported: frozenset[str] = frozenset()

    async def handle(self, facts: AlertFacts) -> Decision:
        """Decide one alert, commit and journal the decision, and carry it out."""
        if self.ledger.unresolved:  # restart intents whose commit's outcome is unknown: re-read first
            await self.ledger.resolve()
        # The gate on this alert, one frame from its look to the transaction's decision (gate.on_alert).
        # Its look, steps 1-3 on the state as last seen without I/O: most of a storm ends here as
        # `duplicate`, its row written by the ledger. The pause is not checked here: a paused refusal
        # holds the target (GateState.held), which is committed with the decision.
        gate_on_alert = gate.on_alert(facts, self.policy, self.store.last)
        looked = next(gate_on_alert)
        if looked is not None:
            return (await self.ledger.refused(facts, looked[0], None)).decision
        fleet = await self.exporter.fleet()
        status = fleet.targets.get(facts.target or "") if fleet is not None else None
        # A pod the exporter names is acted on only as the API server says it is (identity.py): the
        # first pass that would act asks for the check instead, and the gate decides again on what it says.
        checked = not (identity.names_a_pod(status) and self._checks(facts.target or ""))
        while True:
            async with self._decision_lock:
                committed = await self.ledger.decide(facts, fleet, status, checked, gate_on_alert.send)
                if not committed.needs_identity:
                    self.actor.carry_out(facts, committed, status)
                    return committed.decision
            assert status is not None and fleet is not None
            verdict = await self._checked(status)
            if verdict.status is None:
                refusal = verdict.refusal or Decision(False, "identity_mismatch", "no pod")
                return (await self.ledger.refused(facts, refusal, status)).decision
            status, checked = verdict.status, True
            fleet = replace(fleet, targets={**fleet.targets, facts.target or "": status})

    def _checks(self, target: str) -> bool:
        """Whether a pod the exporter names for `target` must be checked: always where this remediator
        can act on pods; without Kubernetes access a static target is restarted only by its own executor."""
        return self.identities is not None or target not in self.policy.targets

    async def _checked(self, status: TargetStatus) -> identity.Checked:
        if self.identities is None:
            return identity.Checked(None, gate.Decision(
                False, "identity_unverified", "the exporter names a pod and this remediator has no Kubernetes access"
                                              " to check it: never acted on"))
        return await self.identities.check(status)

    async def redecide(self) -> list[Decision]:
        """The remediator's own look between re-sends (holds.py): the restarts the exporter shows that no
        remediator made are counted, then each held target whose decision is another now is decided
        again, the longest held first, as a re-sent alert would be (one restart at a time all the same)."""
        fleet = await self.read_fleet()
        if fleet is None:
            return []
        try:
            state, _ = await self.store.read()  # fresh: a pause lifted on another replica a moment ago
            await self.ledger.restarts_seen(fleet, state)
        except StateUnavailable as exc:
            log.warning("cannot look at the held targets now: %s", exc)
            return []
        decisions = []
        for item in holds.due(self.store.last, fleet, self.policy, self.store.now()):
            decisions.append(await self.handle(item.held.facts(item.target)))
        return decisions

    async def read_fleet(self) -> FleetView | None:
        """The exporter's view now, and the workloads it reports kept (`reported`: what a backstop may ask about)."""
        fleet = await self.exporter.fleet()
        if fleet is not None:
            self.reported = frozenset(workload_of(t, s) for t, s in chain(fleet.targets.items(), fleet.withheld.items()))
        return fleet
