"""The remediator's core loop around the pure gate: decide, journal, start the restart in the background.

Order for one alert:
  1. steps 1-3 of the gate from memory (most of a storm ends here as `duplicate`);
  2. re-check through the exporter (shared in-flight read);
  3. under the decision lock: the whole gate again on the current journal state; a refusal is
     queued for the journal's group commit (the answer does not wait for the disk), a restart
     intent is committed durably before anything runs;
  4. an allowed restart runs in a background task, one at a time (restart lock). The webhook
     answer never waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from llm_vitals.logs import log_event

from . import gate
from .executors import ExecResult, Executor, build_executor
from .exporter_client import ExporterClient
from .gate import AlertFacts, Decision, GatePolicy
from .journal import Journal
from .metrics import UNKNOWN_TARGET, RemediatorMetrics
from .payload import Alert, WebhookPayload
from .settings import Settings

log = logging.getLogger("remediator")

# How long a shutdown waits for a running restart before cancelling it.
SHUTDOWN_GRACE_SECONDS = 10.0


def policy_from(settings: Settings) -> GatePolicy:
    return GatePolicy(
        targets=frozenset(settings.targets),
        global_cooldown=settings.global_cooldown,
        max_restarts=settings.budget.max_restarts,
        budget_window=settings.budget.window,
        max_unhealthy=settings.max_unhealthy_count(),
        dry_run=settings.dry_run,
        down_alertnames=frozenset(settings.down_alertnames),
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
    ):
        self.settings = settings
        self.policy = policy_from(settings)
        self.journal = journal
        self.clock = clock
        self.exporter = ExporterClient(
            settings.exporter_url, http_client, settings.exporter_timeout, settings.exporter_max_age
        )
        self.executors: dict[str, Executor] = executors or {
            name: build_executor(config, http_client) for name, config in settings.targets.items()
        }
        self.metrics = RemediatorMetrics(settings.targets, journal)
        self._decision_lock = asyncio.Lock()
        self._restart_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()

    # -- webhook ------------------------------------------------------------------------------

    async def handle_payload(self, payload: WebhookPayload) -> PayloadOutcome:
        """Decide every alert of one webhook. The status follows Alertmanager's retry rule.

        200 when anything was started or everything was decided. 503 (Alertmanager retries) only
        when nothing was started and an alert could not be decided for a passing reason: the
        exporter did not answer, or the journal could not be written.
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
                retry_safe_failure |= decision.reason == "exporter_unreachable"
            outcome.decisions.append(entry)
        if retry_safe_failure and not started:
            outcome.status = 503
        return outcome

    async def handle_alert(self, facts: AlertFacts) -> Decision:
        """Decide one alert, journal the decision, and start the restart when it is allowed."""
        refused = gate.precheck(facts, self.journal.state, self.policy)
        if refused is not None:
            self._record(facts, refused, self.clock())
            return refused
        fleet = await self.exporter.fleet()
        async with self._decision_lock:
            now = self.clock()
            state = self.journal.state
            decision = gate.decide(facts, fleet, state, self.policy, now)
            target = facts.target
            assert target is not None
            if decision.allowed:
                executor = self.executors[target]
                # The intent is durable before the executor may run: a crash from here on still
                # counts against the cooldown and the budget.
                action_id = await self.journal.record_intent(now, facts, executor.kind, open_circuit=decision.open_circuit)
                # Straight after the intent: nothing may fail in between and leave a pending
                # intent that never runs, holding `restart_in_progress` until the next start.
                self._start_restart(action_id, target, executor)
                self.metrics.decisions.labels(target, decision.reason).inc()
                log_event(log, "restart allowed", target=target, fingerprint=facts.fingerprint, action_id=action_id,
                          executor=executor.kind)
                return decision
            if decision.open_circuit:
                await self.journal.open_circuit(target, now)
            # Inside the lock: a dry_run row is what makes the next copy a duplicate.
            self._record(facts, decision, now)
        return decision

    def _record(self, facts: AlertFacts, decision: Decision, now: float) -> None:
        target = facts.target if facts.target in self.policy.targets else None
        word = decision_word(facts, decision)
        self.journal.record_decision(now, facts, word, decision.reason, decision.detail)
        self.metrics.decisions.labels(target or UNKNOWN_TARGET, decision.reason).inc()
        log_event(log, "alert decided", level=logging.DEBUG if decision.reason == "duplicate" else logging.INFO,
                  target=target, fingerprint=facts.fingerprint, decision=word, reason=decision.reason,
                  detail=decision.detail)

    # -- restarts -----------------------------------------------------------------------------

    def _start_restart(self, action_id: int, target: str, executor: Executor) -> None:
        task = asyncio.create_task(self._run_restart(action_id, target, executor), name=f"restart-{target}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_restart(self, action_id: int, target: str, executor: Executor) -> None:
        async with self._restart_lock:
            started = time.monotonic()
            try:
                result = await executor.restart()
            except asyncio.CancelledError:
                stopped = ExecResult("interrupted", "the remediator shut down during the restart")
                await self._finish(action_id, target, stopped, time.monotonic() - started)
                raise
            except Exception as exc:  # an executor bug must still end in the journal
                log.exception("executor failed")
                result = ExecResult("error", f"executor failed: {type(exc).__name__}")
            await self._finish(action_id, target, result, time.monotonic() - started)

    async def _finish(self, action_id: int, target: str, result: ExecResult, duration: float) -> None:
        self.metrics.restarts.labels(target, result.result).inc()
        self.metrics.duration.labels(target).observe(duration)
        log_event(log, "restart finished", level=logging.INFO if result.result == "ok" else logging.WARNING,
                  target=target, action_id=action_id, result=result.result, duration_seconds=round(duration, 3),
                  detail=result.detail[:500])
        try:
            await self.journal.finish(action_id, result.result, result.detail, duration)
        except Exception:
            log.exception("cannot journal a restart's result")

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

    # -- circuit ------------------------------------------------------------------------------

    async def reset_circuits(self, targets: list[str]) -> list[str]:
        was_open = await self.journal.reset_circuits(targets, self.clock())
        log_event(log, "circuits reset", targets=targets, were_open=was_open)
        return was_open


def decision_word(facts: AlertFacts, decision: Decision) -> str:
    """The journal's `decision` column: restart | refused | dry_run | resolved."""
    if decision.allowed:
        return "restart"
    if decision.reason == "dry_run":
        return "dry_run"
    if facts.status == "resolved":
        return "resolved"
    return "refused"
