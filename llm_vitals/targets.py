"""The exporter's TARGET JSON (`GET /api/v1/targets`): one model, written by the exporter, read by the remediator and the status page.

The states and the reasons a verdict can carry are listed here once, as Literals, so the writer is
type-checked against the same words the readers validate.

To add a field: give it a default (None, False, {} ...) so that an exporter without it still
validates, document it with `Field(description=...)`, and regenerate the schema:
`python -m llm_vitals.targets > docs/target-view.schema.json` (tests/test_target_view.py fails
until the file matches).
"""

from __future__ import annotations

import json
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

State = Literal["starting", "idle", "busy", "stuck", "unresponsive", "down", "asleep", "waiting_on_peer", "paused"]
STATES: tuple[State, ...] = get_args(State)
# The states the remediator's fleet gate counts as unhealthy.
UNHEALTHY_STATES: frozenset[State] = frozenset({"stuck", "unresponsive", "down"})
# The states the remediator may restart from (`down` only for a user-labelled down alert).
RESTARTABLE_STATES: frozenset[State] = frozenset({"stuck", "unresponsive"})
# `asleep` (put to sleep on purpose, vLLM's sleep mode): not ready, yet live, never unhealthy nor restartable.
NOT_READY_STATES: frozenset[State] = frozenset({"starting", "down", "stuck", "unresponsive", "asleep"})
# `waiting_on_peer` (work the engine itself deferred, e.g. a remote KV transfer, with nothing moving):
# the fault is the peer's, so it is neither unhealthy nor restartable, and it stays ready and live.
# `paused` (the engine stopped on purpose: vLLM's /pause, a weight update or a sleep with its requests
# kept, SGLang's paused requests): never unhealthy nor restartable, no canary, live; ready as the
# engine's own health route says (vLLM's /health answers 200 while paused), so it is not in
# NOT_READY_STATES; a paused engine whose page says it sleeps is not ready, as `asleep` is
# (exporter/verdict/probes.py `is_ready`). A pause longer than `pause_budget` pages (LLMServerPausedTooLong).

# A poll that gave no usable reading: the `reason` of a `down` verdict and the `poll_errors_total` label.
PollErrorReason = Literal[
    "connect", "timeout", "http_status", "bad_metrics", "too_large", "health_503", "bad_models",
    "wrong_engine",  # the page is another engine's than the target declares
    "no_model",  # no model to send a canary to (a canary failure's word; never a poll's)
    "exporter_late",  # the read timed out while the exporter's own event loop lagged: evidence of nothing
    "refused",  # the connection was refused: no process listens (`connect` is one that never connected in time)
]
# Every other reason a verdict gives.
JudgedReason = Literal[
    "startup",  # not servable yet, within startup_grace
    "idle",
    "progress",  # work pending and engine signals moving
    "waiting_for_progress",  # work pending, nothing moved yet, not stuck yet
    "no_progress",  # stuck
    "metrics_unanswered",  # /metrics accepted the connection but never answered: work pending on an engine whose
    # loop answers it (llama.cpp, Triton), or frozen whole (a second probe unanswered too) for down_after
    "restart",  # the read that detected a restart
    "canary_failed",
    "canary_rejected",  # idle; the canary was answered 4xx or 501 (model, key, endpoint, route): never restartable
    "unjudgeable",  # idle-looking, but the target's model answers in streams no signal of the page follows (a Triton
    # decoupled model): its canary failures are shown and never `unresponsive`; `unit` names the model
    "canary_ok",  # back from unresponsive
    "models_ok",  # `engine: openai`, judged by /v1/models
    "proxy_models_ok",
    "asleep",  # the engine says it sleeps (vLLM's sleep mode); the detail names the level
    "waiting_on_peer",  # only work the engine deferred (a KV transfer) is pending, and nothing moves
    "paused",  # the engine says it paused on purpose (vLLM's GET /is_paused, SGLang's num_paused_reqs)
    "sleep_kept",  # vLLM asleep with its requests kept (/sleep?mode=keep): paused, not stuck
    "operation_in_flight",  # a weight update or a sleep/wake-up in flight (vLLM's *_operations_in_flight), within pause_budget
    "operation_stuck",  # stuck: a weight update or wake-up still in flight after pause_budget (wedged inside it)
]
Reason = Literal[PollErrorReason, JudgedReason]
REASONS: tuple[Reason, ...] = get_args(Reason)


class _View(BaseModel):
    # Readers ignore fields they do not know, so an older remediator reads a newer exporter.
    model_config = ConfigDict(extra="ignore", frozen=True)


class CanaryView(_View):
    consecutive_failures: int = 0
    last_success: float | None = Field(None, description="unix seconds of the last canary that answered")
    in_flight: bool = False
    results: dict[str, int] = Field(default_factory=dict, description="canaries sent, by result: ok, error, timeout, rejected (4xx)")


class BackstopView(_View):
    """The kubelet's liveness backstop and the remediator's word (exporter/backstop_rule.py)."""

    mode: Literal["act", "hold", "armed"] = Field(description=(
        "hold: the remediator holds the workload, liveness answers 200; act: liveness fails once stuck for the "
        "liveness budget; armed: the remediator was not heard for backstop.after, the backstop acts alone"))
    reason: str = Field("", description="why it holds (the remediator's reason, or word_unreadable), or remediator_silent")
    detail: str = ""
    word_since: float | None = Field(None, description="unix seconds (the remediator's clock) the hold began, where known")
    word_age_seconds: float | None = Field(None, description="seconds since the last readable word; null: none yet")
    answered_age_seconds: float | None = Field(None, description="seconds since the remediator last answered at all")


