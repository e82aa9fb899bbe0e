"""The exposition's one definition: every metric family the exporter writes for each target, and
the helpers that write them in the text format (format 0.0.4, byte for byte what prometheus-client
writes for the same families).

No global gauges and no I/O here: a scrape reads the StateStore, so a target removed from the
config leaves no series behind, and two Prometheus replicas scraping do not double the load on the
model servers. llm_vitals/exporter/page.py writes the page from FAMILIES, one target at a time and
only for targets that changed; prometheus-client objects are not used for it: at 1,000 targets the
page is 24,000 lines, and prometheus-client built and formatted it in ~0.4 s of CPU on the event
loop, where every probe waited for it (bench/bench_poll_1000.py). The exporter's own health
(config reloads, discovery, process) is a prometheus-client Collector (`LifecycleCollector`).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from llm_vitals.exporter.backstop_rule import MODES, Backstop, Heard
from llm_vitals.exporter.discovery.manager import Discovery
from llm_vitals.exporter.loop_lag import LoopLag
from llm_vitals.exporter.pace import NOT_JUDGED, Pace
from llm_vitals.exporter.reload import ReloadState
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.state import CANARY_RESULTS, STANDARD_ERROR_REASONS, TargetRecord
from llm_vitals.exporter.verdict import STATES, Verdict, pause_exceeded

_CACHED = (
    " Read from the exporter's cache, filled by polls at a fixed interval (not on scrape);"
    " see llm_vitals_last_poll_timestamp_seconds for staleness."
)


@dataclass(slots=True)
class Reading:
    """What one scrape reads of a target, taken at once: the polls that run while the page is
    rendered (it hands the loop back between families) do not change it, so a page never says
    `busy` in one family and carries the next poll's stuck seconds in another."""

    settings: TargetSettings
    verdict: Verdict  # immutable, replaced by each poll
    ready: bool
    live: bool
    draining: bool
    gpu_fault: bool
    poll_duration: float | None
    poll_errors: dict[str, int]  # copies: the record's counters are updated in place
    canaries: dict[str, int]
    offset: float = 0.0  # wall minus monotonic time at the read: the verdict's instants are monotonic
    backstop: Backstop | None = None  # the liveness backstop's mode; None: the remediator is not asked
    heard: Heard | None = None
    held_back: bool = False  # held, and stuck past the liveness budget
    gpu_fault_lossy: bool = False  # a GPU-fault source read for it can lose fault events
    pace: Pace = NOT_JUDGED  # beside its workload's peers (exporter/pace.py); immutable

    @property
    def name(self) -> str:
        return self.settings.name

    def shown(self, instant: float | None) -> float | None:
        """A monotonic instant of the verdict as the Unix time it is shown in."""
        return None if instant is None else instant + self.offset


def read(record: TargetRecord, now: float, wall: float | None = None) -> Reading:
    """~2 µs a target (a dataclass copy with two Counters took ~13 µs, and showed in probe latency).

    `now` is monotonic; `wall` the same instant in Unix time, for the timestamps (`now` when not given).
    """
    return Reading(record.settings, record.verdict, record.ready(now), record.live(now), record.draining,
                   record.gpu_fault is not None, record.poll_duration, dict(record.poll_errors), dict(record.canaries),
                   0.0 if wall is None else wall - now, record.backstop(now), record.heard, record.held_back(now),
                   record.gpu_faults.lossy, record.pace)


# One sample of a family for one target: the values of the labels after `target`, and the value.
Row = tuple[tuple[str, ...], float]


@dataclass(frozen=True)
class Family:
    """One metric family with a `target` label (first) and maybe more, e.g. `state` or `reason`."""

    name: str  # as exposed: counters end in _total
    kind: Literal["gauge", "counter"]
    help: str
    rows: Callable[[Reading, float], Iterable[Row]]  # (reading, now) -> its samples, maybe none
    more_labels: tuple[str, ...] = ()

    @property
    def labels(self) -> tuple[str, ...]:
        return ("target", *self.more_labels)


