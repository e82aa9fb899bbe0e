"""The cache the poller writes and every route reads: one record per target, plus its JSON view."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llm_vitals.exporter.gpu_faults import DcgmState, GpuFault, combine
from llm_vitals.exporter.settings import ExporterSettings, TargetSettings
from llm_vitals.exporter.verdict import Verdict, initial, is_live, is_ready, is_started, recently_unhealthy
from llm_vitals.logs import log_event
from llm_vitals.targets import CanaryView, TargetView

if TYPE_CHECKING:
    from llm_vitals.exporter.page import Rendered

log = logging.getLogger("llm_vitals.exporter")

# Poll-error reasons always exposed (at 0), so `increase()` sees the first error of each kind.
STANDARD_ERROR_REASONS = ("connect", "timeout", "http_status", "bad_metrics", "too_large")
CANARY_RESULTS = ("ok", "error", "timeout")


@dataclass(eq=False)
class TargetRecord:
    """Mutable per-target cache. Only the event loop touches it, so no lock is needed."""

    settings: TargetSettings
    verdict: Verdict
    history_seconds: float = 600.0
    poll_interval: float = 5.0
    draining: bool = False
    poll_duration: float | None = None
    polls: int = 0
    poll_errors: Counter[str] = field(default_factory=Counter)
    canaries: Counter[str] = field(default_factory=Counter)
    canary_task: asyncio.Task[None] | None = None
    last_canary_sent: float | None = None
    model: str | None = None  # resolved canary model (configured, or first id of /v1/models)
    # One GPU fault per source (llm_vitals/exporter/gpu_faults/); `gpu_fault` is their combination.
    file_fault: GpuFault | None = None  # the gpu_fault_file's first line, read each poll
    node_fault: GpuFault | None = None  # the node's conditions and taints, set by the node watch
    dcgm_fault: GpuFault | None = None  # the dcgm-exporter page, read each poll
    dcgm_state: DcgmState = field(default_factory=DcgmState)
    nvml_fault: GpuFault | None = None  # the target's `gpus` as the NVML source read them, each poll
    # Why a GPU-fault source could not be read (source -> error): kept and shown, never a fault.
    gpu_fault_errors: dict[str, str] = field(default_factory=dict)
    history: deque[tuple[float, float, str]] = field(default_factory=deque)
    # This target's /metrics lines, rendered when its reading changed (llm_vitals/exporter/page.py): kept here
    # so that a target dropped from the store takes them with it.
    rendered: Rendered | None = None

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def fault(self) -> GpuFault | None:
        """The GPU fault of the first source that flags one: file, node, dcgm, nvml."""
        return combine([self.file_fault, self.node_fault, self.dcgm_fault, self.nvml_fault])

    @property
    def gpu_fault(self) -> str | None:
        """The fault's detail, None without one: what readiness, the API and `llm_vitals_gpu_fault` read."""
        fault = self.fault
        return fault.detail if fault else None

    def ready(self, now: float) -> bool:
        """What the readiness probe answers."""
        return is_ready(self.verdict, self.settings, now, self.draining, gpu_fault=self.gpu_fault is not None)

    def live(self, now: float) -> bool:
        return is_live(self.verdict, self.settings, now)

    def remember(self, now: float) -> None:
        """Append this poll to the short history a status page draws its sparkline from."""
        self.history.append((round(now, 3), round(self.verdict.steps_per_second or 0.0, 3), self.verdict.state))
        horizon = now - self.history_seconds
        while self.history and self.history[0][0] < horizon:
            self.history.popleft()


