"""The gate: one pure function deciding whether an alert may restart its target, and how.

It takes plain data (the alert, the exporter's view of the fleet, the gate's stored state, the policy
and the time) and returns `Decision(allowed, reason, detail, plan)`. No I/O, no clock of its own: the
tests drive it with tables. The checks run in the order docs/remediator.md describes, and the first refusal wins.
An allowed decision carries its `Plan`: what to act on (the static target, the pod by UID, the
LeaderWorkerSet group, the node to cordon with its taint) and how long it may take. The plan is
worked out here once; acting.py only carries it out.

What a budget, a circuit and the escalation ladder count is the target's **workload** (docs/remediator.md:
`Deployment/<ns>/<name>`, a StatefulSet, a DaemonSet, a LeaderWorkerSet group, a name a template
or file_sd label gives, or a static target's own name): what the operator owns and a restart does
not replace. A pod the remediator evicts comes back under a new name; its Deployment does not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import cached_property
from itertools import chain
from typing import Any, Literal, NamedTuple, get_args

from llm_vitals.remediator import fleet_limit
from llm_vitals.targets import RESTARTABLE_STATES, UNHEALTHY_STATES

# The `reason` of every decision: the `..._decisions_total{reason}` label and the journal's word.
Reason = Literal[
    "not_firing",
    "no_restart_label",
    "unknown_target",
    "duplicate",
    "paused",
    "state_unreachable",
    # The shared state is gone or unreadable (a Lease deleted, an annotation not ours): nothing is
    # restarted until a human re-initialises it (POST /api/v1/state/reinit).
    "state_lost",
    "exporter_unreachable",
    # The pod the exporter names is not the target's at the API server (identity.py), or its owner
    # cannot be read now, or the API server could not be asked.
    "identity_mismatch",
    "owner_pending",
    "identity_unverified",
    "unknown_verdict",
    "not_stuck",
    "restarted_since_alert",
    "no_pod_uid",
    "gpu_fault",
    "escalated_to_human",
    "restart_in_progress",
    "cooldown",
    "storm_cooldown",
    "circuit_open",
    "fleet_gate",
    "dry_run",
    "allowed",
    "cordon_and_move",
    # A cordon the ladder or a GPU fault calls for, refused: max_cordoned_nodes are cordoned and unreleased.
    "cordon_limit",
    # The workload was restarted lately, and its growing backoff has not passed (slow loops).
    "backoff",
    # Not the gate's: the API server refused an allowed eviction (a PodDisruptionBudget, 429).
    "disruption_budget",
    # Not the gate's: the API server throttled an allowed eviction (429 without a disruption budget).
    "api_throttled",
]
REASONS: tuple[Reason, ...] = get_args(Reason)
# Reasons that come after the gate allowed, from what acting met (acting.py), never from `decide`.
AFTER_GATE: frozenset[Reason] = frozenset({"disruption_budget", "api_throttled"})
# Reasons the loop gives from what its edges met before the gate could decide (loop.py: the state is
# lost, the pod the exporter names is not confirmed by the API server), never from `decide`.
AT_EDGE: frozenset[Reason] = frozenset({"state_lost", "identity_mismatch", "owner_pending", "identity_unverified"})
# Refusals a human must see on the pod itself (as a Kubernetes Event).
HUMAN_REFUSALS = frozenset({"gpu_fault", "circuit_open", "fleet_gate", "escalated_to_human", "disruption_budget",
                            "cordon_limit"})

# The escalation ladder, per workload (NodeHealthCheck's escalating remediations): a workload stuck
# again within `escalate_within` of its last step takes the next one. `page` is a refusal, and it
# holds (`JournalState.pages`) until a human releases the workload: Alertmanager's re-sends of the
# alert, or a new alert once `escalate_within` has passed, never start the ladder over.
# The ladder's cordon is evidence about a node: it is taken only when the hang came back on the node
# the restart left it on (`JournalState.ladder_nodes`) *and* another workload's pod was restarted or
# moved on that node within `escalate_within` too (`node_suspect`). A pinned pod (a StatefulSet's, a
# LeaderWorkerSet group's, any pod held by its model cache) comes back on its node by design, so its
# own bug hanging it again there says nothing about the node; two workloads hanging on one node do.
# A hang that comes back on another node, or on the same node alone, pages.
Step = Literal["restart", "cordon_and_move", "page"]
LADDER: tuple[Step, ...] = ("restart", "cordon_and_move", "page")

# A LeaderWorkerSet group's pods carry these labels (leaderworkerset.sigs.k8s.io/...).
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_LABEL = "leaderworkerset.sigs.k8s.io/group-index"


# A pod restart's timeout when neither a template nor a target names one.
DEFAULT_POD_TIMEOUT = 30.0
# The taint value of the ladder's cordon (a GPU fault's is the fault's reason: `taint_value`).
LADDER_TAINT = "LadderEscalation"
# The alert of a replica degraded beside its peers (alerts/llm-vitals.rules.yml): shipped with
# remediation="none"; relabelled "restart" by an operator, it is still never a restart, only a move
# off a node that other evidence points at (`node_suspect`), with gpu_fault_action: cordon_and_move.
DEGRADED_ALERT = "LLMServerDegraded"
DEGRADED_TAINT = "PaceDegraded"

Action = Literal["restart", "restart_pod", "restart_group", "cordon_and_move"]


@dataclass(frozen=True)
class Plan:
    """What an allowed decision does, decided once: the edge (acting.py) carries it out as it is.

    `restart`: the static target's own executor. `restart_pod`: the target's pod, by its UID.
    `restart_group`: every pod of its LeaderWorkerSet group, by UID. `cordon_and_move`: cordon and
    taint `node`, then move the pod by its UID."""

    target: str
    workload: str
    action: Action
    timeout: float  # the executor's
    claim_for: float  # how long the restart may hold the claim: pre_restart's timeout and the executor's
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None
    node: str | None = None
    group: Group | None = None
    taint: str | None = None  # cordon_and_move: the node's taint value
    cause: str | None = None  # cordon_and_move: why, for the node's annotation and Events
    template: int | None = None  # the target_templates entry taking the target; None for a static target


class Decision(NamedTuple):
    allowed: bool
    reason: Reason
    detail: str = ""
    plan: Plan | None = None  # set exactly when allowed


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


def workload_of(target: str, status: TargetStatus | None) -> str:
    """What the target's budget, circuit and ladder count: its workload, else (older exporter) its name."""
    return status.workload if status is not None and status.workload else target