def _value(of: Callable[[Reading, float], float | None]) -> Callable[[Reading, float], Iterable[Row]]:
    """Rows for a family with only the target label: one sample, none when `of` gives None."""

    def rows(reading: Reading, now: float) -> Iterable[Row]:
        value = of(reading, now)
        return () if value is None else (((), value),)

    return rows


def _flag(of: Callable[[Reading, float], bool]) -> Callable[[Reading, float], Iterable[Row]]:
    return _value(lambda r, now: 1 if of(r, now) else 0)


def _fresh(field: str) -> Callable[[Reading, float], Iterable[Row]]:
    """running/waiting as read by the last poll; no sample when that poll failed (not a stale value)."""
    return _value(lambda r, now: getattr(r.verdict.snapshot, field) if r.verdict.up and r.verdict.snapshot else None)


FAMILIES: tuple[Family, ...] = (
    Family("llm_vitals_target_info", "gauge",
           "Static facts about each watched target; always 1. namespace and pod are those of a target found by"
           " Kubernetes discovery (empty otherwise); node is the Kubernetes node its GPU faults are read from;"
           " workload is what a restart does not replace, which restart budgets count against: Deployment/ns/name,"
           " StatefulSet/ns/name, DaemonSet/ns/name, LeaderWorkerSet/ns/name/group, a configured name, or the"
           " target's own name.",
           lambda r, now: (((r.settings.engine, r.settings.role, r.settings.public_url,
                             getattr(r.settings, "namespace", None) or "", getattr(r.settings, "pod", None) or "",
                             r.settings.node or "", r.settings.effective_workload), 1),),
           ("engine", "role", "url", "namespace", "pod", "node", "workload")),
    Family("llm_vitals_up", "gauge", "1 when the last poll got a usable reading from the target." + _CACHED,
           _flag(lambda r, now: r.verdict.up)),
    Family("llm_vitals_state", "gauge",
           "1 for the target's current state, 0 for the others. stuck/unresponsive are candidates for a restart;"
           " busy is load, never a reason to restart; asleep was put to sleep on purpose (vLLM sleep mode); paused"
           " stopped on purpose (vLLM's /pause, a weight update, a sleep with requests kept, SGLang's paused"
           " requests): never restarted." + _CACHED,
           lambda r, now: [((each,), 1 if r.verdict.state == each else 0) for each in STATES], ("state",)),
    Family("llm_vitals_paused_too_long", "gauge",
           "1 while the target has been paused on purpose for longer than its pause_budget (LLMServerPausedTooLong"
           " pages a human: resume it, or find the trainer that paused it). Never a reason to restart." + _CACHED,
           _flag(lambda r, now: pause_exceeded(r.verdict, r.settings, now))),
    Family("llm_vitals_requests_running", "gauge", "Requests the engine is running, as last read." + _CACHED,
           _fresh("running")),
    Family("llm_vitals_requests_waiting", "gauge", "Requests queued in the engine, as last read." + _CACHED,
           _fresh("waiting")),
    Family("llm_vitals_engine_steps_per_second", "gauge",
           "Engine steps per second between the last two reads of one process lifetime.",
           _value(lambda r, now: r.verdict.steps_per_second or 0.0)),
    Family("llm_vitals_generation_tokens_per_second", "gauge",
           "Generated tokens per second between the last two reads of one process lifetime.",
           _value(lambda r, now: r.verdict.generation_tokens_per_second or 0.0)),
    Family("llm_vitals_stuck_seconds", "gauge",
           "Seconds work has been pending with no engine signal moving; 0 when idle or progressing.",
           _value(lambda r, now: r.verdict.stuck_for(now))),
    Family("llm_vitals_restarts_total", "counter",
           "Server restarts detected since the exporter started (start time changed, or counters reset).",
           _value(lambda r, now: r.verdict.restarts)),
    Family("llm_vitals_process_start_time_seconds", "gauge", "The server's process_start_time_seconds, as last read.",
           _value(lambda r, now: r.verdict.process_start_time)),
    Family("llm_vitals_canary_requests_total", "counter",
           "Idle canaries sent (max_tokens 1), by result. Only ever sent when nothing was running or waiting.",
           lambda r, now: [((result,), r.canaries.get(result, 0)) for result in CANARY_RESULTS], ("result",)),
    Family("llm_vitals_canary_last_success_timestamp_seconds", "gauge", "Unix time of the last canary that got an answer.",
           _value(lambda r, now: r.shown(r.verdict.last_canary_ok))),
    Family("llm_vitals_ready", "gauge", "What /probe/<target>/ready answers (1 = 200). Never depends on load.",
           _flag(lambda r, now: r.ready)),
    Family("llm_vitals_live", "gauge",
           "What /probe/<target>/live answers (1 = 200): 0 only when stuck past the liveness budget (and, with the"
           " backstop: section, not held by the remediator).",
           _flag(lambda r, now: r.live)),
    Family("llm_vitals_backstop_state", "gauge",
           "The kubelet's liveness backstop (only with the exporter's backstop: section), 1 for its mode now. hold: the"
           " remediator holds the target's workload (paused, paged, circuit open, a restart running or in cooldown,"
           " the fleet gate), so /probe/<target>/live answers 200 however long it is stuck; act: liveness fails once"
           " stuck past the budget; armed: the remediator was not heard for backstop.after, the backstop acts alone.",
           lambda r, now: [((mode,), 1 if r.backstop.mode == mode else 0) for mode in MODES] if r.backstop else (),
           ("state",)),
    Family("llm_vitals_backstop_hold_reason", "gauge",
           "1, with the reason, while the backstop holds: the remediator's (paused, escalated_to_human, circuit_open,"
           " restart_in_progress, cooldown, backoff, fleet_gate, gpu_fault, state_lost), or word_unreadable (the"
           " remediator answers and its word cannot be read: a wrong token, a lost state). No sample otherwise.",
           lambda r, now: (((r.backstop.reason,), 1),) if r.backstop and r.backstop.mode == "hold" else (), ("reason",)),
    Family("llm_vitals_backstop_held_back", "gauge",
           "1 while the remediator's hold is all that keeps /probe/<target>/live at 200: the server is stuck past its"
           " liveness budget, and the kubelet would restart it but for the hold. Long at 1: a human must decide.",
           lambda r, now: (((), 1 if r.held_back else 0),) if r.backstop else ()),
    Family("llm_vitals_backstop_word_timestamp_seconds", "gauge",
           "Unix time the remediator's word for the target's workload was last read; time() minus it is the word's age.",
           _value(lambda r, now: r.shown(r.heard.heard_at) if r.backstop and r.heard else None)),
    Family("llm_vitals_backstop_answer_timestamp_seconds", "gauge",
           "Unix time the remediator last answered the backstop's ask at all (readable or not): older than"
           " backstop.after, the backstop is armed.",
           _value(lambda r, now: r.shown(r.heard.answered_at) if r.backstop and r.heard else None)),
    Family("llm_vitals_unresponsive_restart_allowed", "gauge",
           "1 when failed canaries may restart the target (LLMServerUnresponsive, remediation=restart): every engine"
           " whose load the exporter reads, so its canary only went to a server seen idle. 0 for engine openai"
           " (load unknown) unless the target sets restart_risking_busy_server: its canary failures page a human"
           " (LLMServerUnresponsiveLoadUnknown, remediation=none).",
           _flag(lambda r, now: r.settings.restart_on_unresponsive)),
    Family("llm_vitals_draining", "gauge", "1 after POST /probe/<target>/drain, until undrain.",
           _flag(lambda r, now: r.draining)),
    Family("llm_vitals_gpu_fault", "gauge", "1 when a GPU fault is flagged for the target; a restart will not help.",
           _flag(lambda r, now: r.gpu_fault)),
    Family("llm_vitals_gpu_fault_events_lossy", "gauge",
           "1 when a GPU-fault source read for the target can lose fault events: a dcgm-exporter page without"
           " DCGM_EXP_XID_ERRORS_TOTAL keeps only the last Xid, so a fatal Xid followed by another within one"
           " read is never seen (gpu_fault_errors.dcgm says which GPU; docs/gpu-faults.md has the config line).",
           _flag(lambda r, now: r.gpu_fault_lossy)),
    Family("llm_vitals_pace_ratio", "gauge",
           "The target's seconds of decode per token over the median of its workload's peers' (other replicas, or"
           " sibling data-parallel units) in the last pace.window: 1 keeps pace, 3 is three times slower. No sample"
           " when it is not judged (alone, idle, too little work, no pace counters): see the API's pace.basis.",
           _value(lambda r, now: r.pace.ratio)),
    Family("llm_vitals_degraded", "gauge",
           "1 when the target's pace ratio has stayed at or above pace.ratio for pace.degraded_after: it serves, at a"
           " fraction of its peers' pace (a throttled GPU, a slow link, a starved node). Not a state: a restart"
           " does not fix it; look at its node (docs/runbook.md, LLMServerDegraded).",
           _flag(lambda r, now: r.pace.degraded)),
    Family("llm_vitals_last_poll_timestamp_seconds", "gauge",
           "Unix time of the target's last completed poll: alert when it stops moving.",
           _value(lambda r, now: r.shown(r.verdict.last_poll))),
    Family("llm_vitals_poll_duration_seconds", "gauge", "How long the target's last poll took.",
           _value(lambda r, now: r.poll_duration)),
    Family("llm_vitals_poll_errors_total", "counter",
           "Polls that got no usable reading, by reason (connect, timeout, http_status, bad_metrics, too_large, ...);"
           " exporter_late: a read that timed out while the exporter's own event loop lagged, evidence of nothing.",
           lambda r, now: [((reason,), r.poll_errors.get(reason, 0))
                           for reason in sorted(set(STANDARD_ERROR_REASONS) | set(r.poll_errors))], ("reason",)),
)
TARGETS_NAME = "llm_vitals_exporter_targets"
TARGETS_HELP = "Targets in the exporter's config."