class StateStore:
    """The records of the targets watched now, in the order they were added (static targets first).

    Targets are added and removed only through `add` and `remove`: a removed record takes with it
    everything kept for its target (verdict, history, counters, any rendered text), so a target that
    is gone leaves no series in /metrics, the API or the status page.
    """

    def __init__(self, settings: ExporterSettings, now: float) -> None:
        self.history_seconds = settings.history_seconds
        self.poll_interval = settings.poll_interval
        self.records: dict[str, TargetRecord] = {}
        for target in settings.targets:
            self.add(target, now)

    def add(self, target: TargetSettings, now: float) -> TargetRecord:
        """A fresh record (`starting`) for `target`, replacing any record of that name."""
        record = TargetRecord(target, initial(now), history_seconds=self.history_seconds, poll_interval=self.poll_interval)
        self.records.pop(target.name, None)  # a replaced target goes to the end, as a new one would
        self.records[target.name] = record
        return record

    def remove(self, name: str) -> TargetRecord | None:
        """Forget the target `name` and all that is kept for it; its record, or None when unknown."""
        return self.records.pop(name, None)

    def settings(self) -> dict[str, TargetSettings]:
        """Each watched target's settings, by name: what `targetset.reconcile` compares with."""
        return {name: record.settings for name, record in self.records.items()}

    def get(self, name: str) -> TargetRecord | None:
        return self.records.get(name)

    def __iter__(self) -> Iterator[TargetRecord]:
        # A copy: a scrape or a page hands the loop back while iterating, and discovery may add or
        # remove a target meanwhile.
        return iter(list(self.records.values()))


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def target_view(record: TargetRecord, now: float) -> TargetView:
    """The TARGET JSON of docs/interfaces.md ("Exporter API"). Never holds a secret."""
    verdict, target = record.verdict, record.settings
    snap = verdict.snapshot
    fresh = snap if verdict.up else None  # running/waiting as read by the last poll, not a stale one
    return TargetView(
        name=target.name,
        engine=target.engine,
        role=target.role,
        url=target.public_url,
        state=verdict.state,
        reason=verdict.reason,
        detail=verdict.detail,
        since=_round(verdict.since),
        stuck_seconds=round(verdict.stuck_for(now), 3),
        process_start_time=verdict.process_start_time,
        last_poll=_round(verdict.last_poll),
        up=verdict.up,
        ready=record.ready(now),
        live=record.live(now),
        started=is_started(verdict),
        draining=record.draining,
        gpu_fault=record.gpu_fault is not None,
        gpu_fault_detail=record.gpu_fault,
        gpu_fault_source=fault.source if (fault := record.fault) else None,
        gpu_fault_errors=dict(record.gpu_fault_errors),
        node=target.node,
        namespace=getattr(target, "namespace", None),
        pod=getattr(target, "pod", None),
        pod_uid=getattr(target, "pod_uid", None),
        restarts=verdict.restarts,
        last_restart_at=_round(verdict.last_restart_at),
        last_unhealthy_at=_round(verdict.last_unhealthy_at),
        # Unhealthy now or within two polls: what the remediator's fleet gate counts.
        recently_unhealthy=recently_unhealthy(verdict, now, 2 * record.poll_interval),
        running=fresh.running if fresh else None,
        waiting=fresh.waiting if fresh else None,
        steps_per_second=_round(verdict.steps_per_second),
        generation_tokens_per_second=_round(verdict.generation_tokens_per_second),
        counters=snap.counters() if snap else {},
        canary=CanaryView(
            consecutive_failures=verdict.canary_failures,
            last_success=_round(verdict.last_canary_ok),
            in_flight=record.canary_task is not None,
            results={result: record.canaries[result] for result in CANARY_RESULTS},
        ),
        poll_errors=dict(record.poll_errors),
        poll_duration_seconds=_round(record.poll_duration, 4),
        polls=record.polls,
    )


def log_gpu_fault_change(record: TargetRecord, before: str | None) -> None:
    """One log line when the target's combined GPU fault appears, changes or clears."""
    after = record.gpu_fault
    if after != before:
        fault = record.fault
        log_event(log, "gpu fault flagged" if after else "gpu fault cleared", logging.WARNING,
                  target=record.name, source=fault.source if fault else None, detail=after)
