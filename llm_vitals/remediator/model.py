"""The remediator's data: what the gate reads (an alert, the exporter's view of the fleet), the state
it keeps (`GateState`) and a restart's claim on it (`Intent`). Plain frozen data, no logic beyond
naming and reading a status's group once (`group_of`): what the gate decides (`Decision` in gate.py,
its `Plan` in plan.py, the `Reason` in reasons.py) is the gate's; how the state changes is state.py's,
how it is stored state_codec.py's and store/'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llm_vitals.kube.owners import LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL


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
class Group:
    """A LeaderWorkerSet group: restarted as one, every pod of it by UID (RecreateGroupOnRestart)."""

    namespace: str
    name: str
    index: str

    @property
    def selector(self) -> str:
        """The label selector of the group's pods (leader and workers)."""
        return f"{LWS_NAME_LABEL}={self.name},{LWS_GROUP_INDEX_LABEL}={self.index}"


@dataclass(frozen=True)
class TargetStatus:
    """One target as the exporter's `/api/v1/targets` sees it now."""

    # One of llm_vitals.targets.STATES, or (with `unknown_verdict`) a word a newer exporter sent.
    state: str
    process_start_time: float | None = None
    last_restart_time: float | None = None
    gpu_fault: bool = False
    gpu_fault_detail: str | None = None  # the fault's reason first (`Xid79: ...`), for a human
    # Unhealthy now or within the exporter's last two polls: a straggler of a fleet-wide fault
    # that is clearing still counts against the fleet gate. False from an exporter without it.
    recently_unhealthy: bool = False
    engine: str | None = None
    # For a target discovered in Kubernetes: where its own pod is, as the exporter saw it.
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None
    node: str | None = None
    # What the operator owns (docs/remediator.md); None from an exporter older than the field: the target's name.
    workload: str | None = None
    # Why this target's verdict is not one this remediator knows (a state or reason of a newer
    # exporter); None for a known verdict. Such a target is never restarted.
    unknown_verdict: str | None = None
    # The target's address (the exporter's `url`): the pod's IP must be its host (identity.py).
    url: str | None = None
    # Its pace is limping beside its workload's peers (the exporter's pace.degraded): evidence
    # against its node, never a reason to restart it.
    degraded: bool = False
    # The exporter's whole TARGET object, kept as evidence in the journal; never decided on.
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # The exporter (its URL, without userinfo) that reported this object: journaled beside the evidence.
    source: str | None = field(default=None, compare=False)
    # The LeaderWorkerSet group its workload names (`group_of`), read once from the status as it is
    # made: the fleet gate counts a group as one server, and the plan restarts it as one.
    group: Group | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "group", group_of(self))


def group_of(status: TargetStatus) -> Group | None:
    """The LeaderWorkerSet group a pod target belongs to (its workload `LeaderWorkerSet/<ns>/<name>/<index>`,
    in the pod's own namespace), or None."""
    if not status.workload or not status.pod or not status.namespace:
        return None
    parts = status.workload.split("/")
    if len(parts) != 4 or parts[0] != "LeaderWorkerSet" or parts[1] != status.namespace or not parts[2] or not parts[3]:
        return None
    return Group(parts[1], parts[2], parts[3])


def workload_of(target: str, status: TargetStatus | None) -> str:
    """What the target's budget, circuit and ladder count: its workload, else (older exporter) its name."""
    return status.workload if status is not None and status.workload else target


@dataclass(frozen=True)
class FleetView:
    targets: Mapping[str, TargetStatus]
    # Targets that more than one exporter reported (overlapping shards): never acted on, so they
    # are not in `targets`, but the fleet gate still counts them, at their least healthy copy.
    withheld: Mapping[str, TargetStatus] = field(default_factory=dict)
    # storm.managed_targets' answer for this view, by the policy asked with (the remediator's look decides
    # every held target over one view: once, not once a decision). A view is never changed once made.
    managed: dict[int, tuple[object, tuple[str, ...]]] = field(
        default_factory=dict, init=False, compare=False, repr=False)