def escape_label(value: str) -> str:
    """A label value with the text format's escapes (target names and URLs rarely need any)."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def help_line(name: str, kind: str, help_text: str) -> str:
    """A family's HELP and TYPE lines."""
    escaped = help_text.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {escaped}\n# TYPE {name} {kind}\n"


# Most samples are 0 or 1 (states, flags, zero counters): their text is looked up, not formatted.
_COMMON_VALUES: dict[float, str] = {0: "0.0", 1: "1.0"}


def format_value(value: float) -> str:
    """A sample value as prometheus-client writes it."""
    return _COMMON_VALUES.get(value) or floatToGoString(value)


# Cached across scrapes: the label values are few and fixed (states, reasons, results), except
# target_info's URLs, one per configured target; building them anew took a third of a scrape.
@functools.lru_cache(maxsize=16384)
def labels_around_target(names: tuple[str, ...], more: tuple[str, ...]) -> tuple[str, str]:
    """The label text before and after `target="..."` for these values of the other labels.

    Labels are written sorted by name, as prometheus-client does, so `target` goes where it sorts.
    """
    pairs = sorted(zip(names[1:], more, strict=True))
    before = "".join(f'{k}="{escape_label(v)}",' for k, v in pairs if k < "target")
    after = "".join(f',{k}="{escape_label(v)}"' for k, v in pairs if k > "target")
    return before, after


