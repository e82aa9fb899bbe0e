"""The gate: one pure function deciding whether an alert may restart its target.

It takes plain data (the alert, the exporter's view of the fleet, the journal's state, the policy
and the time) and returns `Decision(allowed, reason, detail)`. No I/O, no clock of its own: the
tests drive it with tables. The checks run in the order of DESIGN §4, and the first refusal wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, NamedTuple, get_args

from llm_vitals.targets import RESTARTABLE_STATES, UNHEALTHY_STATES, State

# The `reason` of every decision: the `..._decisions_total{reason}` label and the journal's word.
Reason = Literal[
    "not_firing",
    "no_restart_label",
    "unknown_target",
    "duplicate",
    "exporter_unreachable",
    "not_stuck",
    "restarted_since_alert",
    "gpu_fault",
    "restart_in_progress",
    "cooldown",
    "circuit_open",
    "fleet_gate",
    "dry_run",
    "allowed",
]
REASONS: tuple[Reason, ...] = get_args(Reason)


class Decision(NamedTuple):
    """The gate's answer. `open_circuit`: the service must open the target's circuit with this decision."""

    allowed: bool
    reason: Reason
    detail: str = ""
    # Set on the restart that uses up the budget (opened with its intent, so a crash cannot lose
    # it) and on the refusal that first finds the budget used up.
    open_circuit: bool = False


@dataclass(frozen=True)
class AlertFacts:
    """What the gate reads from one alert of a webhook payload."""

    status: str
    labels: Mapping[str, str]
    fingerprint: str
    starts_at: float  # unix seconds

    @property
    def target(self) -> str | None:
        return self.labels.get("target")

    @property
    def alertname(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def key(self) -> tuple[str, float]:
        """Alertmanager's identity of one firing episode: an HA pair and repeat_interval resend it."""
        return dedupe_key(self.fingerprint, self.starts_at)


def dedupe_key(fingerprint: str, starts_at: float) -> tuple[str, float]:
    return (fingerprint, round(starts_at, 3))


@dataclass(frozen=True)
class TargetStatus:
    """One target as the exporter's `/api/v1/targets` sees it now."""

    state: State
    process_start_time: float | None = None
    last_restart_time: float | None = None
    gpu_fault: bool = False
    # Unhealthy now or within the exporter's last two polls: a straggler of a fleet-wide fault
    # that is clearing still counts against the fleet gate. False from an exporter without it.
    recently_unhealthy: bool = False


@dataclass(frozen=True)
class FleetView:
    targets: Mapping[str, TargetStatus]


@dataclass(frozen=True)
class JournalState:
    """What the journal knows that the gate needs; a snapshot, not a live view."""

    # (fingerprint, startsAt) of alerts already decided to restart (or would-restart in dry-run).
    decided_keys: frozenset[tuple[str, float]] = frozenset()
    in_progress: str | None = None  # target of the restart running right now
    last_restart_started: float | None = None  # any target, any result
    # Start times of restarts per target since its circuit was last reset (any result).
    restart_times: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    open_circuits: frozenset[str] = frozenset()


@dataclass(frozen=True)
class GatePolicy:
    targets: frozenset[str]
    global_cooldown: float
    max_restarts: int
    budget_window: float
    max_unhealthy: int
    dry_run: bool = False
    down_alertnames: frozenset[str] = frozenset({"LLMServerDown"})


def after_decision(journal: JournalState, alert: AlertFacts, decision: Decision, now: float) -> JournalState:
    """The journal as the gate sees it once `decision` is recorded: what the journal's own mirror applies."""
    target = alert.target
    if target is None:
        return journal
    if decision.allowed:
        last = journal.last_restart_started
        return replace(
            journal,
            decided_keys=journal.decided_keys | {alert.key},
            in_progress=target,
            last_restart_started=now if last is None else max(last, now),
            restart_times={**journal.restart_times, target: (*journal.restart_times.get(target, ()), now)},
            open_circuits=journal.open_circuits | ({target} if decision.open_circuit else set()),
        )
    if decision.reason == "dry_run":  # a would-be restart: the next copy of the alert is a duplicate
        return replace(journal, decided_keys=journal.decided_keys | {alert.key})
    if decision.open_circuit:
        return replace(journal, open_circuits=journal.open_circuits | {target})
    return journal


