"""Acting on a committed decision: carry out the gate's plan, run the restart in the background.

The plan (`gate.Plan`) says what to act on (the static target, the pod or the group by UID, the
node to cordon with its taint) and for how long; it was decided once, by the gate, and committed
with its claim and its journal row (ledger.py) before it reaches here. Here it only becomes an
executor and the pre_restart command: nothing is worked out again, and nothing is written but
through the ledger.

A committed restart runs in a task of its own, one at a time (the restart lock): first the
target's `pre_restart` command (bounded by its timeout, its output journaled), then the executor.
Its outcome goes to the ledger (`finished`: its row, its claim released, the node it cordoned
marked). The webhook answer never waits for any of it. A refusal a human must see
(`gate.HUMAN_REFUSALS`) becomes an Event on the target's pod, also in the background.

A restart the API server refused outright did nothing: the ledger takes its commit back
(`taken_back`: budget, cooldown, alert key, circuit, ladder step) and its row becomes the refusal,
so that the next re-send of the alert is judged afresh. An eviction a PodDisruptionBudget forbids
(429 naming it) is `disruption_budget`, with an Event on the pod and the streak its alert reads;
any other 429 (a throttled API server) is `api_throttled`, no more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any, cast

from llm_vitals.kube.client import KubeClient

from .executors import ExecResult, Executor, run_argv
from .gate import HUMAN_REFUSALS, Decision, Plan, Reason
from .ledger import POD_EXECUTORS, Committed, Ledger
from .model import AlertFacts, Intent, TargetStatus
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
    """Carries out committed decisions: runs restarts and refusal Events in background tasks; owns those tasks."""

    def __init__(self, settings: Settings, executors: dict[str, Executor], kube: KubeClient | None, identity: str,
                 ledger: Ledger):
        self.settings = settings
        self.executors = executors
        self.kube = kube
        self.identity = identity
        self.ledger = ledger
        self.remover = PodRemover(kube, settings.pod_action) if kube is not None else None
        self._restart_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._evented: dict[tuple[tuple[str, float], str], None] = {}  # refusal Events sent, in order

    def carry_out(self, facts: AlertFacts, committed: Committed, status: TargetStatus | None) -> None:
        """Start the restart `committed` holds the claim and the row of; else tell a refusal a human
        must see on the target's pod. Returns at once."""
        decision = committed.decision
        if committed.intent is None or committed.action_id is None:
            if decision.reason in HUMAN_REFUSALS:
                self.tell_refusal(facts, decision, status)
            return
        assert decision.plan is not None
        executor = self.executor_for(facts, decision, status)
        self._background(self._run(committed.action_id, facts, executor, committed.intent, status, decision.plan),
                         f"restart-{facts.target or ''}")

    def executor_for(self, facts: AlertFacts, decision: Decision, status: TargetStatus | None) -> Executor:
        """The executor that carries out the decision's plan: the static target's own, or one acting
        on the planned pod (or group, or node) by UID."""
        plan = decision.plan
        assert plan is not None, "only an allowed decision is acted on"
        if plan.action == "restart":
            return self.executors[plan.target]
        pod = planned_pod(plan)
        if self.remover is None or pod is None:
            return Unrunnable(f"target {plan.target}: the exporter names no pod (namespace, pod) for it",
                              POD_EXECUTORS[plan.action])
        if plan.action == "cordon_and_move":
            assert plan.cause is not None and plan.taint is not None
            return CordonAndMoveExecutor(self.remover, pod, self.identity, plan.cause, plan.timeout, plan.taint)
        message = f"{facts.alertname}: restarted by llm-vitals (the exporter says {status.state if status else '?'})"
        if plan.group is not None:
            return GroupExecutor(self.remover, plan.group, pod, self.identity, message, plan.timeout)
        return PodExecutor(self.remover, pod, self.identity, message, plan.timeout)

    # -- restarts ---------------------------------------------------------------------------------

    async def _run(
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
            await self.ledger.finished(action_id, target, late, 0.0, intent)
            return
        try:
            started = time.monotonic()
            try:
                await self._pre_restart(action_id, plan, status)
                result = await executor.restart()
            except asyncio.CancelledError:
                stopped = ExecResult("interrupted", "the remediator shut down during the restart")
                await self.ledger.finished(action_id, target, stopped, time.monotonic() - started, intent)
                raise
            except Exception as exc:  # an executor bug must still end in the journal
                log.exception("executor failed")
                result = ExecResult("error", f"executor failed: {type(exc).__name__}")
            if result.refused is not None:
                await self.ledger.taken_back(action_id, facts, result, time.monotonic() - started, intent)
                if result.refused in HUMAN_REFUSALS:
                    self.tell_refusal(facts, Decision(False, cast(Reason, result.refused), result.detail), status)
            else:
                await self.ledger.finished(action_id, target, result, time.monotonic() - started, intent)
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
        await self.ledger.pre_restart(action_id, {"argv": argv, "result": result.result, "output": result.detail,
                                                  "duration_seconds": round(time.monotonic() - began, 3)})

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
    """An executor that cannot run (a template target the exporter gives no pod for): journaled as error,
    under the kind of the plan's (its row's `executor`)."""

    timeout = 0.0

    def __init__(self, why: str, kind: str):
        self.why = why
        self.kind = kind

    async def restart(self) -> ExecResult:
        return ExecResult("error", self.why)
