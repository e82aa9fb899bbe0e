"""The gate: one pure function deciding whether an alert may restart its target, and how.

It takes plain data (the alert, the exporter's view of the fleet, the gate's stored state, the policy
and the time) and returns `Decision(allowed, reason, detail, plan)`. No I/O, no clock of its own: the
tests drive it with tables. The steps run in the order docs/remediator.md describes, and the first
refusal wins:

1-3. `precheck`: the alert is firing, asks for a restart, names a target the gate knows, is not a
     copy of one decided, and the remediator is not paused (no exporter needed);
4.   `recheck`: the exporter still sees the target stuck, not restarted since the alert began;
5-9. `held_back`: the table of checks (checks.py `HOLDS`: pages, GPU faults, the ladder, the cordon
     limit, one restart at a time, the cooldown, the budget, the backoff, the fleet gate and its
     cooldown), walked by `checks.first_refusal`, as the backstop's word walks it after the pause
     (`CHECKS`, gate_word.py);
10.  `allow`: a dry run says what it would do; else the decision carries its `Plan` (plan.py): what
     to act on and how long it may take, worked out here once and carried out by acting.py.

`effects_of` is the state change a decision implies, committed before acting; `ruling` gives both at
once, the one call an alert's commit makes into the gate: it hands `effects_of` the subject the checks
read (`decide_with_subject`), so that the storm, the budget and the backoff streak are counted once. The pieces live where
their job is: the reasons (reasons.py), the policy (policy.py), the data (model.py), the fleet's
storm (storm.py), the ladder (ladder.py). This module names them all, so callers import the gate.

What a budget, a circuit and the escalation ladder count is the target's **workload** (docs/remediator.md:
`Deployment/<ns>/<name>`, a StatefulSet, a DaemonSet, a LeaderWorkerSet group, a name a template
or file_sd label gives, or a static target's own name): what the operator owns and a restart does
not replace. A pod the remediator evicts comes back under a new name; its Deployment does not.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import NamedTuple

from llm_vitals.targets import RESTARTABLE_STATES, UNHEALTHY_STATES

from .checks import (
    HOLDS,
    STORM_HOLD,
    UNMOVED,
    Check,
    Held,
    Subject,
    backoff_delay,
    backoff_left,
    backoff_streak,
    cordoned_count,
    first_refusal,
    in_progress,
    paged,
    restarting,
    restarts_in_window,
)
from .ladder import LADDER, Step, ladder_step, node_suspect
from .model import AlertFacts, FleetView, GateState, Group, HeldAlert, TargetStatus, dedupe_key, workload_of
from .plan import Action, Plan, plan_of, taint_value
from .policy import DEFAULT_POD_TIMEOUT, GatePolicy, TemplateMatch, template_index
from .reasons import AFTER_GATE, AT_EDGE, HOLDING, HUMAN_REFUSALS, REASONS, UNHOLDING, Reason
from .storm import fleet_storm, is_unhealthy, managed_targets, unhealthy_limit

# The gate's names, wherever their job put them: callers import them from here.
__all__ = [
    "AFTER_GATE",
    "AT_EDGE",
    "CHECKS",
    "DEFAULT_POD_TIMEOUT",
    "DEGRADED_ALERT",
    "HELD_REFRESH",
    "HOLDING",
    "HOLDS",
    "HUMAN_REFUSALS",
    "LADDER",
    "PAUSED",
    "REASONS",
    "STORM_HOLD",
    "UNHEALTHY_STATES",
    "UNHOLDING",
    "Action",
    "AlertFacts",
    "Check",
    "Decision",
    "Effects",
    "FleetView",
    "GatePolicy",
    "GateState",
    "Group",
    "Held",
    "HeldAlert",
    "Plan",
    "Read",
    "Reason",
    "Rule",
    "Ruled",
    "Step",
    "Subject",
    "TargetStatus",
    "TemplateMatch",
    "backoff_delay",
    "backoff_left",
    "backoff_streak",
    "cordoned_count",
    "decide",
    "decide_with_subject",
    "dedupe_key",
    "effects_of",
    "first_refusal",
    "fleet_storm",
    "in_progress",
    "is_unhealthy",
    "ladder_step",
    "managed_targets",
    "node_suspect",
    "on_alert",
    "paged",
    "paused",
    "plan_of",
    "precheck",
    "restarting",
    "restarts_in_window",
    "ruling",
    "taint_value",
    "template_index",
    "unhealthy_limit",
    "workload_of",
]

# The alert of a replica degraded beside its peers (alerts/llm-vitals.rules.yml): shipped with
# remediation="none"; relabelled "restart" by an operator, it is still never a restart, only a move
# off a node that other evidence points at (`node_suspect`), with gpu_fault_action: cordon_and_move.
DEGRADED_ALERT = "LLMServerDegraded"


class Decision(NamedTuple):
    allowed: bool
    reason: Reason
    detail: str = ""
    plan: Plan | None = None  # set exactly when allowed

    @property
    def word(self) -> str:
        """What the decision is called in the journal's `decision` column and the webhook's answer, from
        the decision alone: restart | refused | dry_run | paused | resolved (`not_firing`: Alertmanager
        sends an alert firing or resolved, so one not firing is resolved)."""
        if self.allowed:
            return "restart"
        if self.reason in ("dry_run", "paused"):
            return self.reason
        return "resolved" if self.reason == "not_firing" else "refused"


_UNKNOWN = Decision(False, "unknown_target", "target is not in the remediator's config")


def precheck(alert: AlertFacts, journal: GateState, policy: GatePolicy, now: float | None = None) -> Decision | None:
    """Steps 1-3, which need no exporter: a refusal, or None when the exporter must be asked.

    A target that is not static may still be taken by a template: that needs the exporter's view,
    so it is decided in `decide`. The pause is checked only when `now` is given. Without `now` (the
    loop's look at the state as last seen, before any I/O), the alert whose restart holds the claim
    is not called a duplicate here: its claim may have lapsed (`state.claim_lapsed`, its alert judged
    afresh), which only the transaction, at the store's time, can tell. One claim is held at a time,
    so that is one alert's re-sends.
    """
    if alert.status != "firing":
        return Decision(False, "not_firing", f"alert is {alert.status}")
    if alert.labels.get("remediation") != "restart":
        return Decision(False, "no_restart_label", 'alert has no remediation="restart" label')
    target = alert.target
    if target is None or (target not in policy.targets and not policy.templates):
        return _UNKNOWN
    if alert.key in journal.decided_keys and (now is not None or alert.key != journal.in_progress_key):
        return Decision(False, "duplicate", "this fingerprint and startsAt were already decided")
    if now is not None and (held := _paused(journal, now)) is not None:
        return Decision(False, PAUSED.reason, held.detail)
    return None


def paused(journal: GateState, now: float) -> bool:
    """Whether a human's pause holds every restart now (POST /api/v1/pause)."""
    return journal.paused_until is not None and now < journal.paused_until


def _paused(journal: GateState, now: float) -> Held | None:
    if not paused(journal, now):
        return None
    reason = f": {journal.pause_reason}" if journal.pause_reason else ""
    return Held(None, f"the remediator is paused until {journal.paused_until:.0f}{reason}"[:500])


# The pause is step 3 (`precheck`), the one hold that needs neither the exporter nor a workload: asked
# before the exporter's answer counts, it is not in the table `held_back` walks after the re-check.
PAUSED = Check("paused", lambda s: _paused(s.journal, s.now))
# The gate's whole table, as the backstop's word walks it for a workload (gate_word.py): the pause, then
# the holds, in the order `decide` refuses with them.
CHECKS: tuple[Check, ...] = (PAUSED, *HOLDS)


def decide(
    alert: AlertFacts,
    fleet: FleetView | None,
    journal: GateState | None,
    policy: GatePolicy,
    now: float,
) -> Decision:
    """The whole gate, steps 1-10. `fleet` is None when the exporter could not be reached, and
    `journal` None when the shared state (the Kubernetes Lease) could not be read."""
    return decide_with_subject(alert, fleet, journal, policy, now)[0]


def decide_with_subject(alert: AlertFacts, fleet: FleetView | None, journal: GateState | None, policy: GatePolicy,
                        now: float) -> tuple[Decision, Subject | None]:
    """`decide`'s decision, and the subject its checks read (None when it was refused before them): what
    they worked out (the storm, the restarts counted) is carried to its effects, never worked out again."""
    refused = precheck(alert, journal or GateState(), policy, now)
    if refused is not None:
        return refused, None
    if journal is None:
        return Decision(False, "state_unreachable", "cannot read the shared state; nothing is restarted"), None
    if fleet is None:
        return Decision(False, "exporter_unreachable", "cannot re-check: the exporter did not answer"), None
    target = alert.target
    assert target is not None
    status = recheck(alert, target, fleet, policy)
    if isinstance(status, Decision):
        return status, None
    degraded = alert.alertname == DEGRADED_ALERT  # only ever a move (5a), never a restart
    subject = Subject(journal, policy, workload_of(target, status), now, status, fleet, degraded)
    refused = held_back(subject)
    return (refused if refused is not None else allow(target, subject)), subject


def recheck(alert: AlertFacts, target: str, fleet: FleetView, policy: GatePolicy) -> TargetStatus | Decision:
    """Step 4: the target's status when the exporter still sees it stuck now, not restarted since the
    alert began, and (a template's target) with a pod to act on by UID; else the refusal."""
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
    degraded_alert = alert.alertname == DEGRADED_ALERT
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
    return status


def held_back(subject: Subject) -> Decision | None:
    """Steps 5-9b: the table of checks (HOLDS), in order (`checks.first_refusal`); the first that holds
    refuses. The backstop's word (gate_word.py) walks the same table. A degraded replica is no hang to hold: without evidence
    against its node it is refused before the table."""
    refusal = first_refusal((UNMOVED, *HOLDS), subject)
    return None if refusal is None else Decision(False, refusal[0].reason, refusal[1].detail)


def allow(target: str, subject: Subject) -> Decision:
    """Step 10: what the gate lets happen, with its plan; a dry run only records what it would have done."""
    status, workload, policy = subject.status, subject.workload, subject.policy
    assert status is not None
    moving = subject.step == "cordon_and_move"
    if policy.dry_run:
        return Decision(False, "dry_run", "would cordon and move" if moving else "would restart")
    plan = plan_of(target, workload, status, policy, moving)
    if moving:
        suspect = node_suspect(subject.journal, policy, workload, status.node, subject.now, subject.fleet)
        why = "GPU fault" if status.gpu_fault else (
            f"{workload} degraded beside its peers on this node, where {suspect} too" if subject.degraded else
            f"{workload} stuck again on this node within escalate_within, where {suspect} hung too (ladder)")
        return Decision(True, "cordon_and_move", f"{why} on node {status.node}: cordon, taint, move the pod", plan)
    # Said, never skipped in silence: nothing from the exporter could show a restart since the alert.
    unchecked = "" if has_start_evidence(status) else (
        "the exporter gives no process start time and saw no restart: a restart since the alert is not ruled out")
    if plan.group is not None:
        return Decision(True, "allowed", "; ".join(filter(None, [f"restart the whole group {workload}", unchecked])), plan)
    return Decision(True, "allowed", unchecked, plan)


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
    hold: Reason | None = None  # the target is held for this reason now (`GateState.held`)
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


def ruling(alert: AlertFacts, fleet: FleetView | None, journal: GateState, policy: GatePolicy,
           now: float) -> tuple[Decision, Effects]:
    """The decision on an alert and the state change it implies: the one question an alert's commit asks
    the gate (remediator/state.py, and the backtest's replay of the gate)."""
    decision, subject = decide_with_subject(alert, fleet, journal, policy, now)
    return decision, effects_of(decision, alert, fleet, journal, policy, now, subject)


def effects_of(
    decision: Decision, alert: AlertFacts, fleet: FleetView | None, journal: GateState, policy: GatePolicy, now: float,
    subject: Subject | None = None,
) -> Effects:
    """The state change a decision implies (pure): what the caller must commit before acting. `subject`:
    the one the decision's checks read (`ruling`), with what they counted; else one is made here."""
    target = alert.target or ""
    if subject is None:
        status = fleet.targets.get(target) if fleet is not None else None
        subject = Subject(journal, policy, workload_of(target, status), now, status, fleet)
    status, workload = subject.status, subject.workload
    storm_at = None
    # The storm is recorded whatever the storm cooldown: every replica's backstop word holds the fleet after it.
    if (decision.reason not in _BEFORE_FLEET and subject.storm is not None
            and (journal.storm_seen_at is None or now - journal.storm_seen_at >= STORM_RECORD_GRANULARITY)):
        storm_at = now
    if decision.allowed:
        used = subject.used
        step = node = None
        if policy.escalate_within is not None:
            step = "cordon_and_move" if decision.reason == "cordon_and_move" else "restart"
            node = status.node if status is not None else None
        backoff = (subject.streak + 1, now) if policy.backoff_initial > 0 else None
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


# The gate's answer for one alert: the decision and the state change it implies.
Ruled = tuple[Decision, Effects]
# What a transaction sends the gate: the exporter's view (None: it did not answer), the state it read,
# and the store's time.
Read = tuple[FleetView | None, GateState, float]
# The ruling on each state a transaction reads (`on_alert`'s send): what `state.alert_decided` applies.
Rule = Callable[[Read], Ruled | None]


def on_alert(alert: AlertFacts, policy: GatePolicy, last: GateState) -> Generator[Ruled | None, Read, None]:
    """The gate on one alert, in one frame from the webhook's look to the transaction's decision (the
    shape of the exporter's read, verdict/plan.py): the loop starts it, the transaction resumes it.

    First it yields the look, before any I/O and without a time: steps 1-3 on the state as last seen
    (`precheck`), a refusal that changes nothing (most of a storm: `duplicate`), or None to go on to
    the exporter and the transaction. Then, for each (fleet, state, now) the transaction sends (again
    after a conflict, or once the API server confirmed the pod), it yields the ruling on it (`ruling`:
    the whole gate, steps 1-10, on the state read)."""
    refused = precheck(alert, last, policy)
    read = yield (None if refused is None else (refused, Effects()))
    while True:
        fleet, state, now = read
        read = yield ruling(alert, fleet, state, policy, now)


def holds_anew(journal: GateState, alert: AlertFacts, workload: str, reason: Reason, now: float) -> bool:
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