class PaceView(_View):
    """The target's pace beside its workload's peers (llm_vitals/exporter/pace.py): never a state, never a restart."""

    ratio: float | None = Field(None, description=(
        "its seconds of decode per token over the median of its peers' (the slowest unit's, on a data-parallel "
        "server); null when not judged"))
    peers: int = Field(0, description="peers with enough work in the window (other replicas of its workload, sibling units)")
    degraded: bool = Field(False, description="the ratio at or above pace.ratio for pace.degraded_after")
    since: float | None = Field(None, description="unix seconds when it became degraded; null while not")
    basis: Literal["judged", "no_signal", "too_little_work", "alone", "too_few_peers"] = Field(
        "no_signal", description=(
            "judged, or why not: no_signal (the engine gives no pace counters, or no read yet), too_little_work (idle, "
            "or less than pace.min_work in the window), alone (no peer with enough work), too_few_peers (fewer than "
            "pace.min_peers)"))
    detail: str = ""


class TargetView(_View):
    """One target as the exporter sees it now (docs/interfaces.md, "Exporter API")."""

    name: str
    engine: str
    role: str
    url: str = Field(description="the target's URL without credentials")
    state: State
    reason: Reason = Field(description="a machine word; for `down`, the poll_errors_total reason of the failed poll")
    detail: str = Field(description="human text, never a secret")
    since: float | None = Field(description="unix seconds when the current state began")
    stuck_seconds: float = Field(0.0, description="seconds since the last progress while work is pending")
    process_start_time: float | None = Field(None, description="as read from the page; null when absent")
    last_poll: float | None = Field(None, description="unix seconds of the last completed poll; null before the first")
    up: bool = Field(False, description="the last poll gave a usable reading")
    ready: bool = False
    live: bool = True
    started: bool = Field(False, description="ever servable: what /probe/{name}/startup answers")
    draining: bool = False
    gpu_fault: bool = Field(False, description="a GPU fault is flagged (gpu_fault_file, the node's conditions or taints, "
                                               "dcgm-exporter, or NVML): a restart will not help")
    gpu_fault_detail: str | None = Field(None, description="the fault's reason, then a colon and what said so "
                                                          "(the gpu_fault_file's first line, or the node condition's reason and message)")
    gpu_fault_source: str | None = Field(None, description="which source flagged it: file, node, dcgm or nvml")
    gpu_fault_errors: dict[str, str] = Field(default_factory=dict, description=(
        "a GPU-fault source that could not be read (file, node, dcgm, nvml) and why; never a fault by itself, "
        "and an unreadable source keeps the fault it last flagged"))
    workload: str | None = Field(None, description=(
        "what the operator owns and a restart does not replace: Deployment/<ns>/<name>, StatefulSet/<ns>/<name>, "
        "DaemonSet/<ns>/<name>, LeaderWorkerSet/<ns>/<name>/<group-index>, a name given by a template or a file_sd "
        "label, or the target's own name; budgets, circuits and the restart-loop alert key on it. "
        "Null only from an exporter older than the field: readers then use the target's name"))
    # A target discovered in Kubernetes: its own pod as the exporter saw it (null otherwise).
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None
    node: str | None = None
    restarts: int = Field(0, description="restarts detected since the exporter started")
    last_restart_at: float | None = Field(None, description="unix seconds of the last detected restart")
    last_unhealthy_at: float | None = Field(None, description="unix seconds of the last verdict in stuck, unresponsive or down")
    paused_too_long: bool = Field(False, description=(
        "paused for longer than the target's pause_budget: LLMServerPausedTooLong pages a human; never a restart"))
    recently_unhealthy: bool = Field(
        False, description="unhealthy now or within the last two poll intervals: what the remediator's fleet gate counts")
    running: float | None = Field(None, description="as read by the last poll; null without a fresh reading")
    waiting: float | None = None
    deferred: float | None = Field(None, description=(
        "requests the engine itself deferred, waiting on a peer (vLLM's waiting_by_reason deferred, SGLang's "
        "disaggregation transfer queues), as last read; null without a fresh reading"))
    unit: str | None = Field(None, description=(
        "the unit a stuck or waiting_on_peer verdict rests on, as its labels read (engine=\"1\", "
        "model=\"m\",version=\"1\", dp_rank=\"0\"); null when the whole server is judged"))
    steps_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    counters: dict[str, float | None] = Field(
        default_factory=dict, description="the last reading of the current process lifetime, or {} before any")
    canary: CanaryView = Field(default_factory=CanaryView)
    pace: PaceView = Field(default_factory=PaceView, description="its pace beside its workload's peers: `degraded`")
    poll_errors: dict[str, int] = Field(default_factory=dict, description="failed polls by reason")
    poll_duration_seconds: float | None = None
    polls: int = 0
    backstop: BackstopView | None = Field(None, description="null when the exporter does not ask the remediator (no backstop: section)")


class TargetsAnswer(_View):
    """The whole answer of `GET /api/v1/targets`."""

    targets: list[TargetView]
    generated_at: float | None = None


def json_schema() -> str:
    """The JSON Schema of `GET /api/v1/targets`, as kept in docs/target-view.schema.json."""
    return json.dumps(TargetsAnswer.model_json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(json_schema(), end="")
