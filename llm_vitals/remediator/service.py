"""The remediator's core loop around the pure gate: decide, journal, start the restart in the background.

Order for one alert:
  1. steps 1-3 of the gate from memory (most of a storm ends here as `duplicate`);
  2. re-check through the exporter, or every exporter shard at once (shared in-flight reads);
  3. under the decision lock: the whole gate again on the current journal state; a refusal is
     queued for the journal's group commit (the answer does not wait for the disk), a restart
     intent is committed durably before anything runs;
  4. an allowed restart runs in a background task, one at a time (restart lock). The webhook
     answer never waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import httpx

from llm_vitals.kube.client import KubeClient
from llm_vitals.kube.leases import LeaseTransport
from llm_vitals.logs import log_event

from . import gate, shared
from .executors import ExecResult, Executor, build_executor, run_argv
from .exporter_client import FleetReader
from .gate import AlertFacts, Decision, FleetView, GatePolicy, JournalState, TargetStatus, TemplateMatch
from .journal import Journal
from .metrics import UNKNOWN_TARGET, RemediatorMetrics
from .payload import Alert, WebhookPayload
from .pods import CordonAndMoveExecutor, PodExecutor, PodRef, pod_event, refusal_event_name
from .settings import _PERCENT, PreRestart, Settings, TargetTemplate
from .shared import Intent
from .store import CONFLICT_RETRIES, LeaseStore, StateUnavailable

log = logging.getLogger("llm_vitals.remediator")

# How long a shutdown waits for a running restart before cancelling it.
SHUTDOWN_GRACE_SECONDS = 10.0


def policy_from(settings: Settings) -> GatePolicy:
    percent = _PERCENT.match(settings.max_unhealthy) if isinstance(settings.max_unhealthy, str) else None
    return GatePolicy(
        targets=frozenset(settings.targets),
        global_cooldown=settings.global_cooldown,
        max_restarts=settings.budget.max_restarts,
        budget_window=settings.budget.window,
        max_unhealthy=settings.max_unhealthy_count(),
        dry_run=settings.dry_run,
        down_alertnames=frozenset(settings.down_alertnames),
        templates=tuple(
            TemplateMatch(engine=t.match.engine, namespace=t.match.namespace, name=t.match.name)
            for t in settings.target_templates
        ),
        max_unhealthy_percent=float(percent.group(1)) if percent else None,
        storm_cooldown=settings.storm_cooldown,
        gpu_fault_action=settings.gpu_fault_action,
    )


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
        http_client: httpx.AsyncClient,
        clock: Callable[[], float] = time.time,
        executors: dict[str, Executor] | None = None,
        kube: KubeClient | None = None,
    ):
        self.settings = settings
        self.policy = policy_from(settings)
        self.journal = journal
        self.clock = clock
        # Every exporter shard, read at once: the fleet gate needs the whole fleet in one view.
        self.exporter = FleetReader.of(
            settings.exporters(), http_client, settings.exporter_timeout, settings.exporter_max_age
        )
        self.executors: dict[str, Executor] = executors or {
            name: build_executor(config, http_client) for name, config in settings.targets.items()
        }
        self.kube = kube
        self.identity = replica_identity(settings)
        lease = settings.kubernetes.lease if settings.kubernetes else None
        # None: the single-replica mode, where the journal is the state. Else the shared Lease.
        self.store: LeaseStore | None = (
            LeaseStore(LeaseTransport(kube), lease, self.identity, settings.budget.window)
            if kube is not None and lease else None
        )
        self.metrics = RemediatorMetrics(settings.targets, journal, self.gate_state_now, clock)
        self._decision_lock = asyncio.Lock()
        self._restart_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._evented: dict[tuple[tuple[str, float], str], None] = {}  # refusal Events sent, in order

    # -- state --------------------------------------------------------------------------------

    def gate_state_now(self) -> JournalState:
        """The state as last seen, without I/O (for the metrics and /healthz)."""
        if self.store is None:
            return self.journal.state
        return self.store.last or JournalState()

    def _merged(self, shared_state: JournalState) -> JournalState:
        """The shared state plus this replica's own decided keys (a storm's copies end in precheck)."""
        local = self.journal.state.decided_keys
        return replace(shared_state, decided_keys=shared_state.decided_keys | local)

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
                entry.update(decision=decision_word(facts, decision), reason=decision.reason, detail=decision.detail)
                started |= decision.allowed
                retry_safe_failure |= decision.reason in RETRY_SAFE_REASONS
            outcome.decisions.append(entry)
        if retry_safe_failure and not started:
            outcome.status = 503
        return outcome

    async def handle_alert(self, facts: AlertFacts) -> Decision:
        """Decide one alert, journal the decision, and start the restart when it is allowed."""
        local = self.journal.state
        refused = gate.precheck(facts, local, self.policy, self.clock() if self.store is None else None)
        if refused is not None:
            self._record(facts, refused, self.clock())
            return refused
        fleet = await self.exporter.fleet()
        async with self._decision_lock:
            if self.store is None:
                return await self._decide_local(facts, fleet)
            return await self._decide_shared(facts, fleet)

    async def _decide_local(self, facts: AlertFacts, fleet: FleetView | None) -> Decision:
        now = self.clock()
        state = self.journal.state
        decision = gate.decide(facts, fleet, state, self.policy, now)
        effects = gate.effects_of(decision, facts, fleet, state, self.policy, now)
        status = self._status(facts, fleet)
        if decision.allowed:
            executor = self._executor(facts, decision, status)
            # The intent is durable before the executor may run: a crash from here on still
            # counts against the cooldown and the budget.
            action_id = await self.journal.record_intent(
                now, facts, executor.kind, effects.open_circuit, reason=decision.reason, detail=decision.detail,
                evidence=status.raw if status else None, evidence_from=status.source if status else None,
                storm_seen_at=effects.storm_seen_at,
                gpu_node=effects.gpu_node,
            )
            # Straight after the intent: nothing may fail in between and leave a pending
            # intent that never runs, holding `restart_in_progress` until the next start.
            self._start_restart(action_id, facts, executor, None, status)
            self._count_allowed(facts, decision, action_id, executor)
            return decision
        if effects.open_circuit:
            await self.journal.open_circuit(facts.target or "", now)
        if effects.storm_seen_at is not None:
            await self.journal.record_storm(effects.storm_seen_at)
        # Inside the lock: a dry_run row is what makes the next copy a duplicate.
        self._record(facts, decision, now, status)
        return decision

    async def _decide_shared(self, facts: AlertFacts, fleet: FleetView | None) -> Decision:
        """Decide on the Lease's state and commit the effects with its resourceVersion; on a
        conflict (another replica wrote first) read again and decide again."""
        assert self.store is not None
        status = self._status(facts, fleet)
        for _ in range(CONFLICT_RETRIES):
            now = self.clock()
            try:
                snap = await self.store.read()
            except StateUnavailable as exc:
                decision = Decision(False, "state_unreachable", str(exc)[:500])
                self._record(facts, decision, now, status)
                return decision
            state = self._merged(snap.state)
            decision = gate.decide(facts, fleet, state, self.policy, now)
            effects = gate.effects_of(decision, facts, fleet, state, self.policy, now)
            if not effects:
                break
            executor = self._executor(facts, decision, status) if decision.allowed else None
            intent = None
            if executor is not None:
                token = f"{self.identity}/{uuid.uuid4().hex[:12]}"
                intent = Intent(token, facts.target or "", now + self._claim_seconds(facts, executor, status))
            try:
                won = await self.store.write(snap, shared.with_effects(snap.state, effects, facts, now, intent), now)
            except StateUnavailable as exc:
                decision = Decision(False, "state_unreachable", str(exc)[:500])
                break
            if not won:
                continue
            if executor is not None and intent is not None:
                action_id = await self.journal.record_intent(
                    now, facts, executor.kind, effects.open_circuit, reason=decision.reason,
                    detail=decision.detail, evidence=status.raw if status else None,
                    evidence_from=status.source if status else None,
                )
                self._start_restart(action_id, facts, executor, intent.holder, status)
                self._count_allowed(facts, decision, action_id, executor)
                return decision
            break
        else:
            decision = Decision(False, "state_unreachable", f"the Lease kept changing ({CONFLICT_RETRIES} conflicts)")
        self._record(facts, decision, now, status)
        return decision

    def _status(self, facts: AlertFacts, fleet: FleetView | None) -> TargetStatus | None:
        return fleet.targets.get(facts.target or "") if fleet is not None else None

    def _count_allowed(self, facts: AlertFacts, decision: Decision, action_id: int, executor: Executor) -> None:
        self.metrics.decisions.labels(facts.target, decision.reason).inc()
        log_event(log, "restart allowed", target=facts.target, fingerprint=facts.fingerprint, action_id=action_id,
                  executor=executor.kind, reason=decision.reason)

    def _record(self, facts: AlertFacts, decision: Decision, now: float, status: TargetStatus | None = None) -> None:
        known = facts.target in self.policy.targets or (status is not None and decision.reason != "unknown_target")
        target = facts.target if known else None
        word = decision_word(facts, decision)
        self.journal.record_decision(now, facts, word, decision.reason, decision.detail,
                                     evidence=status.raw if status is not None else None,
                                     evidence_from=status.source if status is not None else None)
        self.metrics.decisions.labels(target or UNKNOWN_TARGET, decision.reason).inc()
        log_event(log, "alert decided", level=logging.DEBUG if decision.reason == "duplicate" else logging.INFO,
                  target=target, fingerprint=facts.fingerprint, decision=word, reason=decision.reason,
                  detail=decision.detail)
        if decision.reason in gate.HUMAN_REFUSALS and status is not None:
            self._refusal_event(facts, decision, status)

    def _refusal_event(self, facts: AlertFacts, decision: Decision, status: TargetStatus) -> None:
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

    # -- executors ----------------------------------------------------------------------------

    def _template(self, target: str, status: TargetStatus | None) -> TargetTemplate | None:
        index = gate.template_index(self.policy, target, status) if target not in self.policy.targets else None
        return self.settings.target_templates[index] if index is not None else None

    def _executor(self, facts: AlertFacts, decision: Decision, status: TargetStatus | None) -> Executor:
        """The static target's executor, or one acting on the pod the exporter names."""
        target = facts.target or ""
        template = self._template(target, status)
        pod = pod_of(status) if status is not None else None
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

    def _pre_restart(self, target: str, status: TargetStatus | None) -> PreRestart | None:
        config = self.settings.targets.get(target)
        if config is not None:
            return config.pre_restart
        template = self._template(target, status)
        return template.pre_restart if template else None

    def _claim_seconds(self, facts: AlertFacts, executor: Executor, status: TargetStatus | None) -> float:
        """How long a restart may hold the lock: its pre_restart and its executor's timeouts."""
        pre = self._pre_restart(facts.target or "", status)
        config = self.settings.targets.get(facts.target or "")
        timeout = getattr(executor, "timeout", None) or (config.timeout if config else DEFAULT_POD_TIMEOUT)
        return (pre.timeout if pre else 0.0) + float(timeout) + CLAIM_MARGIN_SECONDS

    # -- restarts -----------------------------------------------------------------------------

    def _background(self, coro, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start_restart(
        self, action_id: int, facts: AlertFacts, executor: Executor, holder: str | None, status: TargetStatus | None
    ) -> None:
        target = facts.target or ""
        self._background(self._run_restart(action_id, target, executor, holder, status), f"restart-{target}")

    async def _run_restart(
        self, action_id: int, target: str, executor: Executor, holder: str | None, status: TargetStatus | None
    ) -> None:
        async with self._restart_lock:
            started = time.monotonic()
            try:
                await self._evidence(action_id, target, status)
                result = await executor.restart()
            except asyncio.CancelledError:
                stopped = ExecResult("interrupted", "the remediator shut down during the restart")
                await self._finish(action_id, target, stopped, time.monotonic() - started, holder)
                raise
            except Exception as exc:  # an executor bug must still end in the journal
                log.exception("executor failed")
                result = ExecResult("error", f"executor failed: {type(exc).__name__}")
            await self._finish(action_id, target, result, time.monotonic() - started, holder)

    async def _evidence(self, action_id: int, target: str, status: TargetStatus | None) -> None:
        """Run the target's pre_restart command, bounded by its timeout, and journal its output."""
        pre = self._pre_restart(target, status)
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

    async def _finish(
        self, action_id: int, target: str, result: ExecResult, duration: float, holder: str | None
    ) -> None:
        self.metrics.restarts.labels(target, result.result).inc()
        self.metrics.duration.labels(target).observe(duration)
        log_event(log, "restart finished", level=logging.INFO if result.result == "ok" else logging.WARNING,
                  target=target, action_id=action_id, result=result.result, duration_seconds=round(duration, 3),
                  detail=result.detail[:500])
        try:
            await self.journal.finish(action_id, result.result, result.detail, duration)
        except Exception:
            log.exception("cannot journal a restart's result")
        if self.store is not None and holder is not None:
            try:
                await self.store.update(lambda state: shared.finished(state, holder), self.clock)
            except StateUnavailable as exc:
                # The claim then ends at its expiry; no other restart starts before.
                log_event(log, "cannot release the restart in the Lease", level=logging.WARNING, error=str(exc))

    async def wait_idle(self) -> None:
        """Wait for running restarts (tests and shutdown)."""
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

    # -- operator actions ---------------------------------------------------------------------

    async def reset_circuits(self, targets: list[str]) -> list[str]:
        if self.store is not None:
            before = await self.store.update(lambda state: state, self.clock)
            await self.store.update(lambda state: shared.circuits_reset(state, targets), self.clock)
            was_open = [t for t in targets if t in before.open_circuits]
            await self.journal.reset_circuits(targets, self.clock())
        else:
            was_open = await self.journal.reset_circuits(targets, self.clock())
        log_event(log, "circuits reset", targets=targets, were_open=was_open)
        return was_open

    async def set_pause(self, until: float | None, reason: str) -> JournalState:
        """Pause (or, with `until` None, resume) every replica; journaled here. Raises StateUnavailable."""
        now = self.clock()
        if self.store is not None:
            state = await self.store.update(lambda s: shared.paused_state(s, until, reason), self.clock)
        await self.journal.set_pause(now, until, reason)
        log_event(log, "paused" if until is not None else "resumed", until=until, reason=reason)
        return state if self.store is not None else self.journal.state

    async def follow_shared_state(self, interval: float) -> None:
        """Re-read the Lease every `interval` s, so the metrics show what another replica wrote
        (a pause, an open circuit) without waiting for this replica's next webhook."""
        while self.store is not None:
            try:
                await self.store.read()
            except StateUnavailable as exc:
                log_event(log, "cannot read the shared state", level=logging.DEBUG, error=str(exc))
            await asyncio.sleep(interval)

    async def pause_state(self) -> JournalState:
        """The pause as stored now (read fresh from the Lease in the replicated mode)."""
        if self.store is None:
            return self.journal.state
        return (await self.store.read()).state


# Reasons for which nothing was decided for good and a redelivery is safe (503).
RETRY_SAFE_REASONS = frozenset({"exporter_unreachable", "state_unreachable"})
# A restart's claim in the Lease outlives its timeouts by this much (a slow journal write, the clock).
CLAIM_MARGIN_SECONDS = 5.0
DEFAULT_POD_TIMEOUT = 30.0


def replica_identity(settings: Settings) -> str:
    """This replica's name in the Lease and in Events: configured, $POD_NAME, else host name and pid."""
    if settings.kubernetes is not None and settings.kubernetes.identity:
        return settings.kubernetes.identity
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


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


def decision_word(facts: AlertFacts, decision: Decision) -> str:
    """The journal's `decision` column: restart | refused | dry_run | resolved."""
    if decision.allowed:
        return "restart"
    if decision.reason == "dry_run":
        return "dry_run"
    if decision.reason == "paused":
        return "paused"
    if facts.status == "resolved":
        return "resolved"
    return "refused"