def target_texts(reading: Reading, now: float) -> tuple[bytes, ...]:
    """One target's sample lines for each family of FAMILIES, in order (b"" for a family with no sample), e.g.::

        llm_vitals_target_info{engine="vllm",namespace="",node="",pod="",role="backend",target="gpu-a",url="http://10.0.0.5:8000",
                               workload="gpu-a"} 1.0 (one line)
        llm_vitals_up{target="gpu-a"} 1.0
        llm_vitals_state{state="busy",target="gpu-a"} 1.0
        llm_vitals_state{state="stuck",target="gpu-a"} 0.0
        llm_vitals_requests_running{target="gpu-a"} 2.0
        llm_vitals_engine_steps_per_second{target="gpu-a"} 31.5
        llm_vitals_stuck_seconds{target="gpu-a"} 0.0
        llm_vitals_restarts_total{target="gpu-a"} 1.0
        llm_vitals_canary_requests_total{result="ok",target="gpu-a"} 12.0
        llm_vitals_poll_errors_total{reason="timeout",target="gpu-a"} 0.0
    """
    target = f'target="{escape_label(reading.name)}"'
    texts = []
    for family in FAMILIES:
        name = family.name
        if not family.more_labels:
            lines = [f"{name}{{{target}}} {format_value(value)}\n" for _, value in family.rows(reading, now)]
        else:
            lines = []
            for more, value in family.rows(reading, now):
                before, after = labels_around_target(family.labels, more)
                lines.append(f"{name}{{{before}{target}{after}}} {format_value(value)}\n")
        texts.append("".join(lines).encode())
    return tuple(texts)


