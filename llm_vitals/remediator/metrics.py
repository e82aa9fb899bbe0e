"""The remediator's own metrics, in a registry of its own: one table, as the exporter's are (exporter/collector.py).

`EVENTS` are counted as things happen (decisions, restarts and their durations, restarts no remediator
made, asks about unknown workloads). `FAMILIES` are read at scrape time by a custom collector (no I/O)
from the gate's state as its store last saw it, the store's health and the journal's last restarts, so
they are right after a restart of the remediator too: each row a name, a kind, its HELP, its labels and
the samples one `Scrape` gives. Circuits and budgets are per workload (docs/remediator.md): replicas
sharing one Lease each show the same values (aggregate them with `max by (workload)`). The names, labels
and HELP texts are what the alert rules, the dashboards and docs/interfaces.md read: never rename one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .state import BACKOFF_REFUSAL_MEMORY_SECONDS, DISRUPTION_MEMORY_SECONDS

if TYPE_CHECKING:
    from .journal import Journal
    from .model import GateState
    from .store import StoreHealth

# A label value for targets that are not in the config: the payload's own value would let a
# caller create unbounded series.
UNKNOWN_TARGET = "(unknown)"


@dataclass(frozen=True)
class Event:
    """A metric counted as things happen: a counter, or the restart duration's histogram."""

    name: str  # as exposed: a counter's ends in _total
    kind: Literal["counter", "histogram"]
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    def counter(self, registry: CollectorRegistry) -> Counter:
        return Counter(self.name, self.help, self.labels, registry=registry)

    def histogram(self, registry: CollectorRegistry) -> Histogram:
        return Histogram(self.name, self.help, self.labels, buckets=self.buckets, registry=registry)


DECISIONS = Event(
    "llm_vitals_remediator_decisions_total", "counter",
    "Gate decisions by target and reason (allowed, duplicate, cooldown, ...). A rise in "
    "exporter_unreachable or fleet_gate means restarts are being held back on purpose.",
    ("target", "reason"))
RESTARTS = Event(
    "llm_vitals_remediator_restarts_total", "counter",
    "Restarts run by an executor, by result (ok, error, timeout). Errors still count against "
    "the cooldown and the budget.",
    ("target", "result"))
