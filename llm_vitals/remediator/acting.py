"""Acting on a decision: choose the executor, run the restart in the background, finish it.

A committed restart runs in a task of its own, one at a time (the restart lock): first the
target's `pre_restart` command (bounded by its timeout, its output journaled), then the executor.
Its outcome goes to the journal and the metrics, and its claim on the gate's state is released.
The webhook answer never waits for any of it. A refusal a human must see (`gate.HUMAN_REFUSALS`)
becomes an Event on the target's pod, also in the background.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Coroutine
from typing import Any

from llm_vitals.kube.client import KubeClient
from llm_vitals.logs import log_event

from . import shared
from .executors import ExecResult, Executor, run_argv
from .gate import AlertFacts, Decision, GatePolicy, TargetStatus
from .journal import Journal
from .metrics import RemediatorMetrics
from .pods import CordonAndMoveExecutor, PodExecutor, PodRef, pod_event, refusal_event_name
from .policy import DEFAULT_POD_TIMEOUT, pre_restart_of, restart_timeout, template_of
from .settings import Settings
from .shared import Intent
from .store import GateStore, StateUnavailable, update

log = logging.getLogger("llm_vitals.remediator")

# How long a shutdown waits for a running restart before cancelling it.
SHUTDOWN_GRACE_SECONDS = 10.0
# A restart's claim outlives its timeouts by this much (a slow journal write, the clock).
CLAIM_MARGIN_SECONDS = 5.0


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
        self._restart_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._evented: dict[tuple[tuple[str, float], str], None] = {}  # refusal Events sent, in order

    # -- choosing ---------------------------------------------------------------------------------

    def executor_for(self, facts: AlertFacts, decision: Decision, status: TargetStatus | None) -> Executor:
        """The static target's executor, or one acting on the pod the exporter names."""
        target = facts.target or ""
        template = template_of(self.settings, self.policy, target, status)
        pod = pod_of(status)
        if decision.reason == "cordon_and_move":
            assert self.kube is not None and pod is not None and status is not None
            timeout = template.timeout if template else DEFAULT_POD_TIMEOUT
            fault = str(status.raw.get("gpu_fault_detail") or "GPU fault")
            return CordonAndMoveExecutor(self.kube, pod, self.identity, fault, timeout)
        if template is None:
            return self.executors[target]
        if self.kube is None or pod is None:
            return Unrunnable(f"target {target}: the exporter names no pod (namespace, pod) for it")
        message = f"{facts.alertname}: restarted by llm-vitals (the exporter says {status.state if status else '?'})"
        return PodExecutor(self.kube, pod, self.identity, message, template.timeout)

    def claim(self, facts: AlertFacts, executor: Executor, status: TargetStatus | None, now: float) -> Intent:
        """This replica's claim on the restart; where claims expire, it ends after the restart's
        pre_restart and executor timeouts (a replica that died mid-restart holds no one back for ever)."""
        token = f"{self.identity}/{uuid.uuid4().hex[:12]}"
        target = facts.target or ""
        if not self.store.claims_expire:
            return Intent(token, target, None)
        pre = pre_restart_of(self.settings, self.policy, target, status)
        timeout = getattr(executor, "timeout", None) or restart_timeout(self.settings, self.policy, target, status)
        return Intent(token, target, now + (pre.timeout if pre else 0.0) + float(timeout) + CLAIM_MARGIN_SECONDS)

    # -- restarts ---------------------------------------------------------------------------------

    def start(self, action_id: int, facts: AlertFacts, executor: Executor, holder: str,
              status: TargetStatus | None) -> None:
        """Run the committed restart in the background; returns at once."""
        target = facts.target or ""
        self._background(self._run(action_id, target, executor, holder, status), f"restart-{target}")

    async def _run(
        self, action_id: int, target: str, executor: Executor, holder: str, status: TargetStatus | None
    ) -> None:
        async with self._restart_lock:
            started = time.monotonic()
            try:
                await self._pre_restart(action_id, target, status)
                result = await executor.restart()
            except asyncio.CancelledError:
                stopped = ExecResult("interrupted", "the remediator shut down during the restart")
                await self._finish(action_id, target, stopped, time.monotonic() - started, holder)
                raise
            except Exception as exc:  # an executor bug must still end in the journal
                log.exception("executor failed")
                result = ExecResult("error", f"executor failed: {type(exc).__name__}")
            await self._finish(action_id, target, result, time.monotonic() - started, holder)

    async def _pre_restart(self, action_id: int, target: str, status: TargetStatus | None) -> None:
        """Run the target's pre_restart command, bounded by its timeout, and journal its output."""
        pre = pre_restart_of(self.settings, self.policy, target, status)
        if pre is None:
            return
        argv = fill_argv(pre.argv, target, status)
        began = time.monotonic()
        result = await run_argv(argv, pre.timeout, pre.output_limit)
        record = {"argv": argv, "result": result.result, "output": result.detail,
                  "duration_seconds": round(time.monotonic() - began, 3)}
        try:
            await self.journal.record_pre_restart(action_id, record)
        except Exception:
            log.exception("cannot journal the pre_restart output")

    async def _finish(self, action_id: int, target: str, result: ExecResult, duration: float, holder: str) -> None:
        self.metrics.restarts.labels(target, result.result).inc()
        self.metrics.duration.labels(target).observe(duration)
        log_event(log, "restart finished", level=logging.INFO if result.result == "ok" else logging.WARNING,
                  target=target, action_id=action_id, result=result.result, duration_seconds=round(duration, 3),
                  detail=result.detail[:500])
        try:
            await self.journal.finish(action_id, result.result, result.detail, duration)
        except Exception:
            log.exception("cannot journal a restart's result")
        await self.release(holder)

    async def release(self, holder: str) -> None:
        """End this replica's claim on the restart (the cooldown and the budget stay spent)."""
        try:
            await update(self.store, lambda state: shared.finished(state, holder))
        except StateUnavailable as exc:
            # A claim that expires ends then; no other restart starts before.
            log_event(log, "cannot release the restart in the gate's state", level=logging.WARNING, error=str(exc))
        except Exception:
            # One replica: no restart starts until this remediator starts again (the safe side).
            log.exception("cannot release the restart in the gate's state")

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