# Each family's HELP and TYPE lines, the same for every page.
FAMILY_HEADS = tuple(help_line(family.name, family.kind, family.help).encode() for family in FAMILIES)


def targets_text(count: int) -> bytes:
    """The page's last family: how many targets it holds."""
    return (help_line(TARGETS_NAME, "gauge", TARGETS_HELP) + f"{TARGETS_NAME} {format_value(count)}\n").encode()


def build_process_registry() -> CollectorRegistry:
    """A registry of our own (never the global REGISTRY) for this process's CPU and memory."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    return registry


class LifecycleCollector(Collector):
    """The exporter's own config and discovery health, from the Discovery and ReloadState it is given.

        llm_vitals_config_last_reload_successful 1
        llm_vitals_config_last_reload_success_timestamp_seconds 1.7e+09
        llm_vitals_discovery_up{source="kubernetes[0]"} 1
        llm_vitals_discovered_targets{source="kubernetes[0]"} 8
        llm_vitals_discovery_skipped_targets{source="kubernetes[0]",reason="not_running"} 2
    """

    def __init__(self, discovery: Discovery, reload: ReloadState) -> None:
        self.discovery = discovery
        self.reload = reload

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("llm_vitals_config_last_reload_successful",
                                "1 when the last config reload (SIGHUP or POST /-/reload) loaded the file; 0 when it was "
                                "refused and the previous config still runs (the error is in the log and /api/v1/discovery).",
                                value=1 if self.reload.successful else 0)
        yield GaugeMetricFamily("llm_vitals_config_last_reload_success_timestamp_seconds",
                                "Unix seconds when a config was last loaded (at start, or by a successful reload).",
                                value=self.reload.last_success)
        up = GaugeMetricFamily("llm_vitals_discovery_up",
                               "1 when the discovery source's last list, watch or file read worked; 0 while it fails "
                               "(its last targets are kept; the error is in /api/v1/discovery).", labels=["source"])
        found = GaugeMetricFamily("llm_vitals_discovered_targets",
                                  "Targets the discovery source gives now, before the shard.", labels=["source"])
        skipped = GaugeMetricFamily("llm_vitals_discovery_skipped_targets",
                                    "Things the source saw and could not watch, by reason (not_running, no_ip, no_port, "
                                    "terminating, owner_pending, bad_target, bad_group); each is named in /api/v1/discovery.",
                                    labels=["source", "reason"])
        for status in list(self.discovery.status.values()):
            up.add_metric([status.source], 1 if status.up else 0)
            found.add_metric([status.source], status.targets)
            reasons = Counter(why.partition(":")[0] for why in status.skipped.values())
            for reason, count in sorted(reasons.items()):
                skipped.add_metric([status.source, reason], count)
        yield from (up, found, skipped)


class LoopLagCollector(Collector):
    """The exporter's own event-loop lag (llm_vitals/exporter/loop_lag.py)::

        llm_vitals_exporter_loop_lag_seconds 0.004
    """

    WINDOW = 10.0

    def __init__(self, lag: LoopLag) -> None:
        self.lag = lag

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "llm_vitals_exporter_loop_lag_seconds",
            f"How late the exporter's event loop ran a timer, at worst over the last {self.WINDOW:g} s. A read that"
            " timed out while this was a tenth of its timeout or more is exporter_late (poll_errors_total), evidence"
            " of nothing: give the exporter CPU, or split the targets (shard).",
            value=self.lag.recent(self.WINDOW))