@dataclass(frozen=True)
class Group:
    """A LeaderWorkerSet group: restarted as one, every pod of it by UID (RecreateGroupOnRestart)."""

    namespace: str
    name: str
    index: str

    @property
    def selector(self) -> str:
        """The label selector of the group's pods (leader and workers)."""
        return f"{LWS_NAME_LABEL}={self.name},{LWS_GROUP_LABEL}={self.index}"


def group_of(status: TargetStatus | None) -> Group | None:
    """The LeaderWorkerSet group a pod target belongs to (its workload `LeaderWorkerSet/<ns>/<name>/<index>`,
    in the pod's own namespace), or None."""
    if status is None or not status.workload or not status.pod or not status.namespace:
        return None
    parts = status.workload.split("/")
    if len(parts) != 4 or parts[0] != "LeaderWorkerSet" or parts[1] != status.namespace or not parts[2] or not parts[3]:
        return None
    return Group(parts[1], parts[2], parts[3])


@dataclass(frozen=True)
class FleetView:
    targets: Mapping[str, TargetStatus]
    # Targets that more than one exporter reported (overlapping shards): never acted on, so they
    # are not in `targets`, but the fleet gate still counts them, at their least healthy copy.
    withheld: Mapping[str, TargetStatus] = field(default_factory=dict)
    # managed_targets' answer for this view, by the policy asked with (the remediator's look decides
    # every held target over one view: once, not once a decision). A view is never changed once made.
    managed: dict[int, tuple[GatePolicy, tuple[str, ...]]] = field(
        default_factory=dict, init=False, compare=False, repr=False)


