"""What the remediator keeps of each decision, with the evidence it was made on.

Every decision becomes a journal row carrying what the exporter said about the target when it was
made (its whole TARGET object, and which exporter shard said it), a count in
`..._decisions_total{target, reason}` and a log line. A refusal is queued for the journal's group
commit (its answer never waits for the disk); a restart's row is committed before the restart runs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from llm_vitals.logs import log_event

from .gate import Decision, GatePolicy
from .journal import Journal
from .metrics import UNKNOWN_TARGET, RemediatorMetrics
from .model import AlertFacts, TargetStatus, workload_of

log = logging.getLogger("llm_vitals.remediator")


def evidence_of(target: str | None, status: TargetStatus | None) -> dict[str, Any]:
    """The journal's evidence columns for a decision made on `status` (nothing when the exporter had
    none), and the workload it counted against."""
    if status is None:
        return {"evidence": None, "evidence_from": None, "workload": None}
    raw: Mapping[str, Any] = status.raw
    return {"evidence": raw, "evidence_from": status.source, "workload": workload_of(target or "", status)}


class Evidence:
    """Journals, counts and logs each decision with the exporter's view of its target."""

    def __init__(self, journal: Journal, metrics: RemediatorMetrics, policy: GatePolicy):
        self.journal = journal
        self.metrics = metrics
        self.policy = policy

    def decided(self, facts: AlertFacts, decision: Decision, now: float, status: TargetStatus | None = None,
                actor: str | None = None) -> None:
        """A decision that starts nothing (refused, dry_run, paused, resolved): queued, never awaited.
        `actor`: who restarted the server meanwhile, when the decision is about such a restart."""
        # A target's name from the payload becomes a label only when the config or the exporter knows it.
        known = facts.target in self.policy.targets or (status is not None and decision.reason != "unknown_target")
        target = facts.target if known else None
        word = decision_word(facts, decision)
        self.journal.record_decision(now, facts, word, decision.reason, decision.detail, **evidence_of(target, status),
                                     actor=actor)
        self.metrics.decisions.labels(target or UNKNOWN_TARGET, decision.reason).inc()
        log_event(log, "alert decided", level=logging.DEBUG if decision.reason == "duplicate" else logging.INFO,
                  target=target, fingerprint=facts.fingerprint, decision=word, reason=decision.reason,
                  detail=decision.detail)

    def restart_seen(self, target: str, workload: str, at: float, actor: str, status: TargetStatus, now: float) -> None:
        """A restart no remediator made, counted in the workload's budget: its row (`actor`), count and log."""
        detail = (f"the exporter saw {target} restart at {at:.0f}, not by a remediator: it counts in {workload}'s"
                  " budget, circuit and backoff")
        self.journal.record_decision(now, AlertFacts("", {"target": target}, "", 0.0), "restart_seen",
                                     "outside_restart", detail, **evidence_of(target, status), actor=actor)
        self.metrics.outside_restarts.labels(actor).inc()
        log_event(log, "restart seen", target=target, workload=workload, actor=actor, at=at)

    async def restart(
        self, facts: AlertFacts, decision: Decision, now: float, executor: str, status: TargetStatus | None
    ) -> int:
        """A restart about to run: its row (result `pending`) committed, its id returned for `finish`."""
        action_id = await self.journal.record_intent(now, facts, executor, reason=decision.reason,
                                                     detail=decision.detail, **evidence_of(facts.target, status))
        self.metrics.decisions.labels(facts.target, decision.reason).inc()
        log_event(log, "restart allowed", target=facts.target, fingerprint=facts.fingerprint, action_id=action_id,
                  executor=executor, reason=decision.reason)
        return action_id


def decision_word(facts: AlertFacts, decision: Decision) -> str:
    """The journal's `decision` column: restart | refused | dry_run | paused | resolved."""
    if decision.allowed:
        return "restart"
    if decision.reason == "dry_run":
        return "dry_run"
    if decision.reason == "paused":
        return "paused"
    if facts.status == "resolved":
        return "resolved"
    return "refused"
