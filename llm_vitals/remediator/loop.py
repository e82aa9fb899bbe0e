"""The gate loop: decide -> commit -> act, one alert at a time, over any `store.GateStore`.

For one alert:
  1. steps 1-3 of the gate on the store's last state, without I/O (most of a storm ends here as
     `duplicate`); the pause is decided in step 3, as it holds the target (`JournalState.held`);
     every time here is the store's (`GateStore.now`: replicas judge by the API server's clock);
  2. re-check through the exporter, or every exporter shard at once (shared in-flight reads);
  3. under this replica's decision lock: read the state and its version, decide (the pure gate),
     and commit the state the decision's effects make, at that version. A conflict (another
     replica, or another task of this one, committed first) reads again and decides again;
  3b. a restart of a pod the exporter names commits nothing yet: the pod is read from the API
     server (identity.py: its UID, IP and node must match, its workload is read from its owners),
     and step 3 runs again on what the API server says, or the alert is refused `identity_mismatch`
     / `owner_pending` / `identity_unverified`;
  4. a committed restart gets its journal row, then runs in the background (`acting.Actor`): its
     intent was durable before, so a crash from here on still counts against the cooldown and the
     budget. A refusal is queued for the journal; the answer waits for neither.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from itertools import chain
from typing import Any, Protocol

from . import gate, gate_word, holds, identity, shared
from .acting import Actor
from .evidence import Evidence
from .executors import Executor
from .gate import AlertFacts, Decision, FleetView, GatePolicy, JournalState, TargetStatus
from .shared import Intent
from .store import Ambiguous, GateStore, StateLost, StateUnavailable, transact, update

log = logging.getLogger("llm_vitals.remediator")


class FleetSource(Protocol):
    async def fleet(self) -> FleetView | None:
        """The exporter's view of the whole fleet now, or None when it cannot be read."""
        ...


@dataclass(frozen=True)
class Decided:
    """One pass of the gate over a state: the decision, when it was made, and for a restart the
    executor chosen and the claim committed with it."""

    decision: Decision
    now: float
    executor: Executor | None = None
    intent: Intent | None = None
    needs_identity: bool = False  # it would act on a pod the API server has not confirmed yet


class IdentitySource(Protocol):
    async def check(self, status: TargetStatus) -> identity.Checked:
        """The status as the API server confirms it, or the refusal (pods.IdentityReader)."""
        ...