def after_restart(journal: JournalState) -> JournalState:
    """The journal once the running restart has finished, whatever its result."""
    return replace(journal, in_progress=None)


def restarts_in_window(journal: JournalState, policy: GatePolicy, target: str, now: float) -> int:
    """Restarts of `target` within the budget window ending now (since its last circuit reset)."""
    since = now - policy.budget_window
    return sum(1 for started in journal.restart_times.get(target, ()) if started > since)


def precheck(alert: AlertFacts, journal: JournalState, policy: GatePolicy) -> Decision | None:
    """Steps 1-3, which need no exporter: a refusal, or None when the exporter must be asked."""
    if alert.status != "firing":
        return Decision(False, "not_firing", f"alert is {alert.status}")
    if alert.labels.get("remediation") != "restart":
        return Decision(False, "no_restart_label", 'alert has no remediation="restart" label')
    target = alert.target
    if target is None or target not in policy.targets:
        return Decision(False, "unknown_target", "target is not in the remediator's config")
    if alert.key in journal.decided_keys:
        return Decision(False, "duplicate", "this fingerprint and startsAt were already decided")
    return None


def decide(
    alert: AlertFacts,
    fleet: FleetView | None,
    journal: JournalState,
    policy: GatePolicy,
    now: float,
) -> Decision:
    """The whole gate, steps 1-10. `fleet` is None when the exporter could not be reached."""
    refused = precheck(alert, journal, policy)
    if refused is not None:
        return refused
    target = alert.target
    assert target is not None

    # 4. Still stuck now, and not restarted since the alert began.
    if fleet is None:
        return Decision(False, "exporter_unreachable", "cannot re-check: the exporter did not answer")
    status = fleet.targets.get(target)
    if status is None:
        return Decision(False, "not_stuck", "the exporter does not know this target")
    acceptable = RESTARTABLE_STATES | ({"down"} if alert.alertname in policy.down_alertnames else frozenset())
    if status.state not in acceptable:
        return Decision(False, "not_stuck", f"the exporter says {status.state} now")
    started = status.process_start_time if status.process_start_time is not None else status.last_restart_time
    if started is not None and started >= alert.starts_at:
        return Decision(False, "restarted_since_alert", "the server process started after the alert did")

    # 5. A GPU fault fails the same way after a restart: escalate instead.
    if status.gpu_fault:
        return Decision(False, "gpu_fault", "a GPU fault is flagged; a restart would not help")

    # 6. One restart at a time, fleet-wide.
    if journal.in_progress is not None:
        return Decision(False, "restart_in_progress", f"a restart of {journal.in_progress} is running")

    # 7. The global cooldown counts from the start of the last restart of any target.
    last = journal.last_restart_started
    if last is not None and now - last < policy.global_cooldown:
        remaining = policy.global_cooldown - (now - last)
        return Decision(False, "cooldown", f"global cooldown: {remaining:.0f}s left")

    # 8. Per-target budget; once exhausted the circuit stays open until a human resets it.
    if target in journal.open_circuits:
        return Decision(False, "circuit_open", "restart budget exhausted; POST /api/v1/circuit/reset")
    used = restarts_in_window(journal, policy, target, now)
    if used >= policy.max_restarts:
        return Decision(False, "circuit_open", f"{used} restarts within the budget window", open_circuit=True)

    # 9. The fleet gate: a mass failure points elsewhere (network, storage, the exporter).
    unhealthy = sum(
        1 for name in policy.targets
        if (s := fleet.targets.get(name)) is not None and (s.state in UNHEALTHY_STATES or s.recently_unhealthy)
    )
    if unhealthy > policy.max_unhealthy:
        return Decision(
            False, "fleet_gate", f"{unhealthy} of {len(policy.targets)} targets unhealthy (max {policy.max_unhealthy})"
        )

    # 10. Dry-run records what it would have done.
    if policy.dry_run:
        return Decision(False, "dry_run", "would restart")
    return Decision(True, "allowed", "", open_circuit=used + 1 >= policy.max_restarts)
