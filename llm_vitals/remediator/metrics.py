"""The remediator's own metrics, in a registry of its own.

Counters and the duration histogram are updated as things happen. The circuits, the budgets
used, the in-progress flag, the pause and the escalated nodes are read from the gate's state as its
store last saw it, the store's health from the store, and the last restart time from the journal,
at scrape time by a custom collector (no I/O), so they are right after a restart of the remediator
too. Circuits and budgets are per workload (docs/remediator.md): replicas sharing one Lease each show the
same values (aggregate them with `max by (workload)`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .state import BACKOFF_REFUSAL_MEMORY_SECONDS, DISRUPTION_MEMORY_SECONDS

if TYPE_CHECKING:
    from .gate import GateState
    from .journal import Journal
    from .store import StoreHealth

# A label value for targets that are not in the config: the payload's own value would let a
# caller create unbounded series.
UNKNOWN_TARGET = "(unknown)"


class RemediatorMetrics:
    def __init__(
        self,
        targets: Iterable[str],
        journal: Journal,
        state: Callable[[], GateState],
        clock: Callable[[], float] = time.time,
        health: Callable[[], StoreHealth] | None = None,
        budget_window: float = 3600.0,
        backoff_reset: float = 12 * 3600.0,
    ):
        self.registry = CollectorRegistry(auto_describe=True)
        self.decisions = Counter(
            "llm_vitals_remediator_decisions_total",
            "Gate decisions by target and reason (allowed, duplicate, cooldown, ...). A rise in "
            "exporter_unreachable or fleet_gate means restarts are being held back on purpose.",
            ["target", "reason"],
            registry=self.registry,
        )
        self.restarts = Counter(
            "llm_vitals_remediator_restarts_total",
            "Restarts run by an executor, by result (ok, error, timeout). Errors still count against "
            "the cooldown and the budget.",
            ["target", "result"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "llm_vitals_remediator_restart_duration_seconds",
            "How long the executor took to perform a restart.",
            ["target"],
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.outside_restarts = Counter(
            "llm_vitals_remediator_outside_restarts_total",
            "Restarts of a server no remediator made, as the exporter saw them (a new start time of the same"
            " target), by who made them (kubelet: its liveness probe or the server's own exit in a pod; other:"
            " systemd, Docker, a person). Each counts in its workload's budget, circuit and backoff.",
            ["actor"],
            registry=self.registry,
        )
        self.unknown_workload_asks = Counter(
            "llm_vitals_remediator_backstop_unknown_workload_total",
            "Backstop asks (GET /api/v1/backstop) about a workload this remediator never heard of: a shim's"
            " `workload:` with a typo, or none (the target's name is asked). Such a workload is held for a bounded"
            " time, then the kubelet's backstop acts alone for it: fix the shim's workload.",
            registry=self.registry,
        )
        self.registry.register(_JournalCollector(sorted(targets), journal, state, clock, health, budget_window,
                                                 backoff_reset))


def refusal_streaks(name: str, documentation: str, streaks: Mapping[str, tuple[float, float]],
                    since: float) -> GaugeMetricFamily:
    """Per workload, seconds from the first to the latest refusal of its streak (first, latest): the
    streaks whose latest refusal came after `since`, as an older one has ended."""
    family = GaugeMetricFamily(name, documentation, labels=["workload"])
    for workload, (first, latest) in sorted(streaks.items()):
        if latest > since:
            family.add_metric([workload], latest - first)
    return family


class _JournalCollector(Collector):
    """Gauges read from the gate's state, its store and the journal on each scrape. Sample:

    llm_vitals_remediator_circuit_open{workload="Deployment/llm/vllm"} 0.0
    llm_vitals_remediator_workload_restarts{workload="Deployment/llm/vllm"} 2.0
    llm_vitals_remediator_last_restart_timestamp_seconds{target="gpu-a"} 1.7962223e+09
    llm_vitals_remediator_restart_in_progress 0.0
    llm_vitals_remediator_paused 0.0
    llm_vitals_remediator_disruption_budget_refused_seconds{workload="Deployment/llm/vllm"} 3600.0
    llm_vitals_remediator_node_escalated{node="gpu-node-7"} 1.0
    llm_vitals_remediator_workload_paged{workload="Deployment/llm/vllm"} 1.0
    llm_vitals_remediator_workload_restart_streak{workload="Deployment/llm/vllm"} 4.0
    llm_vitals_remediator_backoff_refused_seconds{workload="Deployment/llm/vllm"} 1800.0
    llm_vitals_remediator_state_up 1.0
    llm_vitals_remediator_state_lost 0.0
    llm_vitals_remediator_unresolved_intents 0.0
    llm_vitals_remediator_state_errors_total{operation="read"} 3.0
    """

    def __init__(
        self, targets: list[str], journal: Journal, state: Callable[[], GateState], clock: Callable[[], float],
        health: Callable[[], StoreHealth] | None, budget_window: float, backoff_reset: float = 12 * 3600.0,
    ):
        self.targets = targets
        self.journal = journal
        self.state = state
        self.clock = clock
        self.health = health
        self.budget_window = budget_window
        self.backoff_reset = backoff_reset

    def describe(self) -> list:
        return []

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        state = self.state()
        now = self.clock()
        last_by_target = self.journal.last_restart_by_target
        circuit = GaugeMetricFamily(
            "llm_vitals_remediator_circuit_open",
            "1 when the workload's restart budget is exhausted and its restarts are refused until "
            "POST /api/v1/circuit/reset {\"workload\": ...}. Static targets are their own workload.",
            labels=["workload"],
        )
        used = GaugeMetricFamily(
            "llm_vitals_remediator_workload_restarts",
            "Restarts (and moves) of the workload started within the budget window, since its last circuit "
            "reset, as the budget counts them against max_restarts; LLMServerRestartLoop reads it.",
            labels=["workload"],
        )
        workloads = set(self.targets) | set(state.open_circuits) | set(state.restart_times)
        since = now - self.budget_window
        for workload in sorted(workloads):
            circuit.add_metric([workload], 1.0 if workload in state.open_circuits else 0.0)
            used.add_metric([workload], float(sum(1 for t in state.restart_times.get(workload, ()) if t > since)))
        yield circuit
        yield used
        last = GaugeMetricFamily(
            "llm_vitals_remediator_last_restart_timestamp_seconds",
            "Unix time of the last restart started for the target (any result), from the journal.",
            labels=["target"],
        )
        for target in self.targets:
            if target in last_by_target:
                last.add_metric([target], last_by_target[target])
        yield last
        yield GaugeMetricFamily(
            "llm_vitals_remediator_restart_in_progress",
            "1 while a restart runs; no other restart starts meanwhile.",
            value=1.0 if state.in_progress else 0.0,
        )
        paused_until = state.paused_until
        yield GaugeMetricFamily(
            "llm_vitals_remediator_paused",
            "1 while an operator has paused the remediator (POST /api/v1/pause): alerts are journaled "
            "as paused and nothing is restarted until the pause ends or DELETE /api/v1/pause.",
            value=1.0 if paused_until is not None and now < paused_until else 0.0,
        )
        yield refusal_streaks(
            "llm_vitals_remediator_disruption_budget_refused_seconds",
            "Seconds from the first to the latest refusal of the workload's restart by a PodDisruptionBudget, while "
            "they keep coming (none for 2h ends the streak, and so does a restart that runs): the budget keeps the "
            "stuck server from being restarted. LLMVitalsRemediatorDisruptionBudget fires at an hour.",
            state.disrupted, now - DISRUPTION_MEMORY_SECONDS,
        )
        nodes = GaugeMetricFamily(
            "llm_vitals_remediator_node_escalated",
            "1 for each node llm-vitals cordoned (a GPU fault, or the ladder's cordon_and_move) and has not "
            "been released: it is not escalated again. Uncordon it, then POST /api/v1/nodes/<node>/release.",
            labels=["node"],
        )
        for node in sorted(state.cordoned_nodes):
            nodes.add_metric([node], 1.0)
        yield nodes
        pages = GaugeMetricFamily(
            "llm_vitals_remediator_workload_paged",
            "1 for each workload the escalation ladder paged (escalated_to_human) and no human has released: "
            "its alerts are refused until POST /api/v1/workloads/release {\"workload\": ...}. "
            "LLMVitalsRemediatorWorkloadPaged fires while it holds.",
            labels=["workload"],
        )
        for workload in sorted(set(state.pages) | {w for w, (step, _) in state.ladder.items() if step == "page"}):
            pages.add_metric([workload], 1.0)
        yield pages
        streak = GaugeMetricFamily(
            "llm_vitals_remediator_workload_restart_streak",
            "Restarts (and moves) of the workload in its current streak: none quiet for budget.backoff.reset_after "
            "in between. Each makes the next wait longer (the backoff); the long horizon of LLMServerRestartLoop reads it.",
            labels=["workload"],
        )
        for workload, (count, at) in sorted(state.backoff.items()):
            if at > now - self.backoff_reset:
                streak.add_metric([workload], float(count))
        yield streak
        yield refusal_streaks(
            "llm_vitals_remediator_backoff_refused_seconds",
            "Seconds from the first to the latest refusal of the workload's stuck alerts for its backoff (the wait "
            "after a streak of restarts grows to budget.backoff.max), while they keep coming (none for 2h ends the "
            "streak, and so does a restart of it): a stuck server left as it is, possibly for hours. "
            "LLMVitalsRemediatorBackoffHolding fires while the series is there.",
            state.backoff_refused, now - BACKOFF_REFUSAL_MEMORY_SECONDS,
        )
        if self.health is not None:
            health = self.health()
            yield GaugeMetricFamily(
                "llm_vitals_remediator_state_up",
                "1 when the last read or write of the gate's state (the replicas' Lease, or this replica's "
                "SQLite row) worked; 0 while it fails: no restart can be decided, webhooks answer 503.",
                value=1.0 if health.up else 0.0,
            )
            yield GaugeMetricFamily(
                "llm_vitals_remediator_state_lost",
                "1 while the gate's shared state is lost (its Lease deleted, its annotation unreadable, or "
                "created again by another replica): nothing is restarted, paused or reset until a human "
                "re-initialises it (POST /api/v1/state/reinit, see the runbook); 0 otherwise.",
                value=1.0 if health.lost else 0.0,
            )
            yield GaugeMetricFamily(
                "llm_vitals_remediator_unresolved_intents",
                "Restart intents this replica committed whose outcome it could not learn yet (the write's answer was "
                "lost and the gate's state has been unreadable since): each is re-read at the next alert and carried "
                "out once or released. Above 0 for long, a hang may go unhandled: LLMVitalsRemediatorIntentUnresolved.",
                value=float(health.unresolved),
            )
            errors = CounterMetricFamily(
                "llm_vitals_remediator_state_errors",
                "Failed reads and writes of the gate's state, by operation (read, write, and follow: an "
                "unexpected error of the task that keeps a replica's view of the Lease fresh).",
                labels=["operation"],
            )
            for operation in ("read", "write", "follow"):
                errors.add_metric([operation], float(health.errors.get(operation, 0)))
            yield errors