@dataclass(frozen=True)
class JournalState:
    """The gate's state, as its store holds it (`store.py`); a snapshot, not a live view.

    (The name is older than the stores: this state once was rebuilt from the journal's rows.)
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
    # Nodes llm-vitals has cordoned (a GPU fault, or the ladder): each is escalated once, until released.
    gpu_nodes: frozenset[str] = frozenset()
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
    # replica stopped), that alert is judged afresh instead of being a `duplicate` (shared.claim_lapsed).
    in_progress_key: tuple[str, float] | None = None
    # Stuck targets the gate refused for a hold (HOLDING), by target: every replica's backstop word holds
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
    reason: str  # the last refusal's (one of HOLDING)
    since: float  # the first refusal of this hang
    at: float  # the last refusal written
    fingerprint: str
    starts_at: float
    alertname: str = ""

    def facts(self, target: str) -> AlertFacts:
        """The alert as Alertmanager sent it (the labels the gate reads), to decide again."""
        labels = {"alertname": self.alertname, "target": target, "remediation": "restart"}
        return AlertFacts("firing", labels, self.fingerprint, self.starts_at)


# Refusals that leave a stuck target unhandled on purpose (the checks' reasons): the target is kept in
# `JournalState.held`, its workload's backstop holds, and the remediator re-decides it when the hold ends.
# The API server's refusals of an allowed restart (AFTER_GATE: a PodDisruptionBudget, throttling) hold it too.
HOLDING: frozenset[Reason] = frozenset({"paused", "escalated_to_human", "gpu_fault", "cordon_limit",
                                        "restart_in_progress", "cooldown", "circuit_open", "backoff", "fleet_gate",
                                        "storm_cooldown", "disruption_budget", "api_throttled"})
# Decisions that end a target's hold: it was acted on, or is no longer a hang the gate may act on.
UNHOLDING: frozenset[Reason] = frozenset({"allowed", "cordon_and_move", "dry_run", "duplicate", "not_firing",
                                          "not_stuck", "restarted_since_alert", "unknown_target", "no_restart_label",
                                          "no_pod_uid"})


@dataclass(frozen=True)
class TemplateMatch:
    """Which discovered targets a `target_templates:` entry takes; every field set must match."""

    engine: str | None = None
    namespace: str | None = None
    name: str | None = None  # a glob over the target's name
    timeout: float = DEFAULT_POD_TIMEOUT  # the pod restart's (the template's `timeout`)
    pre_restart_timeout: float = 0.0  # its pre_restart command's, when it has one

    def matches(self, name: str, status: TargetStatus) -> bool:
        return (
            (self.engine is None or status.engine == self.engine)
            and (self.namespace is None or status.namespace == self.namespace)
            and (self.name is None or fnmatchcase(name, self.name))
        )


@dataclass(frozen=True)
class GatePolicy:
    targets: frozenset[str]
    global_cooldown: float
    max_restarts: int
    budget_window: float
    max_unhealthy: int
    dry_run: bool = False
    down_alertnames: frozenset[str] = frozenset({"LLMServerDown"})
    # With templates, the fleet is the static targets plus the exporter's targets they match,
    # and a percentage `max_unhealthy` is taken of that count at decision time.
    templates: tuple[TemplateMatch, ...] = ()
    max_unhealthy_percent: float | None = None
    storm_cooldown: float = 0.0
    gpu_fault_action: str = "refuse"  # refuse | cordon_and_move
    # The ladder: the next step for a workload stuck again within this many seconds; None = off.
    escalate_within: float | None = None
    # Nodes llm-vitals may hold cordoned at once (unreleased), fleet-wide; a further cordon is refused
    # `cordon_limit`. 0: never cordon.
    max_cordoned_nodes: int = 1
    # The per-workload backoff: after the n-th restart of a streak, the next waits
    # min(backoff_initial * 2**(n-1), backoff_max); backoff_reset without a restart ends the streak.
    # backoff_initial 0: off.
    backoff_initial: float = 900.0
    backoff_max: float = 4 * 3600.0
    backoff_reset: float = 12 * 3600.0
    # Static targets' executor timeouts and their pre_restart timeouts (a target not named: 30 s, none).
    target_timeouts: Mapping[str, float] = field(default_factory=dict)
    pre_restart_timeouts: Mapping[str, float] = field(default_factory=dict)


def template_index(policy: GatePolicy, name: str, status: TargetStatus | None) -> int | None:
    """The first template taking a target the exporter reports, or None."""
    if status is None:
        return None
    return next((i for i, t in enumerate(policy.templates) if t.matches(name, status)), None)


def managed_targets(policy: GatePolicy, fleet: FleetView) -> list[str]:
    """The fleet the gate guards: static targets, and the exporter's targets a template takes
    (withheld ones included: the fleet gate counts the whole fleet)."""
    known = fleet.managed.get(id(policy))
    if known is not None and known[0] is policy:
        return list(known[1])
    reported = chain(fleet.targets.items(), fleet.withheld.items())
    extra = [n for n, s in reported if n not in policy.targets and template_index(policy, n, s) is not None]
    found = sorted(policy.targets) + sorted(extra)
    fleet.managed[id(policy)] = (policy, tuple(found))
    return found


def unhealthy_limit(policy: GatePolicy, fleet_size: int) -> int:
    """`max_unhealthy` as a count of this fleet (llm_vitals/remediator/fleet_limit.py)."""
    return fleet_limit.unhealthy_limit(policy.max_unhealthy, policy.max_unhealthy_percent, fleet_size)


def paused(journal: JournalState, now: float) -> bool:
    return journal.paused_until is not None and now < journal.paused_until


def in_progress(journal: JournalState, now: float) -> str | None:
    """The target of a restart running now; an intent past its expiry (a dead replica's) is over."""
    if journal.in_progress is None:
        return None
    if journal.in_progress_expires is not None and now >= journal.in_progress_expires:
        return None
    return journal.in_progress


def restarts_in_window(journal: JournalState, policy: GatePolicy, workload: str, now: float) -> int:
    """Restarts of `workload` within the budget window ending now (since its last circuit reset)."""
    since = now - policy.budget_window
    times = chain(journal.restart_times.get(workload, ()), journal.outside_restarts.get(workload, ()))
    return sum(1 for started in times if started > since)


def ladder_step(journal: JournalState, policy: GatePolicy, workload: str, now: float, node: str | None = None,
                fleet: FleetView | None = None) -> Step:
    """The ladder's next step for `workload`, whose stuck pod is on `node` now: within `escalate_within`
    of a restart, `cordon_and_move` when the hang came back on the node the restart left it on and that
    node is suspect on its own (`node_suspect`), else `page`; after a move, `page`. Outside
    `escalate_within` (or with the ladder off): `restart`. A held page is not the ladder's to end (`paged`)."""
    last = journal.ladder.get(workload)
    if policy.escalate_within is None or last is None or now - last[1] >= policy.escalate_within:
        return "restart"
    if last[0] == "restart":
        same_node = node is not None and journal.ladder_nodes.get(workload) == node
        return "cordon_and_move" if same_node and node_suspect(journal, policy, workload, node, now, fleet) else "page"
    if last[0] in ("cordon_and_move", "page"):
        return "page"
    return "restart"


def node_suspect(journal: JournalState, policy: GatePolicy, workload: str, node: str | None, now: float,
                 fleet: FleetView | None = None) -> str | None:
    """Another workload whose last ladder step (a restart or a move) acted on a pod on `node` within
    `escalate_within` of `now`, or (in `fleet`, as the exporter sees it now) whose replica on `node`
    is degraded beside its peers or has a GPU fault; None: the node has no evidence of its own. One
    workload hanging again on its node is not: its pod may be pinned there (a StatefulSet's, a
    LeaderWorkerSet group's), and then its own bug comes back on that node whatever the node is worth;
    one replica degraded alone may be its own fault too."""
    if node is None:
        return None
    for name, status in sorted((fleet.targets if fleet is not None else {}).items()):
        other = workload_of(name, status)
        if status.node == node and other != workload and (status.degraded or status.gpu_fault):
            return f"{other} ({'a GPU fault' if status.gpu_fault else 'degraded'} there)"
    if policy.escalate_within is None:
        return None
    for other, (step, at) in sorted(journal.ladder.items()):
        if (other != workload and step in ("restart", "cordon_and_move") and now - at < policy.escalate_within
                and journal.ladder_nodes.get(other) == node):
            return other
    return None


def paged(journal: JournalState, workload: str) -> bool:
    """The workload was paged and no human has released it (a `page` ladder step of an older state counts)."""
    return workload in journal.pages or (journal.ladder.get(workload) or ("",))[0] == "page"


def backoff_delay(policy: GatePolicy, restarts: int) -> float:
    """How long after the `restarts`-th restart of a streak the next may start (0 with the backoff off)."""
    if policy.backoff_initial <= 0 or restarts <= 0:
        return 0.0
    # Doubling past 2**32 is past any cap; the exponent is bounded so that the product stays a float.
    return min(policy.backoff_initial * 2.0 ** min(restarts - 1, 32), policy.backoff_max)


def backoff_streak(journal: JournalState, policy: GatePolicy, workload: str, now: float) -> int:
    """Restarts in the workload's current streak: 0 once `backoff_reset` has passed without one."""
    entry = journal.backoff.get(workload)
    if entry is None or now - entry[1] >= policy.backoff_reset:
        return 0
    return entry[0]


def backoff_left(journal: JournalState, policy: GatePolicy, workload: str, now: float) -> float:
    """Seconds until the workload's backoff lets its next restart start (0: now)."""
    streak = backoff_streak(journal, policy, workload, now)
    if streak == 0:
        return 0.0
    return max(0.0, journal.backoff[workload][1] + backoff_delay(policy, streak) - now)


def cordoned_count(journal: JournalState) -> int:
    """Nodes llm-vitals has cordoned and no human has released: what `max_cordoned_nodes` bounds."""
    return len(journal.gpu_nodes)


_UNKNOWN = Decision(False, "unknown_target", "target is not in the remediator's config")


def gpu_refusal(status: TargetStatus, policy: GatePolicy) -> str:
    """What a human reads of a refused GPU fault (the pod's Event): the fault, its node, what to do."""
    fault = f" ({status.gpu_fault_detail[:300]})" if status.gpu_fault_detail else ""
    where = f" on node {status.node}" if status.node else ""
    if policy.gpu_fault_action == "cordon_and_move":
        todo = "move the workload off it by hand (cordon_and_move needs the pod and node the exporter names)"
    else:
        todo = "move the workload off it, or set gpu_fault_action: cordon_and_move"
    return f"a GPU fault is flagged{fault}{where}; a restart would not help: {todo}"


# How long a storm the gate saw holds every workload's backstop after it (backstop.py), when the storm
# cooldown is shorter: the remediator re-decides the targets it refused in the storm itself
# (`JournalState.held`), and a stuck server whose alert has not reached it yet is held this long too.
STORM_HOLD = 600.0


@dataclass(frozen=True)
class Held:
    """Why a check holds: since when (None where the state does not say) and what a human reads."""

    since: float | None
    detail: str


@dataclass(frozen=True)
class Subject:
    """What the checks read: the state, the policy, the workload and the time, and for a decision the
    target's status and the fleet. The backstop's word has neither (`status` None): it asks about a
    workload, not an alert, and a check that needs the target's own reading holds nothing there."""

    journal: JournalState
    policy: GatePolicy
    workload: str
    now: float
    status: TargetStatus | None = None
    fleet: FleetView | None = None
    degraded: bool = False  # the alert is LLMServerDegraded: only ever a move, never a restart

    @cached_property
    def step(self) -> Step:
        """The step the target's hang takes: `cordon_and_move` for a GPU fault (or a degraded replica) that may be
        moved, else the ladder's."""
        status = self.status
        step: Step = "restart"
        if status is not None and (status.gpu_fault or self.degraded):
            step = "cordon_and_move"
        node = status.node if status is not None else None
        climbed: Step = "restart" if self.degraded else ladder_step(self.journal, self.policy, self.workload, self.now,
                                                                    node, self.fleet)
        return climbed if LADDER.index(climbed) > LADDER.index(step) else step


@dataclass(frozen=True)
class Check:
    """One reason not to restart (kured's blockers): `held` says since when and why, or None."""

    reason: Reason
    held: Callable[[Subject], Held | None]


def _paused(s: Subject) -> Held | None:
    if not paused(s.journal, s.now):
        return None
    reason = f": {s.journal.pause_reason}" if s.journal.pause_reason else ""
    return Held(None, f"the remediator is paused until {s.journal.paused_until:.0f}{reason}"[:500])


def _paged(s: Subject) -> Held | None:
    if not paged(s.journal, s.workload):
        return None
    return Held(s.journal.pages.get(s.workload) or (s.journal.ladder.get(s.workload) or ("", None))[1],
                f"{s.workload} was paged and not released yet: POST /api/v1/workloads/release once a human has looked")


def _gpu_fault(s: Subject) -> Held | None:
    status = s.status
    if status is None or not status.gpu_fault:
        return None
    if s.policy.gpu_fault_action != "cordon_and_move" or status.node is None or status.pod is None:
        return Held(None, gpu_refusal(status, s.policy))
    if status.node in s.journal.gpu_nodes:
        return Held(None, f"a GPU fault is flagged; node {status.node} was already cordoned")
    return None


def _degraded(s: Subject) -> Held | None:
    """Degraded beside its peers: moved only off a node that other evidence points at, never restarted."""
    status = s.status
    if status is None or not s.degraded or status.gpu_fault:
        return None
    evidence = node_suspect(s.journal, s.policy, s.workload, status.node, s.now, s.fleet)
    if s.policy.gpu_fault_action != "cordon_and_move" or evidence is None or status.pod is None:
        return Held(None, degraded_refusal(status, s.policy, evidence))
    return None


def _degraded_cordoned(s: Subject) -> Held | None:
    status = s.status
    if status is None or not s.degraded or status.gpu_fault or status.node not in s.journal.gpu_nodes:
        return None
    return Held(None, f"degraded; node {status.node} was already cordoned")


def _ladder(s: Subject) -> Held | None:
    """The ladder: stuck again within escalate_within of its last step, the workload takes the next."""
    status = s.status
    if status is None:
        return None
    if s.step == "page":
        return Held(None, page_detail(s.journal, s.workload, status))
    if s.step == "cordon_and_move" and not status.gpu_fault:
        if status.node is None or status.pod is None:
            return Held(None, f"{s.workload} is stuck again within escalate_within of its restart and has no node"
                              " to move it off: a human must look")
        if status.node in s.journal.gpu_nodes:
            return Held(None, f"{s.workload} is stuck again within escalate_within of its restart; node {status.node}"
                              " was already cordoned")
    return None


def _cordon_limit(s: Subject) -> Held | None:
    if s.status is None or s.step != "cordon_and_move" or cordoned_count(s.journal) < s.policy.max_cordoned_nodes:
        return None
    held = ", ".join(sorted(s.journal.gpu_nodes)) or "none"
    return Held(None, f"node {s.status.node} would be cordoned, but {cordoned_count(s.journal)} of max_cordoned_nodes"
                      f" {s.policy.max_cordoned_nodes} are cordoned and not released ({held}): a human must look"[:500])


def _restart_in_progress(s: Subject) -> Held | None:
    running = in_progress(s.journal, s.now)
    if running is None:
        return None
    # The word holds a workload only for its own restart: a shim told `restart_in_progress` holds until it
    # reads its new process (exporter/backstop.py); another workload's restart is the cooldown's to hold.
    if s.status is None and not restarting(s.journal, s.workload, s.now):
        return None
    return Held(s.journal.last_restart_started, f"a restart of {running} is running")


def _cooldown(s: Subject) -> Held | None:
    # (Replicas' estimates of the API server's clock differ by a fraction of a second: with no
    # cooldown, a restart a replica dates a moment "ahead" of another's clock is no reason to wait.)
    last = s.journal.last_restart_started
    if last is None or s.policy.global_cooldown <= 0 or s.now - last >= s.policy.global_cooldown:
        return None
    return Held(last, f"global cooldown: {s.policy.global_cooldown - (s.now - last):.0f}s left")


def _circuit_open(s: Subject) -> Held | None:
    times = s.journal.restart_times.get(s.workload, ())
    since = times[-1] if times else None
    if s.workload in s.journal.open_circuits:
        return Held(since, f"restart budget exhausted for {s.workload}; POST /api/v1/circuit/reset")
    used = restarts_in_window(s.journal, s.policy, s.workload, s.now)
    if used >= s.policy.max_restarts:
        return Held(since, f"{used} restarts of {s.workload} within the budget window")
    return None


def _backoff(s: Subject) -> Held | None:
    """Each restart of a streak makes the next wait longer (a loop slower than the window is still a loop)."""
    wait = backoff_left(s.journal, s.policy, s.workload, s.now)
    if wait <= 0:
        return None
    streak = backoff_streak(s.journal, s.policy, s.workload, s.now)
    return Held(s.journal.backoff[s.workload][1], f"{streak} restarts of {s.workload} in a row (none quiet for"
                                                  f" {s.policy.backoff_reset:.0f}s): {wait:.0f}s of backoff left")


def _fleet_gate(s: Subject) -> Held | None:
    """A mass failure points elsewhere (network, storage, the exporter). The word has no fleet: it holds
    for STORM_HOLD after the storm the state saw (the storm cooldown, where it runs, holds as itself)."""
    if s.fleet is not None:
        storm = fleet_storm(s.fleet, s.policy)
        return None if storm is None else Held(s.now, storm)
    seen = s.journal.storm_seen_at
    if s.status is None and seen is not None and 0 <= s.now - seen < STORM_HOLD and _storm_cooldown(s) is None:
        return Held(seen, "the fleet was in a storm: no restart anywhere until it has passed")
    return None


def _storm_cooldown(s: Subject) -> Held | None:
    """After a storm the fleet must stay healthy for `storm_cooldown` (medik8s NHC's stormCooldownDuration)."""
    seen = s.journal.storm_seen_at
    if seen is None or s.policy.storm_cooldown <= 0 or s.now - seen >= s.policy.storm_cooldown:
        return None
    return Held(seen, f"the fleet was in a storm; {s.policy.storm_cooldown - (s.now - seen):.0f}s of storm cooldown left")


PAUSED = Check("paused", _paused)
# Every reason the gate holds a stuck target back, in the order they are checked: `decide` walks it
# after the target's own checks, and the backstop's word walks it for a workload (backstop.py).
CHECKS: tuple[Check, ...] = (
    PAUSED,
    Check("escalated_to_human", _paged),  # a page holds until a human releases the workload
    Check("gpu_fault", _gpu_fault),  # a GPU fault fails the same way after a restart: refuse, or move it
    Check("gpu_fault", _degraded_cordoned),
    Check("escalated_to_human", _ladder),
    Check("cordon_limit", _cordon_limit),  # cordons are bounded fleet-wide
    Check("restart_in_progress", _restart_in_progress),  # one restart at a time, fleet-wide
    Check("cooldown", _cooldown),  # from the start of the last restart of any target
    Check("circuit_open", _circuit_open),  # per-workload budget; open until a human resets it
    Check("backoff", _backoff),
    Check("fleet_gate", _fleet_gate),
    Check("storm_cooldown", _storm_cooldown),
)


def restarting(journal: JournalState, workload: str, now: float) -> bool:
    """Whether the restart running now (its claim held) is one of `workload`: its latest restart is the last one."""
    if in_progress(journal, now) is None or journal.last_restart_started is None:
        return False
    times = journal.restart_times.get(workload, ())
    last = times[-1] if times else (journal.backoff.get(workload) or (0, None))[1]
    return last == journal.last_restart_started or journal.in_progress == workload


def degraded_refusal(status: TargetStatus, policy: GatePolicy, evidence: str | None) -> str:
    """Why a degraded replica is not moved: degraded alone never restarts or moves anything."""
    if evidence is None:
        where = f"node {status.node}" if status.node else "an unknown node"
        return (f"degraded beside its peers, but nothing else points at {where} (no other workload's replica degraded"
                " or with a GPU fault there): degraded alone never restarts or moves anything")
    if policy.gpu_fault_action != "cordon_and_move":
        return f"degraded on node {status.node}, where {evidence}: set gpu_fault_action: cordon_and_move to move it"
    return f"degraded on node {status.node}, where {evidence}, but the exporter names no pod to move"


def precheck(alert: AlertFacts, journal: JournalState, policy: GatePolicy, now: float | None = None) -> Decision | None:
    """Steps 1-3, which need no exporter: a refusal, or None when the exporter must be asked.

    A target that is not static may still be taken by a template: that needs the exporter's view,
    so it is decided in `decide`. The pause is checked only when `now` is given.
    """
    if alert.status != "firing":
        return Decision(False, "not_firing", f"alert is {alert.status}")
    if alert.labels.get("remediation") != "restart":
        return Decision(False, "no_restart_label", 'alert has no remediation="restart" label')
    target = alert.target
    if target is None or (target not in policy.targets and not policy.templates):
        return _UNKNOWN
    if alert.key in journal.decided_keys:
        return Decision(False, "duplicate", "this fingerprint and startsAt were already decided")
    if now is not None and (held := PAUSED.held(Subject(journal, policy, target, now))) is not None:
        return Decision(False, PAUSED.reason, held.detail)
    return None


def decide(
    alert: AlertFacts,
    fleet: FleetView | None,
    journal: JournalState | None,
    policy: GatePolicy,
    now: float,
) -> Decision:
    """The whole gate, steps 1-10. `fleet` is None when the exporter could not be reached, and
    `journal` None when the shared state (the Kubernetes Lease) could not be read."""
    refused = precheck(alert, journal or JournalState(), policy, now)
    if refused is not None:
        return refused
    if journal is None:
        return Decision(False, "state_unreachable", "cannot read the shared state; nothing is restarted")
    target = alert.target
    assert target is not None

    # 4. Still stuck now, and not restarted since the alert began.
    if fleet is None:
        return Decision(False, "exporter_unreachable", "cannot re-check: the exporter did not answer")
    if target in fleet.withheld:
        return Decision(False, "unknown_target", "more than one exporter reports this target (overlapping shards)")
    status = fleet.targets.get(target)
    static = target in policy.targets
    if not static and template_index(policy, target, status) is None:
        return _UNKNOWN
    if status is None:
        return Decision(False, "not_stuck", "the exporter does not know this target")
    if status.unknown_verdict is not None:
        return Decision(False, "unknown_verdict", status.unknown_verdict[:500])
    acceptable = RESTARTABLE_STATES | ({"down"} if alert.alertname in policy.down_alertnames else frozenset())
    degraded_alert = alert.alertname == DEGRADED_ALERT  # only ever a move (5a), never a restart
    if degraded_alert and not status.degraded:
        return Decision(False, "not_stuck", f"the exporter says {status.state}, not degraded, now")
    if status.state not in acceptable and not degraded_alert:
        return Decision(False, "not_stuck", f"the exporter says {status.state} now")
    since = restarted_since(status, alert.starts_at)
    if since is not None:
        return Decision(False, "restarted_since_alert", since)
    # A template's target is acted on as its own pod, by UID only: a pod is never deleted by name
    # (a file_sd writer could name any pod; a name may belong to a newer pod by now).
    if not static and not status.pod_uid:
        what = "a pod UID" if status.pod else "a pod"
        return Decision(False, "no_pod_uid", f"the exporter names no {what} for this target; a pod is never acted on"
                                             " by name")

    # 5-9b. The table of checks (CHECKS), in order; the first that holds refuses. The backstop's word
    #       (backstop.py) walks the same table.
    workload = workload_of(target, status)
    subject = Subject(journal, policy, workload, now, status, fleet, degraded_alert)
    # A degraded replica is no hang to hold: without evidence against its node it is refused before the table.
    if (unmoved := _degraded(subject)) is not None:
        return Decision(False, "not_stuck", unmoved.detail)
    for check in CHECKS:
        held = check.held(subject)
        if held is not None:
            return Decision(False, check.reason, held.detail)
    step = subject.step

    # 10. Dry-run records what it would have done.
    moving = step == "cordon_and_move"
    if policy.dry_run:
        return Decision(False, "dry_run", "would cordon and move" if moving else "would restart")
    plan = plan_of(target, workload, status, policy, moving)
    if moving:
        suspect = node_suspect(journal, policy, workload, status.node, now, fleet)
        why = "GPU fault" if status.gpu_fault else (
            f"{workload} degraded beside its peers on this node, where {suspect} too" if degraded_alert else
            f"{workload} stuck again on this node within escalate_within, where {suspect} hung too (ladder)")
        return Decision(True, "cordon_and_move", f"{why} on node {status.node}: cordon, taint, move the pod", plan)
    # Said, never skipped in silence: nothing from the exporter could show a restart since the alert.
    unchecked = "" if has_start_evidence(status) else (
        "the exporter gives no process start time and saw no restart: a restart since the alert is not ruled out")
    if plan.group is not None:
        return Decision(True, "allowed", "; ".join(filter(None, [f"restart the whole group {workload}", unchecked])), plan)
    return Decision(True, "allowed", unchecked, plan)


def plan_of(target: str, workload: str, status: TargetStatus, policy: GatePolicy, moving: bool) -> Plan:
    """What an allowed decision acts on, and for how long: worked out once, carried out by acting.py."""
    static = target in policy.targets
    index = None if static else template_index(policy, target, status)
    template = policy.templates[index] if index is not None else None
    if static:
        timeout = policy.target_timeouts.get(target, DEFAULT_POD_TIMEOUT)
        pre = policy.pre_restart_timeouts.get(target, 0.0)
    else:
        timeout = template.timeout if template is not None else DEFAULT_POD_TIMEOUT
        pre = template.pre_restart_timeout if template is not None else 0.0
    if moving:
        # A move acts on the pod whatever the target's executor: the template's timeout, else the default.
        timeout = template.timeout if template is not None else DEFAULT_POD_TIMEOUT
        if status.gpu_fault:
            detail = str(status.raw.get("gpu_fault_detail") or status.gpu_fault_detail or "GPU fault")
            cause, taint = f"GPU fault ({detail})", taint_value(detail)
        elif status.degraded and status.state not in RESTARTABLE_STATES:
            cause, taint = f"{workload} degraded beside its peers on this node", DEGRADED_TAINT
        else:
            cause, taint = f"{workload} stuck again on this node within escalate_within of its restart here", LADDER_TAINT
        return Plan(target, workload, "cordon_and_move", timeout, pre + timeout, status.namespace, status.pod,
                    status.pod_uid, status.node, taint=taint, cause=cause, template=index)
    if static:
        return Plan(target, workload, "restart", timeout, pre + timeout, status.namespace, status.pod, status.pod_uid,
                    status.node)
    group = group_of(status)
    action: Action = "restart_group" if group is not None else "restart_pod"
    return Plan(target, workload, action, timeout, pre + timeout, status.namespace, status.pod, status.pod_uid,
                status.node, group, template=index)


def taint_value(detail: str) -> str:
    """The fault's reason as a taint value (a label value: 63 chars of [A-Za-z0-9_.-], alphanumeric ends)."""
    word = re.sub(r"[^A-Za-z0-9_.-]+", "-", detail.split(":", 1)[0].strip())[:63].strip("-_.")
    return word or "GpuFault"


def page_detail(journal: JournalState, workload: str, status: TargetStatus) -> str:
    """Why the ladder pages: what its last step was, and where the hang came back."""
    last = (journal.ladder.get(workload) or ("",))[0]
    if last == "restart" and status.node is not None and journal.ladder_nodes.get(workload) == status.node:
        return (f"{workload} is stuck again within escalate_within of its restart, on the same node {status.node},"
                " and no other workload hung there: a pod pinned to its node comes back there by design, so this"
                " is no evidence against the node (it is not cordoned); a human must look")[:500]
    if last == "restart":
        was = journal.ladder_nodes.get(workload)
        where = f"on node {status.node}" if status.node else "with no node known"
        before = f"node {was}" if was else "an unknown node"
        return (f"{workload} is stuck again within escalate_within of its restart on {before}, now {where}: a hang"
                " that follows the software across nodes is no node's fault; a human must look")[:500]
    return f"{workload} is stuck again within escalate_within of its last step ({last}): a human must look"[:500]

def restarted_since(status: TargetStatus, alert_start: float) -> str | None:
    """Why the target already restarted after the alert began, or None.

    The exporter's own detection (`last_restart_time`: a new start time, a counter that fell, a
    fresh page) is stamped by the exporter's clock, the one whose readings the alert fired on: it
    wins. The page's `process_start_time` is the server host's clock, which may be off: it counts
    only when the exporter saw no restart (it started after the server did)."""
    if status.last_restart_time is not None:
        if status.last_restart_time >= alert_start:
            return "the exporter saw the server restart after the alert began"
        return None
    if status.process_start_time is not None and status.process_start_time >= alert_start:
        return "the server process started after the alert did"
    return None


def has_start_evidence(status: TargetStatus) -> bool:
    """Whether the exporter gives anything a restart since the alert would show in."""
    return status.process_start_time is not None or status.last_restart_time is not None


def fleet_storm(fleet: FleetView, policy: GatePolicy) -> str | None:
    """Why the fleet is in a storm (more unhealthy servers than allowed), or None.

    A LeaderWorkerSet group is one server: its pods count once, unhealthy when any of them is."""
    units: dict[str, bool] = {}
    for name in managed_targets(policy, fleet):
        status = fleet.targets.get(name) or fleet.withheld.get(name)
        unit = status.workload if status is not None and group_of(status) is not None and status.workload else name
        units[unit] = units.get(unit, False) or is_unhealthy(status)
    limit = unhealthy_limit(policy, len(units))
    unhealthy = sum(units.values())
    if unhealthy > limit:
        return f"{unhealthy} of {len(units)} targets unhealthy (max {limit})"
    return None


def is_unhealthy(status: TargetStatus | None) -> bool:
    """What the fleet gate counts: unhealthy now, or within the exporter's last two polls."""
    return status is not None and (status.state in UNHEALTHY_STATES or status.recently_unhealthy)


@dataclass(frozen=True)
class Effects:
    """What one decision changes in the state the gate reads; the store applies them atomically.

    A node is not marked here: only a cordon that succeeded marks it (acting.py, after the fact)."""

    intent: bool = False  # a restart (or a move) starts: in progress, cooldown, budget, dedupe
    open_circuit: bool = False  # the workload's budget is used up now
    storm_seen_at: float | None = None  # the fleet was seen in a storm at this time
    remember: bool = False  # the alert is decided without a restart (dry_run): a copy of it is a duplicate
    workload: str = ""  # what the budget, the circuit and the ladder count (the target's name when empty)
    step: str | None = None  # the ladder step taken now (its time is the decision's)
    node: str | None = None  # the node of the pod the step acts on (the ladder's evidence), with `step`
    page: bool = False  # the workload is paged now: held until a human releases it
    backoff: tuple[int, float] | None = None  # the workload's restart streak after this restart
    backoff_refused: bool = False  # the workload's alert was refused for its backoff now (a human is told)
    hold: Reason | None = None  # the target is held for this reason now (`JournalState.held`)
    unhold: bool = False  # the target's hold ends: it was decided otherwise

    def __bool__(self) -> bool:
        return (self.intent or self.open_circuit or self.storm_seen_at is not None or self.remember
                or self.step is not None or self.page or self.backoff is not None or self.backoff_refused
                or self.hold is not None or self.unhold)


# A storm seen again within this many seconds of the last record is not written again: a storm of
# webhooks must not become a storm of writes to the shared state.
STORM_RECORD_GRANULARITY = 1.0
# A held target's entry is written again only when its reason changes, or this long after the last
# write: re-sends and re-decisions of a hang that stays held must not each become a write.
HELD_REFRESH = 120.0
# A backoff refusal is written again only this long after the last one written: Alertmanager's HA
# copies and re-sends of one hang must not each become a write to the shared state.
BACKOFF_REFUSAL_GRANULARITY = 300.0


def effects_of(
    decision: Decision, alert: AlertFacts, fleet: FleetView | None, journal: JournalState, policy: GatePolicy, now: float
) -> Effects:
    """The state change a decision implies (pure): what the caller must commit before acting."""
    target = alert.target or ""
    status = fleet.targets.get(target) if fleet is not None else None
    workload = workload_of(target, status)
    storm_at = None
    # The storm is recorded whatever the storm cooldown: every replica's backstop word holds the fleet after it.
    if (fleet is not None and decision.reason not in _BEFORE_FLEET
            and fleet_storm(fleet, policy) is not None
            and (journal.storm_seen_at is None or now - journal.storm_seen_at >= STORM_RECORD_GRANULARITY)):
        storm_at = now
    if decision.allowed:
        used = restarts_in_window(journal, policy, workload, now)
        step = node = None
        if policy.escalate_within is not None:
            step = "cordon_and_move" if decision.reason == "cordon_and_move" else "restart"
            node = status.node if status is not None else None
        backoff = (backoff_streak(journal, policy, workload, now) + 1, now) if policy.backoff_initial > 0 else None
        return Effects(intent=True, open_circuit=used + 1 >= policy.max_restarts, storm_seen_at=storm_at,
                       workload=workload, step=step, node=node, backoff=backoff, unhold=target in journal.held)
    opens = decision.reason == "circuit_open" and workload not in journal.open_circuits
    # The page is written once, when the workload reaches it: its copies change nothing. A ladder
    # cordon refused by the cordon limit pages too: else the ladder would start over at a restart.
    page = (policy.escalate_within is not None and not paged(journal, workload)
            and (decision.reason == "escalated_to_human"
                 or (decision.reason == "cordon_limit" and status is not None and not status.gpu_fault)))
    held = journal.backoff_refused.get(workload)
    backoff_refused = decision.reason == "backoff" and (held is None or now - held[1] >= BACKOFF_REFUSAL_GRANULARITY)
    return Effects(open_circuit=opens, storm_seen_at=storm_at, remember=decision.reason == "dry_run",
                   workload=workload, step="page" if page else None, page=page, backoff_refused=backoff_refused,
                   hold=decision.reason if holds_anew(journal, alert, workload, decision.reason, now) else None,
                   unhold=decision.reason in UNHOLDING and target in journal.held)


def holds_anew(journal: JournalState, alert: AlertFacts, workload: str, reason: Reason, now: float) -> bool:
    """Whether a refusal for `reason` must be written to the target's hold: a hold it is, and the entry
    is missing, says another reason, workload or alert, or was written HELD_REFRESH ago."""
    if reason not in HOLDING or not alert.target:
        return False
    entry = journal.held.get(alert.target)
    return (entry is None or entry.reason != reason or entry.workload != workload or now - entry.at >= HELD_REFRESH
            or (entry.fingerprint, entry.starts_at) != (alert.fingerprint, alert.starts_at))


# Decisions made before the fleet was read (or about an alert the gate does not act on).
_BEFORE_FLEET = frozenset(
    {"not_firing", "no_restart_label", "unknown_target", "duplicate", "paused", "state_unreachable",
     "exporter_unreachable", "unknown_verdict", "state_lost", "identity_mismatch", "owner_pending",
     "identity_unverified"}
)
