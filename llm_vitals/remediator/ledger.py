"""The one door for writes: every change to the gate's state is committed here, with its journal row.

A write is one method. Its change is a pure transition (state.py) committed through the store's
door (`GateStore.transact`: the state and the store's time read once, the step applied, its state
committed at the version read, again on a conflict); its journal row says what
it was, with the exporter's evidence, a count in the metrics and a log line. Nothing else in the
remediator writes the state or the journal:

- an alert's decision (`decide`): the gate's decision on the state read and the state its effects
  make (`state.alert_decided`, pure), committed once; then its row: a refusal queued for the journal's
  group commit (its answer never waits for the disk), a restart's row (result `pending`) committed
  before the restart runs. A commit whose answer was lost (`Ambiguous`) is re-read: its intent is
  carried out once, or released (`resolve`), never left a `duplicate` for good;
- a decision made without a commit (`refused`: a duplicate on the state as last seen, asked by the
  loop's `gate.precheck`, the pod not
  confirmed by the API server): its row, and the end of the target's hold where it is one;
- a restart's end (`finished`): its result on its row, then one commit releasing its claim and
  marking the node it cordoned; a restart the API server refused outright (`taken_back`): its row
  becomes that refusal, its commit is taken back and its target held;
- restarts no remediator made, as the exporter shows them (`restarts_seen`);
- a human's pause, circuit reset, node or workload release, and re-initialisation of the Lease.

The state is committed before its row is written: a crash between the two leaves a restart's claim
without its row (the SQLite store ends it at the next start, the Lease's expires), never a row for
a restart that no claim held back.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

from llm_vitals.logs import log_event

from . import gate, gate_word, holds
from .executors import ExecResult
from .gate import Decision, GatePolicy, Plan, Rule
from .journal import Journal
from .metrics import UNKNOWN_TARGET, RemediatorMetrics
from .model import AlertFacts, Claim, FleetView, GateState, Intent, TargetStatus, workload_of
from .pods import CordonAndMoveExecutor, GroupExecutor, PodExecutor
from .state import (
    Committed,
    OwnClaims,
    alert_decided,
    circuit_opened,
    circuits_reset,
    disruption_refused,
    held_for,
    node_cordoned,
    node_released,
    paused_state,
    restart_ended,
    restart_seen,
    seen_kept,
    undone,
    unheld,
    workload_released,
)
from .store import Ambiguous, GateStore, StateLost, StateUnavailable
from .store.lease import LeaseStore

log = logging.getLogger("llm_vitals.remediator")

# The journal's `executor` of a plan acting on pods (the static target's own is its executor's kind).
POD_EXECUTORS: Mapping[str, str] = {"restart_pod": PodExecutor.kind, "restart_group": GroupExecutor.kind,
                                    "cordon_and_move": CordonAndMoveExecutor.kind}


T = TypeVar("T")


async def transact(store: GateStore[Any], step: Callable[[GateState], tuple[T, GateState]]) -> T:
    """The store's door (`GateStore.transact`) for a step that needs no time: the state in, its result
    and the new state out. Raises StateUnavailable."""
    return await store.transact(lambda state, now: step(state))


async def update(store: GateStore[Any], change: Callable[[GateState], GateState]) -> GateState:
    """Apply a pure `change` to the state, retried on conflicts. Returns the state committed."""

    def step(state: GateState) -> tuple[GateState, GateState]:
        new = change(state)
        return new, new

    return await transact(store, step)


class Ledger:
    """Commits the gate's state and writes the journal, each change with its row."""

    def __init__(
        self, store: GateStore[Any], journal: Journal, metrics: RemediatorMetrics, policy: GatePolicy,
        clock: Callable[[], float], identity: str, claim_margin: float, executor_kinds: Mapping[str, str],
    ):
        self.store = store
        self.journal = journal
        self.metrics = metrics
        self.policy = policy
        self.clock = clock  # the time of a human's rows (an alert's are the store's: `now` of its decision)
        self.identity = identity
        # How long a claim outlives its plan's timeouts (acting.claim_seconds); claims expire only where
        # the store says they must (replicas: a replica that died mid-restart holds no one back for ever).
        self.claim_margin = claim_margin
        self.executor_kinds = executor_kinds  # each static target's executor's kind, for its restart's row
        # Restart intents whose commit's outcome is not known yet (its answer lost, the state unreadable
        # since), with their alert's key: re-read at each alert until carried out or released.
        self.unresolved: dict[str, tuple[Intent, tuple[str, float]]] = {}
        # The claims this process committed whose restart's end is not written yet (one replica: every
        # claim in its row is this process's), and those ended whose release could not be written:
        # holder -> the workload it restarted. A claim in neither is orphaned (`state.orphan_ended`).
        self.running: set[str] = set()
        self.unreleased: dict[str, str | None] = {}

    # -- an alert's decision ------------------------------------------------------------------

    async def decide(self, facts: AlertFacts, fleet: FleetView | None, status: TargetStatus | None,
                     checked: bool, rule: Rule) -> Committed:
        """Decide the alert on the state read (`rule`: the gate on this alert, `gate.on_alert`), commit
        the state its effects make, and write its row. A restart of a pod not `checked` yet commits
        nothing: it asks for the identity check first."""
        claim = Claim(f"{self.identity}/{uuid.uuid4().hex[:12]}", self.claim_margin if self.store.claims_expire else None)
        # This process's own claims as they are when the step runs (a conflict steps again, later).
        own = None if self.store.claims_expire else OwnClaims(self.running, self.unreleased)
        step = partial(alert_decided, facts, fleet, rule, claim, checked, own)
        try:
            committed = self._found(await self.store.transact(step))
        except Ambiguous as exc:
            landed = await self._landed(self._found(exc.result), facts)
            if landed is None:
                return await self.refused(facts, Decision(False, "state_unreachable", str(exc)[:500]), status)
            committed = landed
        except StateLost as exc:
            return await self.refused(facts, Decision(False, "state_lost", str(exc)[:500]), status)
        except StateUnavailable as exc:
            return await self.refused(facts, Decision(False, "state_unreachable", str(exc)[:500]), status)
        if committed.needs_identity:
            return committed
        if committed.intent is None:
            self._decided_row(facts, committed.decision, committed.now, status)
            return committed
        self.running.add(committed.intent.holder)
        try:
            action_id = await self._intent_row(facts, committed, status)
        except Exception:
            # Nothing will run: the commit is taken back, so that the re-send is judged afresh (never a
            # `duplicate` of a restart that did not happen).
            await self._release(committed.intent, facts.key)
            raise
        return replace(committed, action_id=action_id)

    def _found(self, committed: Committed) -> Committed:
        """Forget the ended claims the decision no longer found (`state.alert_decided`: their release
        is written or lapsed), and say so where it ended an orphaned one (one replica: a claim no
        restart of this process runs, released as its end would have been, else lapsed)."""
        for gone in [h for h in self.unreleased if h != committed.found]:
            del self.unreleased[gone]
        if committed.orphaned:
            log.warning("a restart's claim outlived its restart (%s): ended", committed.found)
        return committed

    async def refused(self, facts: AlertFacts, decision: Decision, status: TargetStatus | None) -> Committed:
        """A refusal made without the transaction (on the state as last seen, or at the loop's edges):
        its row and, when it is no longer a hang the gate may act on, the end of the target's hold."""
        committed = Committed(decision, self.store.now())
        self._decided_row(facts, decision, committed.now, status)
        target = facts.target or ""
        if decision.reason in gate.UNHOLDING and target in self.store.last.held:
            try:
                await update(self.store, lambda state: unheld(state, target))
            except StateUnavailable as exc:  # the next re-decision ends it (redecide.py), or its memory does
                log.warning("cannot end the hold of %s now: %s", target, exc)
        return committed

    def _decided_row(self, facts: AlertFacts, decision: Decision, now: float, status: TargetStatus | None) -> None:
        """A decision that starts nothing (refused, dry_run, paused, resolved): queued, never awaited."""
        # A target's name from the payload becomes a label only when the config or the exporter knows it.
        known = facts.target in self.policy.targets or (status is not None and decision.reason != "unknown_target")
        target = facts.target if known else None
        actor = None  # who restarted the server meanwhile, when the decision is about such a restart
        if decision.reason == "restarted_since_alert":
            actor = gate_word.restart_actor(status, self.store.last, workload_of(facts.target or "", status),
                                           facts.starts_at)
        word = decision.word
        self.journal.record_decision(now, facts, word, decision.reason, decision.detail, **evidence_of(target, status),
                                     actor=actor)
        self.metrics.decisions.labels(target or UNKNOWN_TARGET, decision.reason).inc()
        log_event(log, "alert decided", level=logging.DEBUG if decision.reason == "duplicate" else logging.INFO,
                  target=target, fingerprint=facts.fingerprint, decision=word, reason=decision.reason,
                  detail=decision.detail)

    async def _intent_row(self, facts: AlertFacts, committed: Committed, status: TargetStatus | None) -> int:
        """A restart about to run: its row (result `pending`) committed, its id returned for `finished`."""
        decision = committed.decision
        assert decision.plan is not None
        executor = self.executor_kind(decision.plan)
        action_id = await self.journal.record_intent(committed.now, facts, executor, reason=decision.reason,
                                                     detail=decision.detail,
                                                     **evidence_of(facts.target, status, decision.plan.workload))
        self.metrics.decisions.labels(facts.target, decision.reason).inc()
        log_event(log, "restart allowed", target=facts.target, fingerprint=facts.fingerprint, action_id=action_id,
                  executor=executor, reason=decision.reason)
        return action_id

    def executor_kind(self, plan: Plan) -> str:
        """The journal's `executor` of a plan: the static target's own executor, else the pod action's."""
        return self.executor_kinds[plan.target] if plan.action == "restart" else POD_EXECUTORS[plan.action]

    # -- commits whose answer was lost --------------------------------------------------------

    async def _landed(self, committed: Committed, facts: AlertFacts) -> Committed | None:
        """A commit whose answer was lost: re-read. Its intent is there: carry it out (the decision
        returned, once). It is not: nothing was committed, the decision is a plain refusal (retry-safe).
        The state unreadable: the intent waits in `unresolved`, and None is answered (state_unreachable)."""
        if committed.intent is None:
            return committed  # a refusal stands whether or not its marks were written
        try:
            state, _ = await self.store.read()
        except StateUnavailable:
            self._unresolved(committed.intent, facts.key)
            return None
        if state.in_progress_by == committed.intent.holder:
            log.warning("a commit's answer was lost but it holds: carrying out its restart once (%s)", facts.target)
            return committed
        return None

    async def resolve(self) -> None:
        """Re-read the intents whose outcome is unknown: one that holds now, too late to carry out, is
        released (state.undone: its alert judged afresh); one that is absent is forgotten."""
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
        self.running.discard(intent.holder)
        try:
            await update(self.store, lambda state: undone(state, intent, key))
        except StateUnavailable:
            self._unresolved(intent, key)
            return
        self.unresolved.pop(intent.holder, None)
        self.store.health.unresolved = len(self.unresolved)

    def _unresolved(self, intent: Intent, key: tuple[str, float]) -> None:
        self.unresolved[intent.holder] = (intent, key)
        self.store.health.unresolved = len(self.unresolved)

    # -- a restart's end ----------------------------------------------------------------------

    async def pre_restart(self, action_id: int, record: Mapping[str, Any]) -> None:
        """The output of the target's pre_restart command, kept with its restart's row."""
        try:
            await self.journal.record_pre_restart(action_id, record)
        except Exception:
            log.exception("cannot journal the pre_restart output")

    async def finished(self, action_id: int, target: str, result: ExecResult, duration: float, intent: Intent) -> None:
        """The restart ended: its result on its row, then its claim released in one commit with the node
        it cordoned (cordoned once, until a human releases it). The cooldown and the budget stay spent;
        a restart that ran ends its workload's streak of disruption-budget refusals."""
        self.metrics.restarts.labels(target, result.result).inc()
        self.metrics.duration.labels(target).observe(duration)
        log_event(log, "restart finished", level=logging.INFO if result.result == "ok" else logging.WARNING,
                  target=target, action_id=action_id, result=result.result, duration_seconds=round(duration, 3),
                  detail=result.detail[:500])
        try:
            await self.journal.finish(action_id, result.result, result.detail, duration)
        except Exception:
            log.exception("cannot journal a restart's result")
        ran = (intent.workload or target) if result.result == "ok" else None
        node = result.cordoned
        self.running.discard(intent.holder)
        try:
            await self.store.transact(partial(restart_ended, intent.holder, ran, node))
            return
        except StateUnavailable as exc:
            # A claim that expires ends then; no other restart starts before. A cordon not marked stands,
            # and only its mark stops a second one: said loudly.
            log_event(log, "cannot release the restart in the gate's state", level=logging.WARNING, error=str(exc),
                      cordoned=node)
        except Exception:
            # One replica: the claim is orphaned; the next decision ends it (`state.orphan_ended`).
            log.exception("cannot release the restart in the gate's state (cordoned: %s)", node)
        if not self.store.claims_expire:
            self.unreleased[intent.holder] = ran

    async def taken_back(self, action_id: int, facts: AlertFacts, result: ExecResult, duration: float,
                         intent: Intent) -> None:
        """The API server refused the restart outright (nothing happened): its row becomes the refusal,
        counted; its commit is taken back and the target held (the kubelet too) until the remediator
        tries again. Only a disruption budget starts or extends the streak its alert reads."""
        reason = result.refused or "disruption_budget"
        target = facts.target or ""
        log_event(log, "restart refused by the API server", level=logging.WARNING, target=target,
                  action_id=action_id, reason=reason, detail=result.detail[:500])
        self.metrics.decisions.labels(target, reason).inc()
        try:
            await self.journal.refuse_intent(action_id, reason, result.detail, duration)
        except Exception:
            log.exception("cannot journal a refused restart")
        workload, node, now = intent.workload or target, result.cordoned, self.store.now()
        self.running.discard(intent.holder)  # a take-back not written leaves an orphaned claim, lapsed later

        def change(state: GateState) -> GateState:
            state = held_for(undone(state, intent, facts.key), facts, workload, reason, now)
            state = node_cordoned(state, node) if node is not None else state
            return disruption_refused(state, workload, now) if reason == "disruption_budget" else state

        try:
            await update(self.store, change)
        except Exception as exc:
            # The claim expires (replicas) or ends at the next start (one replica); the budget and the
            # cooldown stay spent: the safe side.
            log_event(log, "cannot take back a refused restart in the gate's state", level=logging.WARNING,
                      error=str(exc), cordoned=node)

    # -- restarts no remediator made ----------------------------------------------------------

    async def restarts_seen(self, fleet: FleetView, last: GateState) -> None:
        """Count the restarts no remediator made in their workloads' budgets, once each (holds.py), each
        counted one with its row. Raises StateUnavailable."""
        present = set(gate.managed_targets(self.policy, fleet))
        if not holds.outside_restarts(last, fleet, self.policy) and set(last.seen_restarts) <= present:
            return
        now = self.store.now()

        def step(state: GateState) -> tuple[list[holds.Seen], GateState]:
            found = holds.outside_restarts(state, fleet, self.policy)
            new = seen_kept(state, present)
            for seen in found:
                new = restart_seen(new, seen.target, seen.workload, seen.at, seen.actor is not None,
                                   self.policy.backoff_initial > 0)
                if (seen.actor is not None and seen.workload not in new.open_circuits
                        and gate.restarts_in_window(new, self.policy, seen.workload, now) >= self.policy.max_restarts):
                    new = circuit_opened(new, seen.workload)
            return found, new

        for seen in await transact(self.store, step):
            if seen.actor is not None and seen.at is not None:
                self._restart_seen_row(seen, now)

    def _restart_seen_row(self, seen: holds.Seen, now: float) -> None:
        assert seen.actor is not None and seen.at is not None
        detail = (f"the exporter saw {seen.target} restart at {seen.at:.0f}, not by a remediator: it counts in"
                  f" {seen.workload}'s budget, circuit and backoff")
        self.journal.record_decision(now, AlertFacts("", {"target": seen.target}, "", 0.0), "restart_seen",
                                     "outside_restart", detail, **evidence_of(seen.target, seen.status), actor=seen.actor)
        self.metrics.outside_restarts.labels(seen.actor).inc()
        log_event(log, "restart seen", target=seen.target, workload=seen.workload, actor=seen.actor, at=seen.at)

    # -- a human's actions --------------------------------------------------------------------

    async def reset_circuits(self, workloads: list[str]) -> list[str]:
        """Close the circuits of `workloads` (state.circuits_reset). Returns those that were open.
        Raises StateUnavailable."""
        was_open = await transact(self.store, lambda state: (
            [w for w in workloads if w in state.open_circuits], circuits_reset(state, workloads)))
        await self.journal.record_circuit_reset(workloads, self.clock())
        log_event(log, "circuits reset", workloads=workloads, were_open=was_open)
        return was_open

    async def release_node(self, node: str) -> bool:
        """Forget that llm-vitals cordoned `node`. Returns whether it had. Raises StateUnavailable."""
        was_cordoned = await transact(self.store, lambda state: (node in state.cordoned_nodes,
                                                                 node_released(state, node)))
        await self.journal.record_node_release(node, was_cordoned, self.clock())
        log_event(log, "node released", node=node, was_escalated=was_cordoned)
        return was_cordoned

    async def release_workload(self, workload: str) -> bool:
        """End the workload's page and start its ladder again. Returns whether it was paged. Raises StateUnavailable."""
        was_paged = await transact(self.store, lambda state: (gate.paged(state, workload),
                                                              workload_released(state, workload)))
        await self.journal.record_workload_release(workload, was_paged, self.clock())
        log_event(log, "workload released", workload=workload, was_paged=was_paged)
        return was_paged

    async def set_pause(self, until: float | None, reason: str) -> GateState:
        """Pause (or, with `until` None, resume) every replica. Returns the state committed. Raises StateUnavailable."""
        state = await update(self.store, lambda state: paused_state(state, until, reason))
        await self.journal.record_pause(self.clock(), until, reason)
        log_event(log, "paused" if until is not None else "resumed", until=until, reason=reason)
        return state

    async def reinitialise(self, source: GateState, origin: str, reason: str, by: str) -> dict[str, Any]:
        """A human's re-initialisation of the replicas' Lease from `source` (origin: `empty`, or `journal`),
        with its row. Returns what it discarded. Raises StateUnavailable."""
        assert isinstance(self.store, LeaseStore), "only the replicas' Lease is re-initialised"
        discarded = await self.store.reinitialise(source, by, reason, origin)
        await self.journal.record_state_reinit(self.clock(), f"shared state re-initialised from {origin} by {by}:"
                                               f" {reason}", discarded)
        log_event(log, "shared state re-initialised", level=logging.WARNING, origin=origin, reason=reason,
                  by=by, discarded=discarded)
        return discarded


def evidence_of(target: str | None, status: TargetStatus | None, workload: str | None = None) -> dict[str, Any]:
    """The journal's evidence columns for a decision made on `status` (nothing when the exporter had
    none), and the workload it counted against (`workload`: the plan's, worked out by the gate)."""
    if status is None:
        return {"evidence": None, "evidence_from": None, "workload": None}
    raw: Mapping[str, Any] = status.raw
    return {"evidence": raw, "evidence_from": status.source, "workload": workload or workload_of(target or "", status)}
