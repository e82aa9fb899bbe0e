"""The exposition: a custom Collector that renders the cached verdicts on each scrape.

No global gauges and no I/O here: `collect()` reads the StateStore, so a target removed from the
config leaves no series behind, and two Prometheus replicas scraping do not double the load on the
model servers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.state import CANARY_RESULTS, STANDARD_ERROR_REASONS, StateStore
from exporter.verdict import STATES

_CACHED = (
    " Read from the exporter's cache, filled by polls at a fixed interval (not on scrape);"
    " see llm_vitals_last_poll_timestamp_seconds for staleness."
)


class VitalsCollector(Collector):
    """Emits DESIGN §2's metrics for every configured target, for example::

        llm_vitals_target_info{target="gpu-a",engine="vllm",role="backend",url="http://10.0.0.5:8000"} 1
        llm_vitals_up{target="gpu-a"} 1
        llm_vitals_state{target="gpu-a",state="busy"} 1
        llm_vitals_state{target="gpu-a",state="stuck"} 0
        llm_vitals_requests_running{target="gpu-a"} 2
        llm_vitals_engine_steps_per_second{target="gpu-a"} 31.5
        llm_vitals_stuck_seconds{target="gpu-a"} 0
        llm_vitals_restarts_total{target="gpu-a"} 1
        llm_vitals_canary_requests_total{target="gpu-a",result="ok"} 12
        llm_vitals_poll_errors_total{target="gpu-a",reason="timeout"} 0
    """

    def __init__(self, store: StateStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        t = ["target"]
        info = GaugeMetricFamily("llm_vitals_target_info", "Static facts about each watched target; always 1.",
                                 labels=["target", "engine", "role", "url"])
        up = GaugeMetricFamily("llm_vitals_up", "1 when the last poll got a usable reading from the target." + _CACHED, labels=t)
        state = GaugeMetricFamily(
            "llm_vitals_state",
            "1 for the target's current state, 0 for the others. stuck/unresponsive are candidates for a restart;"
            " busy is load, never a reason to restart." + _CACHED, labels=["target", "state"])
        running = GaugeMetricFamily("llm_vitals_requests_running", "Requests the engine is running, as last read." + _CACHED, labels=t)
        waiting = GaugeMetricFamily("llm_vitals_requests_waiting", "Requests queued in the engine, as last read." + _CACHED, labels=t)
        steps = GaugeMetricFamily("llm_vitals_engine_steps_per_second",
                                  "Engine steps per second between the last two reads of one process lifetime.", labels=t)
        tokens = GaugeMetricFamily("llm_vitals_generation_tokens_per_second",
                                   "Generated tokens per second between the last two reads of one process lifetime.", labels=t)
        stuck = GaugeMetricFamily(
            "llm_vitals_stuck_seconds",
            "Seconds work has been pending with no engine signal moving; 0 when idle or progressing.", labels=t)
        restarts = CounterMetricFamily(
            "llm_vitals_restarts_total",
            "Server restarts detected since the exporter started (start time changed, or counters reset).", labels=t)
        start_time = GaugeMetricFamily("llm_vitals_process_start_time_seconds",
                                       "The server's process_start_time_seconds, as last read.", labels=t)
        canaries = CounterMetricFamily(
            "llm_vitals_canary_requests_total",
            "Idle canaries sent (max_tokens 1), by result. Only ever sent when nothing was running or waiting.",
            labels=["target", "result"])
        canary_ok = GaugeMetricFamily("llm_vitals_canary_last_success_timestamp_seconds",
                                      "Unix time of the last canary that got an answer.", labels=t)
        ready = GaugeMetricFamily("llm_vitals_ready", "What /probe/<target>/ready answers (1 = 200). Never depends on load.", labels=t)
        live = GaugeMetricFamily("llm_vitals_live", "What /probe/<target>/live answers (1 = 200): 0 only when stuck past the liveness budget.", labels=t)
        draining = GaugeMetricFamily("llm_vitals_draining", "1 after POST /probe/<target>/drain, until undrain.", labels=t)
        gpu_fault = GaugeMetricFamily("llm_vitals_gpu_fault", "1 when a GPU fault is flagged for the target; a restart will not help.", labels=t)
        last_poll = GaugeMetricFamily("llm_vitals_last_poll_timestamp_seconds",
                                      "Unix time of the target's last completed poll: alert when it stops moving.", labels=t)
        duration = GaugeMetricFamily("llm_vitals_poll_duration_seconds", "How long the target's last poll took.", labels=t)
        errors = CounterMetricFamily("llm_vitals_poll_errors_total",
                                     "Polls that got no usable reading, by reason (connect, timeout, http_status, bad_metrics, too_large, ...).",
                                     labels=["target", "reason"])

        for record in self.store:
            name, target, verdict = record.name, record.settings, record.verdict
            info.add_metric([name, target.engine, target.role, target.public_url], 1)
            up.add_metric([name], 1 if verdict.up else 0)
            for each in STATES:
                state.add_metric([name, each], 1 if verdict.state == each else 0)
            if verdict.up and verdict.snapshot is not None:
                running.add_metric([name], verdict.snapshot.running)
                waiting.add_metric([name], verdict.snapshot.waiting)
            steps.add_metric([name], verdict.steps_per_second or 0.0)
            tokens.add_metric([name], verdict.generation_tokens_per_second or 0.0)
            stuck.add_metric([name], verdict.stuck_for(now))
            restarts.add_metric([name], verdict.restarts)
            if verdict.process_start_time is not None:
                start_time.add_metric([name], verdict.process_start_time)
            for result in CANARY_RESULTS:
                canaries.add_metric([name, result], record.canaries[result])
            if verdict.last_canary_ok is not None:
                canary_ok.add_metric([name], verdict.last_canary_ok)
            ready.add_metric([name], 1 if record.ready(now) else 0)
            live.add_metric([name], 1 if record.live(now) else 0)
            draining.add_metric([name], 1 if record.draining else 0)
            gpu_fault.add_metric([name], 1 if record.gpu_fault is not None else 0)
            if verdict.last_poll is not None:
                last_poll.add_metric([name], verdict.last_poll)
            if record.poll_duration is not None:
                duration.add_metric([name], record.poll_duration)
            for reason in sorted(set(STANDARD_ERROR_REASONS) | set(record.poll_errors)):
                errors.add_metric([name, reason], record.poll_errors[reason])

        yield from (info, up, state, running, waiting, steps, tokens, stuck, restarts, start_time, canaries,
                    canary_ok, ready, live, draining, gpu_fault, last_poll, duration, errors)
        targets = GaugeMetricFamily("llm_vitals_exporter_targets", "Targets in the exporter's config.")
        targets.add_metric([], len(self.store.records))
        yield targets


def build_registry(store: StateStore, clock: Callable[[], float] = time.time) -> CollectorRegistry:
    """A registry of our own (never the global REGISTRY): the vitals plus this process's CPU and memory."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(VitalsCollector(store, clock))
    ProcessCollector(registry=registry)
    return registry
