"""The remediator's own metrics, in a registry of its own.

Counters and the duration histogram are updated as things happen. The circuit state, the
in-progress flag and the pause are read from the gate's state as its store last saw it, and the
last restart time from the journal, at scrape time by a custom collector (no I/O), so they are
right after a restart of the remediator too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .gate import JournalState
    from .journal import Journal

# A label value for targets that are not in the config: the payload's own value would let a
# caller create unbounded series.
UNKNOWN_TARGET = "(unknown)"


class RemediatorMetrics:
    def __init__(
        self,
        targets: Iterable[str],
        journal: Journal,
        state: Callable[[], JournalState],
        clock: Callable[[], float] = time.time,
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
        self.registry.register(_JournalCollector(sorted(targets), journal, state, clock))


class _JournalCollector(Collector):
    """Gauges read from the gate's state and the journal on each scrape. Sample:

    llm_vitals_remediator_circuit_open{target="gpu-a"} 0.0
    llm_vitals_remediator_last_restart_timestamp_seconds{target="gpu-a"} 1.7962223e+09
    llm_vitals_remediator_restart_in_progress 0.0
    llm_vitals_remediator_paused 0.0
    """

    def __init__(
        self, targets: list[str], journal: Journal, state: Callable[[], JournalState], clock: Callable[[], float]
    ):
        self.targets = targets
        self.journal = journal
        self.state = state
        self.clock = clock

    def describe(self) -> list:
        return []

    def collect(self) -> Iterable[GaugeMetricFamily]:
        state = self.state()
        last_by_target = self.journal.last_restart_by_target
        circuit = GaugeMetricFamily(
            "llm_vitals_remediator_circuit_open",
            "1 when the target's restart budget is exhausted and restarts are refused until "
            "POST /api/v1/circuit/reset.",
            labels=["target"],
        )
        last = GaugeMetricFamily(
            "llm_vitals_remediator_last_restart_timestamp_seconds",
            "Unix time of the last restart started for the target (any result), from the journal.",
            labels=["target"],
        )
        for target in self.targets:
            circuit.add_metric([target], 1.0 if target in state.open_circuits else 0.0)
            if target in last_by_target:
                last.add_metric([target], last_by_target[target])
        yield circuit
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
            value=1.0 if paused_until is not None and self.clock() < paused_until else 0.0,
        )