@dataclass(frozen=True)
class GateState:
    """The gate's state, as its store holds it (`store/`); a snapshot, not a live view.

    Every change to it is a pure transition of `state.py`, committed with its journal row by
    `ledger.py`; its stored form (JSON, the same on the Lease and in SQLite) is `state_codec.py`'s.
    Budgets, circuits and the ladder are keyed by workload (`workload_of`); a state written before
    workloads existed is keyed by target names, which are the workloads of static targets.
    """

    # (fingerprint, startsAt) of alerts already decided to restart (or would-restart in dry-run).
    decided_keys: frozenset[tuple[str, float]] = frozenset()
    in_progress: str | None = None  # target of the restart running right now
    last_restart_started: float | None = None  # any target, any result
    # Start times of restarts per workload since its circuit was last reset (any result).
    restart_times: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    open_circuits: frozenset[str] = frozenset()  # workloads
    # A restart intent whose replica died ends at this time (its executor's timeout); None = no expiry.
    in_progress_expires: float | None = None
    in_progress_by: str | None = None  # the replica (and its intent) that holds the restart
    # When each decided key was decided (shared mode: to forget old keys); may be empty.
    decided_at: Mapping[tuple[str, float], float] = field(default_factory=dict)
    paused_until: float | None = None
    pause_reason: str = ""
    # Last time the fleet gate saw a storm (too many unhealthy at once); the storm cooldown counts from it.
    storm_seen_at: float | None = None
    # Nodes llm-vitals has cordoned (a GPU fault, the ladder, a degraded replica's move): each is cordoned
    # once, until a human releases it (stored as `gpu_nodes`, its name before the ladder cordoned too).
    cordoned_nodes: frozenset[str] = frozenset()
    # The escalation ladder: each workload's last step and when it was taken.
    ladder: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    # Restarts a PodDisruptionBudget refused, per workload: (first, last) refusal of the streak, until
    # a restart of the workload runs (LLMVitalsRemediatorDisruptionBudget reads how long it lasts).
    disrupted: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # The node each workload's last ladder step acted on (its pod's node then): the ladder cordons a
    # node only when the hang comes back on it. A step recorded without one never cordons.
    ladder_nodes: Mapping[str, str] = field(default_factory=dict)
    # Workloads paged (escalated_to_human), and when: held until a human releases them
    # (POST /api/v1/workloads/release); never pruned.
    pages: Mapping[str, float] = field(default_factory=dict)
    # Each workload's restart streak for the backoff: (restarts in the streak, when the last started).
    # A streak ends after `backoff_reset` without a restart.
    backoff: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    # Alerts of a stuck workload refused for its backoff: (first, latest) refusal of the streak, until
    # a restart of it is committed. A backoff can hold a stuck server for hours, longer than any other
    # wait of the gate: LLMVitalsRemediatorBackoffHolding tells a human while it lasts.
    backoff_refused: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # The alert whose restart the claim above holds: when the claim ends unfinished (it expired, or its
    # replica stopped), that alert is judged afresh instead of being a `duplicate` (state.claim_lapsed).
    in_progress_key: tuple[str, float] | None = None
    # Stuck targets the gate refused for a hold (`gate.HOLDING`), by target: every replica's backstop word holds
    # their workloads, and the remediator re-decides them itself when the hold ends (redecide.py), not
    # at Alertmanager's next re-send. An entry ends when the target is decided otherwise.
    held: Mapping[str, HeldAlert] = field(default_factory=dict)
    # Restarts of a workload no remediator made (the kubelet's liveness, the server's own exit), as the
    # exporter saw them (redecide.py): they count in its budget, circuit and backoff as its own do.
    outside_restarts: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    # The last restart the exporter showed for each target (its `last_restart_time`): a restart is counted once.
    seen_restarts: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class HeldAlert:
    """A stuck target's alert the gate refused for a hold: what the remediator re-decides when the hold ends."""

    workload: str
    reason: str  # the last refusal's (one of `gate.HOLDING`)
    since: float  # the first refusal of this hang
    at: float  # the last refusal written
    fingerprint: str
    starts_at: float
    alertname: str = ""

    def facts(self, target: str) -> AlertFacts:
        """The alert as Alertmanager sent it (the labels the gate reads), to decide again."""
        labels = {"alertname": self.alertname, "target": target, "remediation": "restart"}
        return AlertFacts("firing", labels, self.fingerprint, self.starts_at)


@dataclass(frozen=True)
class Claim:
    """The terms of a restart's claim, settled before the decision: its holder, and how long it outlives
    its plan's timeouts (None: it holds until the restart ends; a store whose claims never expire)."""

    holder: str  # "<replica>/<action token>"
    margin: float | None


@dataclass(frozen=True)
class Intent:
    """A restart one replica committed to run: who, and until when its claim holds (None: until it ends).

    It also keeps what its commit replaced, so that a restart the API server refused outright (an
    eviction a PodDisruptionBudget forbids: nothing happened) can be taken back (`undone`)."""

    holder: str  # "<replica>/<action token>"
    target: str
    expires: float | None
    workload: str = ""
    started: float | None = None  # the decision's time: its entry in the budget, the cooldown's start
    before: Undo | None = None


@dataclass(frozen=True)
class Undo:
    """What a restart's commit replaced: restored when the restart is taken back."""

    last_restart_started: float | None
    circuit_was_open: bool
    ladder: tuple[str, float] | None
    ladder_node: str | None = None
    backoff: tuple[int, float] | None = None
