"""Acting on a decision: carry out the gate's plan, run the restart in the background, finish it.

The plan (`gate.Plan`) says what to act on (the static target, the pod or the group by UID, the
node to cordon with its taint) and for how long; it was decided once, by the gate. Here it only
becomes an executor, a claim and the pre_restart command: nothing is worked out again.

A committed restart runs in a task of its own, one at a time (the restart lock): first the
target's `pre_restart` command (bounded by its timeout, its output journaled), then the executor.
Its outcome goes to the journal and the metrics, and its claim on the gate's state is released.
The webhook answer never waits for any of it. A refusal a human must see (`gate.HUMAN_REFUSALS`)
becomes an Event on the target's pod, also in the background.

Two outcomes change the gate's state after the fact:
- a restart the API server refused outright did nothing: its commit is taken back
  (`shared.undone`: budget, cooldown, alert key, circuit, ladder step) and its journal row becomes
  the refusal, so that Alertmanager's next re-send of the alert is judged afresh. An eviction a
  PodDisruptionBudget forbids (429 naming it) is `disruption_budget`, with an Event on the pod and
  the streak its alert reads; any other 429 (a throttled API server) is `api_throttled`, no more;
- a cordon that succeeded marks its node (`shared.node_marked`); one that failed marks nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Coroutine
from typing import Any, cast

from llm_vitals.kube.client import KubeClient
from llm_vitals.logs import log_event

from . import shared
from .executors import ExecResult, Executor, run_argv
from .gate import HUMAN_REFUSALS, AlertFacts, Decision, GatePolicy, JournalState, Plan, Reason, TargetStatus
from .journal import Journal
from .metrics import RemediatorMetrics
from .pods import (
    CordonAndMoveExecutor,
    GroupExecutor,
    PodExecutor,
    PodRef,
    PodRemover,
    notes_seconds,
    pod_event,
    refusal_event_name,
)
from .policy import pre_restart_planned
from .settings import Settings
from .shared import Intent
from .store import GateStore, StateUnavailable, update

log = logging.getLogger("llm_vitals.remediator")

# How long a shutdown waits for a running restart before cancelling it.
SHUTDOWN_GRACE_SECONDS = 10.0
# A restart's claim outlives its timeouts by this much (a slow journal write, the clock).
CLAIM_MARGIN_SECONDS = 5.0
# How long a committed restart may wait for this replica's restart lock (another of its restarts
# finishing): past it, it does not run. The claim covers the wait.
LOCK_WAIT_SECONDS = 10.0


def claim_seconds(pre_restart: float, executor: float) -> float:
    """How long a restart's claim holds: the wait for the restart lock, the pre_restart command, the
    executor, its Events (pods.notes_seconds) and a margin: every part is bounded by its own limit,
    so the holder is done before the claim ends and no other replica starts meanwhile."""
    return LOCK_WAIT_SECONDS + pre_restart + executor + notes_seconds() + CLAIM_MARGIN_SECONDS


class Actor:
    """Runs committed restarts and refusal Events in background tasks; owns those tasks."""

    def __init__(
        self,
        settings: Settings,
        policy: GatePolicy,
        executors: dict[str, Executor],
        kube: KubeClient | None,
        identity: str,
        store: GateStore[Any],
        journal: Journal,
        metrics: RemediatorMetrics,
    ):
        self.settings = settings
        self.policy = policy
        self.executors = executors
        self.kube = kube
        self.identity = identity
        self.store = store
        self.journal = journal
        self.metrics = metrics
        self.remover = PodRemover(kube, settings.pod_action) if kube is not None else None
        self._restart_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        # The claims whose restart this process runs now (committed and started, not finished yet).
        self.running: set[str] = set()
        # Restarts that ended whose release could not be written: holder -> the workload it restarted.
        self.unreleased: dict[str, str | None] = {}
        self._evented: dict[tuple[tuple[str, float], str], None] = {}  # refusal Events sent, in order

    # -- choosing ---------------------------------------------------------------------------------

    def executor_for(self, facts: AlertFacts, decision: Decision, status: TargetStatus | None) -> Executor:
        """The executor that carries out the decision's plan: the static target's own, or one acting
        on the planned pod (or group, or node) by UID."""
        plan = decision.plan
        assert plan is not None, "only an allowed decision is acted on"
        if plan.action == "restart":
            return self.executors[plan.target]
        pod = planned_pod(plan)
        if self.remover is None or pod is None:
            return Unrunnable(f"target {plan.target}: the exporter names no pod (namespace, pod) for it")
        if plan.action == "cordon_and_move":
            assert plan.cause is not None and plan.taint is not None
            return CordonAndMoveExecutor(self.remover, pod, self.identity, plan.cause, plan.timeout, plan.taint)
        message = f"{facts.alertname}: restarted by llm-vitals (the exporter says {status.state if status else '?'})"
        if plan.group is not None:
            return GroupExecutor(self.remover, plan.group, pod, self.identity, message, plan.timeout)
        return PodExecutor(self.remover, pod, self.identity, message, plan.timeout)

    def claim(self, facts: AlertFacts, plan: Plan, now: float, state: JournalState) -> Intent:
        """This replica's claim on the planned restart, with what its commit replaces in `state` (to
        take it back if the API server refuses the restart outright). Where claims expire, it ends
        after the plan's pre_restart and executor timeouts: a replica that died mid-restart holds no
        one back for ever."""
        token = f"{self.identity}/{uuid.uuid4().hex[:12]}"
        before = shared.undo_of(state, plan.workload)
        if not self.store.claims_expire:
            return Intent(token, plan.target, None, plan.workload, now, before)
        # plan.claim_for is the pre_restart command's and the executor's timeouts; the claim also
        # covers the restart lock's wait and the Events (claim_seconds).
        expires = now + claim_seconds(0.0, plan.claim_for)
        return Intent(token, plan.target, expires, plan.workload, now, before)

    # -- restarts ---------------------------------------------------------------------------------

    def start(self, action_id: int, facts: AlertFacts, executor: Executor, intent: Intent,
              status: TargetStatus | None, plan: Plan) -> None:
        """Run the committed restart in the background; returns at once."""
        target = facts.target or ""
        self.running.add(intent.holder)
        self._background(self._run(action_id, facts, executor, intent, status, plan), f"restart-{target}")

    async def _run(
        self, action_id: int, facts: AlertFacts, executor: Executor, intent: Intent, status: TargetStatus | None,
        plan: Plan,
    ) -> None:
        try:
            await self._run_locked(action_id, facts, executor, intent, status, plan)
        finally:
            self.running.discard(intent.holder)  # its claim ended, or stays orphaned (`orphaned`)

    async def _run_locked(
        self, action_id: int, facts: AlertFacts, executor: Executor, intent: Intent, status: TargetStatus | None,
        plan: Plan,
    ) -> None:
        target = facts.target or ""
        try:
            async with asyncio.timeout(LOCK_WAIT_SECONDS):
                await self._restart_lock.acquire()
        except TimeoutError:
            late = ExecResult("error", f"another restart of this replica still held the restart lock after"
                                       f" {LOCK_WAIT_SECONDS:g}s; not run (the claim covers only that long a wait)")
            await self._finish(action_id, target, late, 0.0, intent.holder)
            return
        try:
            started = time.monotonic()
            try:
                await self._pre_restart(action_id, plan, status)
                result = await executor.restart()
            except asyncio.CancelledError:
                stopped = ExecResult("interrupted", "the remediator shut down during the restart")
                await self._finish(action_id, target, stopped, time.monotonic() - started, intent.holder)
                raise
            except Exception as exc:  # an executor bug must still end in the journal
                log.exception("executor failed")
                result = ExecResult("error", f"executor failed: {type(exc).__name__}")
            if result.cordoned is not None:
                await self._mark_node(result.cordoned)
            if result.refused is not None:
                await self._taken_back(action_id, facts, result, time.monotonic() - started, intent, status)
            else:
                ran = (intent.workload or target) if result.result == "ok" else None
                await self._finish(action_id, target, result, time.monotonic() - started, intent.holder, ran)
        finally:
            self._restart_lock.release()

    async def _pre_restart(self, action_id: int, plan: Plan, status: TargetStatus | None) -> None:
        """Run the planned target's pre_restart command, bounded by its timeout, and journal its output."""
        pre = pre_restart_planned(self.settings, plan.target, plan.template)
        if pre is None:
            return
        argv = fill_argv(pre.argv, plan.target, status)
        began = time.monotonic()
        result = await run_argv(argv, pre.timeout, pre.output_limit)
        record = {"argv": argv, "result": result.result, "output": result.detail,
                  "duration_seconds": round(time.monotonic() - began, 3)}
        try:
            await self.journal.record_pre_restart(action_id, record)
        except Exception:
            log.exception("cannot journal the pre_restart output")

    async def _finish(self, action_id: int, target: str, result: ExecResult, duration: float, holder: str,
                      ran: str | None = None) -> None:
        self.metrics.restarts.labels(target, result.result).inc()
        self.metrics.duration.labels(target).observe(duration)
        log_event(log, "restart finished", level=logging.INFO if result.result == "ok" else logging.WARNING,
                  target=target, action_id=action_id, result=result.result, duration_seconds=round(duration, 3),
                  detail=result.detail[:500])
        try:
            await self.journal.finish(action_id, result.result, result.detail, duration)
        except Exception:
            log.exception("cannot journal a restart's result")
        await self.release(holder, ran)

    async def _mark_node(self, node: str) -> None:
        """A cordon succeeded: the node is escalated once, until a human releases it."""
        try:
            await update(self.store, lambda state: shared.node_marked(state, node))
        except Exception:  # the cordon stands; the mark is only what stops a second one (logged loudly)
            log.exception("cannot mark node %s as cordoned in the gate's state", node)

    async def _taken_back(self, action_id: int, facts: AlertFacts, result: ExecResult, duration: float,
                          intent: Intent, status: TargetStatus | None) -> None:
        """The API server refused the restart outright (nothing happened): take its commit back,
        journal and count the refusal, and tell the pod (an Event)."""
        reason = result.refused or "disruption_budget"
        target = facts.target or ""
        log_event(log, "restart refused by the API server", level=logging.WARNING, target=target,
                  action_id=action_id, reason=reason, detail=result.detail[:500])
        self.metrics.decisions.labels(target, reason).inc()
        try:
            await self.journal.refuse_intent(action_id, reason, result.detail, duration)
        except Exception:
            log.exception("cannot journal a refused restart")
        workload = intent.workload or target

        def taken_back(state: JournalState) -> JournalState:
            # The hang is left as it is, on purpose: held (the kubelet too) until the remediator tries again.
            state = shared.held_for(shared.undone(state, intent, facts.key), facts, workload, reason, self.store.now())
            # Only a disruption budget starts or extends the streak its alert reads; a throttled API server does not.
            return shared.disruption_refused(state, workload, self.store.now()) if reason == "disruption_budget" else state

        try:
            await update(self.store, taken_back)
        except Exception as exc:
            # The claim expires (replicas) or is orphaned, ended by the next decision (one replica); the
            # budget and the cooldown stay spent: the safe side.
            log_event(log, "cannot take back a refused restart in the gate's state", level=logging.WARNING,
                      error=str(exc))
        if reason in HUMAN_REFUSALS:
            self.tell_refusal(facts, Decision(False, cast(Reason, reason), result.detail), status)

    def orphaned(self, state: JournalState) -> bool:
        """Whether `state` holds a claim that no restart of this process runs, in a store whose claims
        do not expire (one replica: every claim in its row is this process's). Its restart ended (or
        never started) and the claim's end could not be written: a conflict with this process's other
        commits, a failed write, a task cancelled. Asked under the decision lock, where no claim is
        between its commit and its start; the loop then ends it (`shared.claim_lapsed`)."""
        if self.store.claims_expire:
            return False
        holder = state.in_progress_by
        for gone in [h for h in self.unreleased if h != holder]:  # their claims ended
            del self.unreleased[gone]
        return holder is not None and holder not in self.running

    def ended(self, state: JournalState) -> JournalState:
        """`state` without its orphaned claim: released as its restart's end would have (a release not
        written), else lapsed (`shared.claim_lapsed`: its alert judged afresh, budget and cooldown spent)."""
        holder = state.in_progress_by
        if holder is not None and holder in self.unreleased:
            return shared.finished(state, holder, self.unreleased[holder])
        return shared.claim_lapsed(state)

    async def release(self, holder: str, ran: str | None = None) -> None:
        """End this replica's claim on the restart (the cooldown and the budget stay spent); `ran`:
        the workload it restarted, whose streak of disruption-budget refusals is over."""
        try:
            await update(self.store, lambda state: shared.finished(state, holder, ran))
            return
        except StateUnavailable as exc:
            # A claim that expires ends then; no other restart starts before.
            log_event(log, "cannot release the restart in the gate's state", level=logging.WARNING, error=str(exc))
        except Exception:
            # One replica: the claim is orphaned; the next decision ends it (`orphaned`).
            log.exception("cannot release the restart in the gate's state")
        if not self.store.claims_expire:
            self.unreleased[holder] = ran

    # -- refusals a human must see ----------------------------------------------------------------

    def tell_refusal(self, facts: AlertFacts, decision: Decision, status: TargetStatus | None) -> None:
        """One Event per alert and reason on the target's pod, in the background (never delays an answer).

        Alertmanager resends a refused alert (repeat_interval, the HA pair) to any replica: the
        Event's name comes from the pod, the reason and the alert, so the API server keeps the first
        copy and refuses the others. `_evented` only spares this replica the requests.
        """
        pod = pod_of(status)
        if self.kube is None or pod is None or (facts.key, decision.reason) in self._evented:
            return
        self._evented[(facts.key, decision.reason)] = None
        while len(self._evented) > 1000:
            del self._evented[next(iter(self._evented))]
        message = f"{facts.alertname} not acted on: {decision.reason}: {decision.detail}"
        name = refusal_event_name(pod.name, pod.uid, decision.reason, facts.key)
        self._background(pod_event(self.kube, pod, decision.reason, message, self.identity, name), "event")

    # -- tasks ------------------------------------------------------------------------------------

    def _background(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait_idle(self) -> None:
        """Wait for running restarts and Events (tests and shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def shutdown(self) -> None:
        """Give a running restart a grace period, then cancel it (journaled as interrupted)."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(list(self._tasks), timeout=SHUTDOWN_GRACE_SECONDS)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def planned_pod(plan: Plan) -> PodRef | None:
    """The pod the plan acts on (by its UID), or None when the exporter named none."""
    if not plan.namespace or not plan.pod:
        return None
    return PodRef(plan.namespace, plan.pod, plan.pod_uid, plan.node)


def pod_of(status: TargetStatus | None) -> PodRef | None:
    """The target's own pod as the exporter reported it, or None for a target that is not a pod."""
    if status is None or not status.namespace or not status.pod:
        return None
    return PodRef(status.namespace, status.pod, status.pod_uid, status.node)


_PLACEHOLDERS = ("name", "namespace", "pod", "node")


def fill_argv(argv: list[str], target: str, status: TargetStatus | None) -> list[str]:
    """Replace `{name}`, `{namespace}`, `{pod}`, `{node}` with the exporter's values (empty when unknown)."""
    values = {"name": target, "namespace": "", "pod": "", "node": ""}
    if status is not None:
        values.update(namespace=status.namespace or "", pod=status.pod or "", node=status.node or "")
    out = []
    for arg in argv:
        for key in _PLACEHOLDERS:
            arg = arg.replace("{" + key + "}", values[key])
        out.append(arg)
    return out


class Unrunnable:
    """An executor that cannot run (a template target the exporter gives no pod for): journaled as error."""

    kind = "kubernetes_pod"
    timeout = 0.0

    def __init__(self, why: str):
        self.why = why

    async def restart(self) -> ExecResult:
        return ExecResult("error", self.why)