DURATION = Event(
    "llm_vitals_remediator_restart_duration_seconds", "histogram",
    "How long the executor took to perform a restart.",
    ("target",), (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
OUTSIDE_RESTARTS = Event(
    "llm_vitals_remediator_outside_restarts_total", "counter",
    "Restarts of a server no remediator made, as the exporter saw them (a new start time of the same"
    " target), by who made them (kubelet: its liveness probe or the server's own exit in a pod; other:"
    " systemd, Docker, a person). Each counts in its workload's budget, circuit and backoff.",
    ("actor",))
UNKNOWN_WORKLOAD_ASKS = Event(
    "llm_vitals_remediator_backstop_unknown_workload_total", "counter",
    "Backstop asks (GET /api/v1/backstop) about a workload this remediator never heard of: a shim's"
    " `workload:` with a typo, or none (the target's name is asked). Such a workload is held for a bounded"
    " time, then the kubelet's backstop acts alone for it: fix the shim's workload.")
EVENTS: tuple[Event, ...] = (DECISIONS, RESTARTS, DURATION, OUTSIDE_RESTARTS, UNKNOWN_WORKLOAD_ASKS)


@dataclass(frozen=True)
class Scrape:
    """What one scrape reads, taken at once: the gate's state, the journal's last restarts, the store's health."""

    state: GateState
    now: float
    targets: list[str]  # the configured targets (static targets are their own workload)
    last_restart: Mapping[str, float]  # the journal's last restart started, per target
    health: StoreHealth | None
    budget_window: float
    backoff_reset: float


# One sample of a family: its label values and its value.
Row = tuple[tuple[str, ...], float]


@dataclass(frozen=True)
class Family:
    """A metric read at scrape time: `rows` gives its samples, maybe none."""

    name: str  # as exposed: a counter's ends in _total
    kind: Literal["gauge", "counter"]
    help: str
    rows: Callable[[Scrape], Iterable[Row]]
    labels: tuple[str, ...] = ()
    health: bool = False  # read from the store's health: absent when the remediator has none to read

    def family(self, scrape: Scrape) -> Metric:
        """The family as prometheus-client writes it (a counter family takes the name without _total)."""
        metric: GaugeMetricFamily | CounterMetricFamily
        if self.kind == "counter":
            metric = CounterMetricFamily(self.name.removesuffix("_total"), self.help, labels=self.labels)
        else:
            metric = GaugeMetricFamily(self.name, self.help, labels=self.labels)
        for values, value in self.rows(scrape):
            metric.add_metric(list(values), value)
        return metric


def _one(of: Callable[[Scrape], float]) -> Callable[[Scrape], Iterable[Row]]:
    """Rows of a family without labels: one sample."""
    return lambda scrape: (((), of(scrape)),)


def _health(of: Callable[[StoreHealth], float]) -> Callable[[Scrape], Iterable[Row]]:
    """One sample read from the store's health (the family is only written where there is one)."""
    return lambda scrape: () if scrape.health is None else (((), of(scrape.health)),)


def _workloads(scrape: Scrape) -> list[str]:
    """The workloads the budget gauges show: the static targets, and every workload the state counts."""
    state = scrape.state
    return sorted(set(scrape.targets) | set(state.open_circuits) | set(state.restart_times))


def _circuits(scrape: Scrape) -> Iterable[Row]:
    return [((w,), 1.0 if w in scrape.state.open_circuits else 0.0) for w in _workloads(scrape)]


def _restarts_used(scrape: Scrape) -> Iterable[Row]:
    since = scrape.now - scrape.budget_window
    return [((w,), float(sum(1 for t in scrape.state.restart_times.get(w, ()) if t > since)))
            for w in _workloads(scrape)]


def _last_restart(scrape: Scrape) -> Iterable[Row]:
    return [((t,), scrape.last_restart[t]) for t in scrape.targets if t in scrape.last_restart]


def _paused(scrape: Scrape) -> float:
    until = scrape.state.paused_until
    return 1.0 if until is not None and scrape.now < until else 0.0


def refusal_streaks(streaks: Mapping[str, tuple[float, float]], since: float) -> Iterable[Row]:
    """Per workload, seconds from the first to the latest refusal of its streak (first, latest): the
    streaks whose latest refusal came after `since`, as an older one has ended."""
    return [((w,), latest - first) for w, (first, latest) in sorted(streaks.items()) if latest > since]


def _paged(scrape: Scrape) -> Iterable[Row]:
    state = scrape.state
    ladder_pages = {w for w, (step, _) in state.ladder.items() if step == "page"}
    return [((w,), 1.0) for w in sorted(set(state.pages) | ladder_pages)]


def _streaks(scrape: Scrape) -> Iterable[Row]:
    return [((w,), float(count)) for w, (count, at) in sorted(scrape.state.backoff.items())
            if at > scrape.now - scrape.backoff_reset]


def _state_errors(scrape: Scrape) -> Iterable[Row]:
    errors = scrape.health.errors if scrape.health is not None else {}
    return [((operation,), float(errors.get(operation, 0))) for operation in ("read", "write", "follow")]


FAMILIES: tuple[Family, ...] = (
    Family("llm_vitals_remediator_circuit_open", "gauge",
           "1 when the workload's restart budget is exhausted and its restarts are refused until "
           "POST /api/v1/circuit/reset {\"workload\": ...}. Static targets are their own workload.",
           _circuits, ("workload",)),
    Family("llm_vitals_remediator_workload_restarts", "gauge",
           "Restarts (and moves) of the workload started within the budget window, since its last circuit "
           "reset, as the budget counts them against max_restarts; LLMServerRestartLoop reads it.",
           _restarts_used, ("workload",)),
    Family("llm_vitals_remediator_last_restart_timestamp_seconds", "gauge",
           "Unix time of the last restart started for the target (any result), from the journal.",
           _last_restart, ("target",)),
    Family("llm_vitals_remediator_restart_in_progress", "gauge",
           "1 while a restart runs; no other restart starts meanwhile.",
           _one(lambda s: 1.0 if s.state.in_progress else 0.0)),
    Family("llm_vitals_remediator_paused", "gauge",
           "1 while an operator has paused the remediator (POST /api/v1/pause): alerts are journaled "
           "as paused and nothing is restarted until the pause ends or DELETE /api/v1/pause.",
           _one(_paused)),
    Family("llm_vitals_remediator_disruption_budget_refused_seconds", "gauge",
           "Seconds from the first to the latest refusal of the workload's restart by a PodDisruptionBudget, while "
           "they keep coming (none for 2h ends the streak, and so does a restart that runs): the budget keeps the "
           "stuck server from being restarted. LLMVitalsRemediatorDisruptionBudget fires at an hour.",
           lambda s: refusal_streaks(s.state.disrupted, s.now - DISRUPTION_MEMORY_SECONDS), ("workload",)),
    Family("llm_vitals_remediator_node_escalated", "gauge",
           "1 for each node llm-vitals cordoned (a GPU fault, or the ladder's cordon_and_move) and has not "
           "been released: it is not escalated again. Uncordon it, then POST /api/v1/nodes/<node>/release.",
           lambda s: [((node,), 1.0) for node in sorted(s.state.cordoned_nodes)], ("node",)),
    Family("llm_vitals_remediator_workload_paged", "gauge",
           "1 for each workload the escalation ladder paged (escalated_to_human) and no human has released: "
           "its alerts are refused until POST /api/v1/workloads/release {\"workload\": ...}. "
           "LLMVitalsRemediatorWorkloadPaged fires while it holds.",
           _paged, ("workload",)),
    Family("llm_vitals_remediator_workload_restart_streak", "gauge",
           "Restarts (and moves) of the workload in its current streak: none quiet for budget.backoff.reset_after "
           "in between. Each makes the next wait longer (the backoff); the long horizon of LLMServerRestartLoop reads it.",
           _streaks, ("workload",)),
    Family("llm_vitals_remediator_backoff_refused_seconds", "gauge",
           "Seconds from the first to the latest refusal of the workload's stuck alerts for its backoff (the wait "
           "after a streak of restarts grows to budget.backoff.max), while they keep coming (none for 2h ends the "
           "streak, and so does a restart of it): a stuck server left as it is, possibly for hours. "
           "LLMVitalsRemediatorBackoffHolding fires while the series is there.",
           lambda s: refusal_streaks(s.state.backoff_refused, s.now - BACKOFF_REFUSAL_MEMORY_SECONDS), ("workload",)),
    Family("llm_vitals_remediator_state_up", "gauge",
           "1 when the last read or write of the gate's state (the replicas' Lease, or this replica's "
           "SQLite row) worked; 0 while it fails: no restart can be decided, webhooks answer 503.",
           _health(lambda h: 1.0 if h.up else 0.0), health=True),
    Family("llm_vitals_remediator_state_lost", "gauge",
           "1 while the gate's shared state is lost (its Lease deleted, its annotation unreadable, or "
           "created again by another replica): nothing is restarted, paused or reset until a human "
           "re-initialises it (POST /api/v1/state/reinit, see the runbook); 0 otherwise.",
           _health(lambda h: 1.0 if h.lost else 0.0), health=True),
    Family("llm_vitals_remediator_unresolved_intents", "gauge",
           "Restart intents this replica committed whose outcome it could not learn yet (the write's answer was "
           "lost and the gate's state has been unreadable since): each is re-read at the next alert and carried "
           "out once or released. Above 0 for long, a hang may go unhandled: LLMVitalsRemediatorIntentUnresolved.",
           _health(lambda h: float(h.unresolved)), health=True),
    Family("llm_vitals_remediator_state_errors_total", "counter",
           "Failed reads and writes of the gate's state, by operation (read, write, and follow: an "
           "unexpected error of the task that keeps a replica's view of the Lease fresh).",
           _state_errors, ("operation",), health=True),
)


class RemediatorMetrics:
    """The registry: the events' counters and histogram, and the collector that reads FAMILIES at each scrape."""

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
        self.decisions = DECISIONS.counter(self.registry)
        self.restarts = RESTARTS.counter(self.registry)
        self.duration = DURATION.histogram(self.registry)
        self.outside_restarts = OUTSIDE_RESTARTS.counter(self.registry)
        self.unknown_workload_asks = UNKNOWN_WORKLOAD_ASKS.counter(self.registry)
        self.registry.register(_StateCollector(sorted(targets), journal, state, clock, health, budget_window,
                                               backoff_reset))


@dataclass(eq=False)
class _StateCollector(Collector):
    """FAMILIES, read from the gate's state, its store and the journal on each scrape."""

    targets: list[str]
    journal: Journal
    state: Callable[[], GateState]
    clock: Callable[[], float]
    health: Callable[[], StoreHealth] | None
    budget_window: float
    backoff_reset: float = 12 * 3600.0

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        scrape = Scrape(self.state(), self.clock(), self.targets, self.journal.last_restart_by_target,
                        self.health() if self.health is not None else None, self.budget_window, self.backoff_reset)
        for family in FAMILIES:
            if not family.health or scrape.health is not None:
                yield family.family(scrape)
