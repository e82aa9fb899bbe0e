"""The cache the poller writes and every route reads: one record per target, plus its JSON view."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Final

from llm_vitals.backstop_word import BackstopWord
from llm_vitals.exporter.backstop_rule import Backstop, Heard, backstop, held, last_held
from llm_vitals.exporter.backstop_rule import heard as with_answer
from llm_vitals.exporter.engines import ModelConfig
from llm_vitals.exporter.gpu_faults import GpuFault, GpuFaultState
from llm_vitals.exporter.pace import NOT_JUDGED, Pace, peer_group
from llm_vitals.exporter.pace_track import PaceTracker
from llm_vitals.exporter.settings import ExporterSettings, TargetSettings
from llm_vitals.exporter.verdict import (
    Verdict,
    initial,
    is_live,
    is_ready,
    is_started,
    pause_exceeded,
    recently_unhealthy,
)
from llm_vitals.logs import log_event
from llm_vitals.targets import BackstopView, CanaryView, PaceView, TargetView

log = logging.getLogger("llm_vitals.exporter")

# Poll-error reasons always exposed (at 0), so `increase()` sees the first error of each kind.
STANDARD_ERROR_REASONS = ("connect", "timeout", "http_status", "bad_metrics", "too_large", "exporter_late")
CANARY_RESULTS = ("ok", "error", "timeout", "rejected")


class TargetRecord:
    """One target's cache: its verdict and all that is kept beside it. Only the event loop touches
    it, so no lock is needed.

    Three tasks change a target: its poll loop (its reading, and the GPU-fault sources it reads,
    written at once through `set_gpu_faults`), its canary task and the drain route.
    Each change goes through one of the methods below, and each bumps `version`: whatever keeps a
    rendering of the record (llm_vitals/exporter/page.py) compares versions, never fields, so no
    writer can forget to tell it. What the record holds is read through properties only; the
    counters and the history are handed out as read-only views (Mapping, Sequence) of what it owns.
    """

    __slots__ = ("_canaries", "_canary_path", "_canary_task", "_draining", "_gpu_faults", "_heard", "_history",
                 "_last_canary_sent", "_model", "_model_config", "_model_config_tried", "_pace", "_poll_duration",
                 "_poll_errors", "_polls", "_started_at", "_verdict",
                 "_version", "backstop_after", "history_seconds", "peer_group", "poll_interval", "settings")

    def __init__(self, settings: TargetSettings, verdict: Verdict, *, history_seconds: float = 600.0,
                 poll_interval: float = 5.0, backstop_after: float | None = None) -> None:
        # Fixed for the record's life: a target whose settings change gets a fresh record (StateStore.add).
        self.settings: Final = settings
        self.history_seconds: Final = history_seconds
        self.poll_interval: Final = poll_interval
        self._version = 0
        self._verdict = verdict
        self._draining = False
        self._poll_duration: float | None = None
        self._polls = 0
        self._poll_errors: Counter[str] = Counter()
        self._canaries: Counter[str] = Counter()
        self._canary_task: asyncio.Task[None] | None = None
        self._last_canary_sent: float | None = None
        self._model: str | None = None
        self._canary_path: str | None = None  # the canary endpoint that last answered (canary.endpoint auto)
        # The engine's own config of the target's model (exporter/decoupled.py), for this process; None: unknown.
        self._model_config: ModelConfig | None = None
        self._model_config_tried: float | None = None
        # Each GPU-fault source's last read (llm_vitals/exporter/gpu_faults/); `fault` is their combination.
        self._gpu_faults = GpuFaultState()
        self._history: deque[tuple[float, float, str]] = deque()
        # The remediator's word for this target's workload (exporter/backstop_rule.py); None: not asked.
        self.backstop_after: Final = backstop_after
        self._heard = Heard()
        self._started_at = verdict.since
        self._pace = NOT_JUDGED  # beside its peers (exporter/pace.py), judged after each poll
        self.peer_group: Final = peer_group(settings.effective_workload)  # whose pace it is compared with

    # What it holds, read-only.

    @property
    def version(self) -> int:
        """Bumped by every change: equal versions mean nothing about the target changed in between."""
        return self._version

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def verdict(self) -> Verdict:
        """The last verdict (immutable: each poll or canary replaces it)."""
        return self._verdict

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def poll_duration(self) -> float | None:
        """Seconds the last poll took; None before the first."""
        return self._poll_duration

    @property
    def polls(self) -> int:
        return self._polls

    @property
    def poll_errors(self) -> Mapping[str, int]:
        """Polls that got no usable reading, by reason (`internal`: a bug of the exporter's)."""
        return self._poll_errors

    @property
    def canaries(self) -> Mapping[str, int]:
        """Canaries answered, by result (ok, error, timeout)."""
        return self._canaries

    @property
    def canary_task(self) -> asyncio.Task[None] | None:
        """The canary in flight, if any (one at most)."""
        return self._canary_task

    @property
    def last_canary_sent(self) -> float | None:
        return self._last_canary_sent

    @property
    def model(self) -> str | None:
        """The canary's model: the configured one, or the first id `/v1/models` listed."""
        return self._model

    @property
    def gpu_faults(self) -> GpuFaultState:
        """Each GPU-fault source's last read of the target (file, node, dcgm, nvml)."""
        return self._gpu_faults

    @property
    def gpu_fault_errors(self) -> Mapping[str, str]:
        """Why a GPU-fault source could not be read (source -> error): kept and shown, never a fault."""
        return self._gpu_faults.errors

    @property
    def history(self) -> Sequence[tuple[float, float, str]]:
        """(time, steps per second, state) of each poll within `history_seconds`: the status page's sparkline."""
        return self._history

    @property
    def fault(self) -> GpuFault | None:
        """The GPU fault of the first source that flags one: file, node, dcgm, nvml."""
        return self._gpu_faults.fault

    @property
    def gpu_fault(self) -> str | None:
        """The fault's detail, None without one: what readiness, the API and `llm_vitals_gpu_fault` read."""
        fault = self.fault
        return fault.detail if fault else None

    def paused_too_long(self, now: float) -> bool:
        """Paused on purpose for longer than the target's pause_budget (verdict.pause_exceeded)."""
        return pause_exceeded(self._verdict, self.settings, now)

    def ready(self, now: float) -> bool:
        """What the readiness probe answers."""
        return is_ready(self._verdict, self.settings, now, self._draining, gpu_fault=self.gpu_fault is not None)

    @property
    def heard(self) -> Heard:
        """What the shim heard from the remediator for this target's workload."""
        return self._heard

    def backstop(self, now: float) -> Backstop | None:
        """The liveness backstop's mode now (exporter/backstop_rule.py); None when the remediator is not asked."""
        if self.backstop_after is None:
            return None
        return backstop(self._heard, now, self.backstop_after, self._started_at, self._verdict.restarts)

    def live(self, now: float) -> bool:
        """What the liveness probe answers: the verdict's rule, held while the remediator's gate holds."""
        if self.backstop_after is None:
            return is_live(self._verdict, self.settings, now)
        after, restarts = self.backstop_after, self._verdict.restarts
        mode = backstop(self._heard, now, after, self._started_at, restarts)
        return is_live(self._verdict, self.settings, now, holding=mode.mode == "hold",
                       held_at=last_held(self._heard, now, after, self._started_at, restarts))

    def held_back(self, now: float) -> bool:
        """Whether the remediator's hold is all that keeps liveness passing: the server is stuck past its budget."""
        backstop = self.backstop(now)
        return backstop is not None and backstop.mode == "hold" and not is_live(self._verdict, self.settings, now)

    def take_answer(self, answer: BackstopWord | str | None, now: float) -> None:
        """The remediator's answer to the backstop's ask at `now` (exporter/backstop_ask.py): a word, why it
        could not be read, or None (no answer at all)."""
        if self.backstop_after is None:
            return
        # held() first: a hold that an `act` ends now, ends now (the liveness budget counts from it).
        after, restarts = self.backstop_after, self._verdict.restarts
        now_heard = with_answer(held(self._heard, now, after, self._started_at, restarts), answer, now, restarts, after)
        if now_heard != self._heard:
            self._heard = now_heard
            self._version += 1

    # Its changes: one method each, each bumps the version.

    def record_poll(self, verdict: Verdict, now: float, duration: float, wall: float | None = None,
                    pace: Pace | None = None) -> None:
        """A poll's verdict: counted (and its error reason, if any), and kept in the history; and its
        pace beside its workload's peers, judged after it (pace_track.py; None: kept as it was).

        The history is what the status page and the history route show: it is kept in wall time
        (`wall`, the same instant as the monotonic `now`; `now` itself when not given).
        """
        if pace is not None and pace is not self._pace and pace != self._pace:  # most polls hand it back as it was
            self._pace = pace
        shown = now if wall is None else wall
        self._verdict = verdict
        self._poll_duration = duration
        self._polls += 1
        if verdict.error_reason:
            self._poll_errors[verdict.error_reason] += 1
        self._history.append((round(shown, 3), round(verdict.steps_per_second or 0.0, 3), verdict.state))
        horizon = shown - self.history_seconds
        while self._history and self._history[0][0] < horizon:
            self._history.popleft()
        self._version += 1

    @property
    def pace(self) -> Pace:
        """Its pace beside its workload's peers (exporter/pace.py): `degraded`, never a state."""
        return self._pace

    def count_poll_error(self, reason: str) -> None:
        """A poll that ended without a verdict (`internal`: an exception in the exporter itself)."""
        self._poll_errors[reason] += 1
        self._version += 1

    def set_gpu_faults(self, faults: GpuFaultState) -> None:
        """The GPU-fault sources' reads of this poll (gpu_faults/reader.py): the one door for GPU faults,
        and one log line when the target's combined fault appears, changes or clears."""
        if faults != self._gpu_faults:
            before = self.gpu_fault
            self._gpu_faults = faults
            self._version += 1
            after = self.gpu_fault
            if after != before:
                fault = self.fault
                log_event(log, "gpu fault flagged" if after else "gpu fault cleared", logging.WARNING,
                          target=self.name, source=fault.source if fault else None, detail=after)

    def canary_sent(self, task: asyncio.Task[None], now: float) -> None:
        self._canary_task, self._last_canary_sent = task, now
        self._version += 1

    def record_canary(self, result: str, verdict: Verdict) -> None:
        """A canary's result, counted, and the verdict it leaves."""
        self._canaries[result] += 1
        self._verdict = verdict
        self._version += 1

    def canary_ended(self) -> None:
        """The canary task is over (answered, failed, or cancelled)."""
        self._canary_task = None
        self._version += 1

    def set_model(self, model: str | None) -> None:
        """The canary's model as looked up; None to look it up again."""
        self._model = model
        self._version += 1

    @property
    def canary_path(self) -> str | None:
        """The canary endpoint that last answered, tried first next time (exporter/canary.py)."""
        return self._canary_path

    @property
    def model_config(self) -> ModelConfig | None:
        """The target model's own config as the engine last gave it; None: not read (yet)."""
        return self._model_config

    @property
    def model_config_tried(self) -> float | None:
        """When its config was last asked for (monotonic); None: not since the process started."""
        return self._model_config_tried

    def set_model_config(self, config: ModelConfig | None, tried: float | None) -> None:
        """The model config just read (None: unread, or forgotten after a restart), and when it was asked."""
        self._model_config, self._model_config_tried = config, tried
        self._version += 1

    def set_canary_path(self, path: str | None) -> None:
        """The canary endpoint that answered; None to try them all again."""
        self._canary_path = path
        self._version += 1

    def set_draining(self, draining: bool) -> bool:
        """Drain (readiness 0 whatever the verdict) or undrain; whether that changed anything."""
        if draining == self._draining:
            return False
        self._draining = draining
        self._version += 1
        return True


class StateStore:
    """The records of the targets watched now, in the order they were added (static targets first).

    Targets are added and removed only through `add` and `remove`: a removed record takes with it
    everything kept for its target (verdict, history, counters), so a target that is gone leaves no
    series in /metrics, the API or the status page.
    """

    def __init__(self, settings: ExporterSettings, now: float) -> None:
        self.history_seconds = settings.history_seconds
        self.poll_interval = settings.poll_interval
        self.backstop_after = settings.backstop.after if settings.backstop is not None else None
        self.records: dict[str, TargetRecord] = {}
        self.pace = PaceTracker()  # every target's pace readings, by peer group
        for target in settings.targets:
            self.add(target, now)

    def add(self, target: TargetSettings, now: float) -> TargetRecord:
        """A fresh record (`starting`) for `target`, replacing any record of that name."""
        record = TargetRecord(target, initial(now), history_seconds=self.history_seconds, poll_interval=self.poll_interval,
                              backstop_after=self.backstop_after)
        self.records.pop(target.name, None)  # a replaced target goes to the end, as a new one would
        self.records[target.name] = record
        return record

    def remove(self, name: str) -> TargetRecord | None:
        """Forget the target `name` and all that is kept for it; its record, or None when unknown."""
        self.pace.forget(name)
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


def target_view(record: TargetRecord, now: float, wall: float | None = None) -> TargetView:
    """The TARGET JSON of docs/interfaces.md ("Exporter API"). Never holds a secret.

    `now` is monotonic, as every instant the verdict holds; `wall` is the same instant in Unix time
    (`now` itself when not given), which the timestamps are shown in.
    """
    verdict, target = record.verdict, record.settings
    offset = 0.0 if wall is None else wall - now

    def shown(instant: float | None) -> float | None:
        return None if instant is None else round(instant + offset, 3)

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
        since=shown(verdict.since),
        stuck_seconds=round(verdict.stuck_for(now), 3),
        process_start_time=verdict.process_start_time,
        last_poll=shown(verdict.last_poll),
        up=verdict.up,
        ready=record.ready(now),
        live=record.live(now),
        paused_too_long=record.paused_too_long(now),
        started=is_started(verdict),
        draining=record.draining,
        gpu_fault=record.gpu_fault is not None,
        gpu_fault_detail=record.gpu_fault,
        gpu_fault_source=fault.source if (fault := record.fault) else None,
        gpu_fault_errors=dict(record.gpu_fault_errors),
        workload=target.effective_workload,
        node=target.node,
        namespace=getattr(target, "namespace", None),
        pod=getattr(target, "pod", None),
        pod_uid=getattr(target, "pod_uid", None),
        restarts=verdict.restarts,
        last_restart_at=shown(verdict.last_restart_at),
        last_unhealthy_at=shown(verdict.last_unhealthy_at),
        # Unhealthy now or within two polls: what the remediator's fleet gate counts.
        recently_unhealthy=recently_unhealthy(verdict, now, 2 * record.poll_interval),
        running=fresh.running if fresh else None,
        waiting=fresh.waiting if fresh else None,
        deferred=fresh.deferred if fresh else None,
        unit=verdict.unit,
        steps_per_second=_round(verdict.steps_per_second),
        generation_tokens_per_second=_round(verdict.generation_tokens_per_second),
        counters=snap.counters() if snap else {},
        canary=CanaryView(
            consecutive_failures=verdict.canary_failures,
            last_success=shown(verdict.last_canary_ok),
            in_flight=record.canary_task is not None,
            results={result: record.canaries[result] for result in CANARY_RESULTS},
        ),
        poll_errors=dict(record.poll_errors),
        poll_duration_seconds=_round(record.poll_duration, 4),
        polls=record.polls,
        backstop=backstop_view(record, now),
        pace=pace_view(record.pace, offset),
    )


def pace_view(pace: Pace, offset: float) -> PaceView:
    """The view's `pace`: its instants in wall time (`offset` added)."""
    return PaceView(ratio=_round(pace.ratio), peers=pace.peers, degraded=pace.degraded,
                    since=None if pace.since is None else round(pace.since + offset, 3), basis=pace.basis,
                    detail=pace.detail)


def backstop_view(record: TargetRecord, now: float) -> BackstopView | None:
    """The backstop's mode and the word's age, for the API and the status page; None when not asked."""
    mode = record.backstop(now)
    if mode is None:
        return None
    heard = record.heard
    return BackstopView(mode=mode.mode, reason=mode.reason, detail=mode.detail,
                        word_since=heard.word.since if heard.word is not None else None,
                        word_age_seconds=_round(None if heard.heard_at is None else now - heard.heard_at),
                        answered_age_seconds=_round(None if heard.answered_at is None else now - heard.answered_at))