class GateLoop:
    """Decides alerts over a store: the same loop for one replica (SQLite) and for replicas (the Lease)."""

    def __init__(
        self,
        policy: GatePolicy,
        store: GateStore[Any],
        exporter: FleetSource,
        actor: Actor,
        evidence: Evidence,
        clock: Callable[[], float],
        identities: IdentitySource | None = None,
    ):
        self.policy = policy
        self.identities = identities
        self.store = store
        self.exporter = exporter
        self.actor = actor
        self.evidence = evidence
        self.clock = clock
        self._decision_lock = asyncio.Lock()
        # Restart intents whose commit's outcome is not known yet (its answer lost, the state unreadable
        # since), with their alert's key: re-read at each alert until carried out or released.
        self.unresolved: dict[str, tuple[Intent, tuple[str, float]]] = {}
        # The workloads the exporter reported at the last look (redecide): what a backstop may ask about.
        self.reported: frozenset[str] = frozenset()

    async def handle(self, facts: AlertFacts) -> Decision:
        """Decide one alert, journal the decision, and start the restart when it is allowed."""
        now = self.store.now()
        if self.unresolved:
            await self.resolve()
        # The pause is not checked here: a paused refusal holds the target (JournalState.held), which is
        # committed with the decision under the lock.
        refused = gate.precheck(facts, shared.claim_lapsed(self.store.last, now), self.policy)
        if refused is not None:
            self._refused(facts, refused, now, None)
            if refused.reason in gate.UNHOLDING and (facts.target or "") in self.store.last.held:
                await self._unhold(facts)
            return refused
        fleet = await self.exporter.fleet()
        status = fleet.targets.get(facts.target or "") if fleet is not None else None
        # A pod the exporter names is acted on only as the API server says it is (identity.py): the
        # first pass that would act asks for the check instead, and the gate decides again on what it says.
        checked = not (identity.names_a_pod(status) and self._checks(facts.target or ""))
        while True:
            async with self._decision_lock:
                try:
                    decided = await transact(self.store, partial(self._decide, facts, fleet, status, checked))
                except Ambiguous as exc:
                    landed = await self._landed(exc.result, facts)
                    if landed is None:
                        decision = Decision(False, "state_unreachable", str(exc)[:500])
                        self._refused(facts, decision, self.store.now(), status)
                        return decision
                    decided = landed
                except StateUnavailable as exc:
                    lost = isinstance(exc, StateLost)
                    decision = Decision(False, "state_lost" if lost else "state_unreachable", str(exc)[:500])
                    self._refused(facts, decision, self.store.now(), status)
                    return decision
                if not decided.needs_identity:
                    return await self._carry_out(facts, decided, status)
            assert status is not None and fleet is not None
            verdict = await self._checked(status)
            if verdict.status is None:
                refusal = verdict.refusal or Decision(False, "identity_mismatch", "no pod")
                self._refused(facts, refusal, self.store.now(), status)
                return refusal
            status, checked = verdict.status, True
            fleet = replace(fleet, targets={**fleet.targets, facts.target or "": status})

    async def _carry_out(self, facts: AlertFacts, decided: Decided, status: TargetStatus | None) -> Decision:
        """Journal the decision; start the restart it committed (under the decision lock)."""
        if decided.executor is None or decided.intent is None:
            self._refused(facts, decided.decision, decided.now, status)
            return decided.decision
        try:
            action_id = await self.evidence.restart(facts, decided.decision, decided.now, decided.executor.kind, status)
        except Exception:
            # Nothing will run: the commit is taken back, so that the re-send is judged afresh (never a
            # `duplicate` of a restart that did not happen).
            await self._release(decided.intent, facts.key)
            raise
        assert decided.decision.plan is not None
        self.actor.start(action_id, facts, decided.executor, decided.intent, status, decided.decision.plan)
        return decided.decision

    async def _landed(self, decided: Decided, facts: AlertFacts) -> Decided | None:
        """A commit whose answer was lost: re-read. Its intent is there: carry it out (the decision
        returned, once). It is not: nothing was committed, the decision is a plain refusal (retry-safe).
        The state unreadable: the intent waits in `unresolved`, and None is answered (state_unreachable)."""
        if decided.intent is None:
            return decided  # a refusal stands whether or not its marks were written
        try:
            state, _ = await self.store.read()
        except StateUnavailable:
            self._unresolved(decided.intent, facts.key)
            return None
        if state.in_progress_by == decided.intent.holder:
            log.warning("a commit's answer was lost but it holds: carrying out its restart once (%s)", facts.target)
            return decided
        return None

    async def resolve(self) -> None:
        """Re-read the intents whose outcome is unknown: one that holds now, too late to carry out, is
        released (shared.undone: its alert judged afresh); one that is absent is forgotten."""
        for holder, (intent, key) in list(self.unresolved.items()):
            try:
                state, _ = await self.store.read()
            except StateUnavailable:
                return
            if state.in_progress_by == holder:
                await self._release(intent, key)
            else:
                self.unresolved.pop(holder, None)
            self.store.health.unresolved = len(self.unresolved)

    async def _release(self, intent: Intent, key: tuple[str, float]) -> None:
        """Take back a committed intent that was not carried out; one that cannot be, waits unresolved."""
        try:
            await update(self.store, lambda state: shared.undone(state, intent, key))
        except StateUnavailable:
            self._unresolved(intent, key)
            return
        self.unresolved.pop(intent.holder, None)
        self.store.health.unresolved = len(self.unresolved)

    def _unresolved(self, intent: Intent, key: tuple[str, float]) -> None:
        self.unresolved[intent.holder] = (intent, key)
        self.store.health.unresolved = len(self.unresolved)

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

    def _decide(
        self, facts: AlertFacts, fleet: FleetView | None, status: TargetStatus | None, checked: bool,
        state: JournalState,
    ) -> tuple[Decided, JournalState]:
        """One pass of the pure gate over `state`: the decision, and the state its effects make.
        A restart of a pod not `checked` yet commits nothing: it asks for the identity check first."""
        now = self.store.now()
        state = shared.claim_lapsed(state, now)
        if self.actor.orphaned(state):
            # One replica's claim whose restart is over and whose release was never written: ended now,
            # never held for ever (its budget and cooldown spent).
            log.warning("a restart's claim outlived its restart (%s): ended", state.in_progress)
            state = self.actor.ended(state)
        decision = gate.decide(facts, fleet, state, self.policy, now)
        # A dry run runs every check a live run does, the identity included: its "would restart" is then true.
        if (decision.allowed or decision.reason == "dry_run") and not checked:
            return Decided(decision, now, needs_identity=True), state
        effects = gate.effects_of(decision, facts, fleet, state, self.policy, now)
        decided = Decided(decision, now)
        if decision.allowed and decision.plan is not None:
            # The gate's plan, carried out: its executor, and a claim for as long as it may take.
            executor = self.actor.executor_for(facts, decision, status)
            decided = Decided(decision, now, executor, self.actor.claim(facts, decision.plan, now, state))
        return decided, shared.with_effects(state, effects, facts, now, decided.intent)

    def _refused(self, facts: AlertFacts, decision: Decision, now: float, status: TargetStatus | None) -> None:
        workload = gate.workload_of(facts.target or "", status)
        actor = None
        if decision.reason == "restarted_since_alert":
            actor = gate_word.restart_actor(status, self.store.last, workload, facts.starts_at)
        self.evidence.decided(facts, decision, now, status, actor=actor)
        if decision.reason in gate.HUMAN_REFUSALS:
            self.actor.tell_refusal(facts, decision, status)

    async def _unhold(self, facts: AlertFacts) -> None:
        """The held target's alert resolved (or is no longer the gate's): its hold ends, for every replica."""
        target = facts.target or ""

        def step(state: JournalState) -> tuple[None, JournalState]:
            return None, shared.unheld(state, target)

        try:
            await transact(self.store, step)
        except StateUnavailable as exc:  # the next re-decision ends it (redecide.py), or its memory does
            log.warning("cannot end the hold of %s now: %s", target, exc)

    async def redecide(self) -> list[Decision]:
        """The remediator's own look between re-sends (holds.py): the restarts the exporter shows that no
        remediator made are counted, then each held target whose decision is another now is decided
        again, the longest held first, as a re-sent alert would be (one restart at a time all the same)."""
        fleet = await self.read_fleet()
        if fleet is None:
            return []
        try:
            state, _ = await self.store.read()  # fresh: a pause lifted on another replica a moment ago
            await self._count_restarts(fleet, state)
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
            self.reported = frozenset(gate.workload_of(t, s) for t, s in chain(fleet.targets.items(),
                                                                                fleet.withheld.items()))
        return fleet

    async def _count_restarts(self, fleet: FleetView, last: JournalState) -> None:
        """Count the restarts no remediator made in their workloads' budgets, once each (holds.py)."""
        present = set(gate.managed_targets(self.policy, fleet))
        if not holds.outside_restarts(last, fleet, self.policy) and set(last.seen_restarts) <= present:
            return
        now = self.store.now()

        def step(state: JournalState) -> tuple[list[holds.Seen], JournalState]:
            found = holds.outside_restarts(state, fleet, self.policy)
            new = shared.seen_kept(state, present)
            for seen in found:
                new = shared.restart_seen(new, seen.target, seen.workload, seen.at, seen.actor is not None,
                                          self.policy.backoff_initial > 0)
                if (seen.actor is not None and seen.workload not in new.open_circuits
                        and gate.restarts_in_window(new, self.policy, seen.workload, now) >= self.policy.max_restarts):
                    new = shared.circuit_opened(new, seen.workload)
            return found, new

        for seen in await transact(self.store, step):
            if seen.actor is not None and seen.at is not None:
                self.evidence.restart_seen(seen.target, seen.workload, seen.at, seen.actor, seen.status, now)
