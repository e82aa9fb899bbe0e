"""The gate's one table of checks (kured's blockers): every reason it holds a stuck target back after its
re-check, in order (`HOLDS`; the pause, the one hold that needs no exporter, is the gate's step 3 and
heads the table the word walks, gate.CHECKS).

Each `Check` is a reason and a predicate: given a `Subject` (the state, the policy, the workload, the
time and, for a decision, the target's status and the fleet), it says since when and why it holds, or
None. `first_refusal` is the one walk of the table: `gate.decide` asks it about an alert once the target's
own checks passed, the backstop's word (gate_word.py) about a workload, without a target's reading: a check
that needs one holds nothing there. So the word and the decision cannot drift: the first check that holds
wins both. What the checks count (the ladder's step, the storm, the budget, the backoff streak) the
`Subject` keeps, so that the decision's effects (gate.effects_of) read it rather than count again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from itertools import chain

from .ladder import LADDER, Step, ladder_step, node_suspect, page_detail
from .model import FleetView, GateState, TargetStatus
from .policy import GatePolicy
from .reasons import Reason
from .storm import fleet_storm

# How long a storm the gate saw holds every workload's backstop after it (gate_word.py), when the storm
# cooldown is shorter: the remediator re-decides the targets it refused in the storm itself
# (`GateState.held`), and a stuck server whose alert has not reached it yet is held this long too.
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

    journal: GateState
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

    # What the checks count, worked out once a subject: a decision's effects (gate.effects_of) read the
    # same storm, restarts and streak its checks did, never counted again.
    @cached_property
    def storm(self) -> str | None:
        """Why the fleet is in a storm (storm.py), or None; None without a fleet (the word)."""
        return fleet_storm(self.fleet, self.policy) if self.fleet is not None else None

    @cached_property
    def used(self) -> int:
        """The workload's restarts within the budget window now."""
        return restarts_in_window(self.journal, self.policy, self.workload, self.now)

    @cached_property
    def streak(self) -> int:
        """The restarts in the workload's backoff streak now."""
        return backoff_streak(self.journal, self.policy, self.workload, self.now)


@dataclass(frozen=True)
class Check:
    """One reason not to restart (kured's blockers): `held` says since when and why, or None."""

    reason: Reason
    held: Callable[[Subject], Held | None]


def first_refusal(table: Iterable[Check], subject: Subject) -> tuple[Check, Held] | None:
    """The first check of `table` that holds `subject`, with why; None when none does. The one walk of
    the table: `gate.decide` asks it about an alert, the backstop's word (gate_word.py) about a workload."""
    for check in table:
        held = check.held(subject)
        if held is not None:
            return check, held
    return None


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
    if status.node in s.journal.cordoned_nodes:
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
    if status is None or not s.degraded or status.gpu_fault or status.node not in s.journal.cordoned_nodes:
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
        if status.node in s.journal.cordoned_nodes:
            return Held(None, f"{s.workload} is stuck again within escalate_within of its restart; node {status.node}"
                              " was already cordoned")
    return None


def _cordon_limit(s: Subject) -> Held | None:
    if s.status is None or s.step != "cordon_and_move" or cordoned_count(s.journal) < s.policy.max_cordoned_nodes:
        return None
    held = ", ".join(sorted(s.journal.cordoned_nodes)) or "none"
    return Held(None, f"node {s.status.node} would be cordoned, but {cordoned_count(s.journal)} of max_cordoned_nodes"
                      f" {s.policy.max_cordoned_nodes} are cordoned and not released ({held}): a human must look"[:500])


def _restart_in_progress(s: Subject) -> Held | None:
    running = in_progress(s.journal, s.now)
    if running is None:
        return None
    # The word holds a workload only for its own restart: a shim told `restart_in_progress` holds until it
    # reads its new process (exporter/backstop_rule.py); another workload's restart is the cooldown's to hold.
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
    used = s.used
    if used >= s.policy.max_restarts:
        return Held(since, f"{used} restarts of {s.workload} within the budget window")
    return None


def _backoff(s: Subject) -> Held | None:
    """Each restart of a streak makes the next wait longer (a loop slower than the window is still a loop)."""
    streak = s.streak
    wait = backoff_left(s.journal, s.policy, s.workload, s.now, streak)
    if wait <= 0:
        return None
    return Held(s.journal.backoff[s.workload][1], f"{streak} restarts of {s.workload} in a row (none quiet for"
                                                  f" {s.policy.backoff_reset:.0f}s): {wait:.0f}s of backoff left")


def _fleet_gate(s: Subject) -> Held | None:
    """A mass failure points elsewhere (network, storage, the exporter). The word has no fleet: it holds
    for STORM_HOLD after the storm the state saw (the storm cooldown, where it runs, holds as itself)."""
    if s.fleet is not None:
        return None if s.storm is None else Held(s.now, s.storm)
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


# A degraded replica with no evidence against its node: no hang, so no hold; `decide` refuses it before the table.
UNMOVED = Check("not_stuck", _degraded)
# Every reason the gate holds a stuck target back after its re-check, in the order they are checked:
# `decide` walks it after the target's own checks, and the backstop's word walks it for a workload after
# the pause (gate.CHECKS: the pause is the gate's step 3, asked before the exporter's answer counts).
HOLDS: tuple[Check, ...] = (
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


def paged(journal: GateState, workload: str) -> bool:
    """The workload was paged and no human has released it (a `page` ladder step of an older state counts)."""
    return workload in journal.pages or (journal.ladder.get(workload) or ("",))[0] == "page"


def in_progress(journal: GateState, now: float) -> str | None:
    """The target of a restart running now; an intent past its expiry (a dead replica's) is over."""
    if journal.in_progress is None:
        return None
    if journal.in_progress_expires is not None and now >= journal.in_progress_expires:
        return None
    return journal.in_progress


def restarting(journal: GateState, workload: str, now: float) -> bool:
    """Whether the restart running now (its claim held) is one of `workload`: its latest restart is the last one."""
    if in_progress(journal, now) is None or journal.last_restart_started is None:
        return False
    times = journal.restart_times.get(workload, ())
    last = times[-1] if times else (journal.backoff.get(workload) or (0, None))[1]
    return last == journal.last_restart_started or journal.in_progress == workload


def restarts_in_window(journal: GateState, policy: GatePolicy, workload: str, now: float) -> int:
    """Restarts of `workload` within the budget window ending now (since its last circuit reset)."""
    since = now - policy.budget_window
    times = chain(journal.restart_times.get(workload, ()), journal.outside_restarts.get(workload, ()))
    return sum(1 for started in times if started > since)


def backoff_delay(policy: GatePolicy, restarts: int) -> float:
    """How long after the `restarts`-th restart of a streak the next may start (0 with the backoff off)."""
    if policy.backoff_initial <= 0 or restarts <= 0:
        return 0.0
    # Doubling past 2**32 is past any cap; the exponent is bounded so that the product stays a float.
    return min(policy.backoff_initial * 2.0 ** min(restarts - 1, 32), policy.backoff_max)


def backoff_streak(journal: GateState, policy: GatePolicy, workload: str, now: float) -> int:
    """Restarts in the workload's current streak: 0 once `backoff_reset` has passed without one."""
    entry = journal.backoff.get(workload)
    if entry is None or now - entry[1] >= policy.backoff_reset:
        return 0
    return entry[0]


def backoff_left(journal: GateState, policy: GatePolicy, workload: str, now: float, streak: int | None = None) -> float:
    """Seconds until the workload's backoff lets its next restart start (0: now); `streak`: `backoff_streak`'s
    answer, when known."""
    streak = backoff_streak(journal, policy, workload, now) if streak is None else streak
    if streak == 0:
        return 0.0
    return max(0.0, journal.backoff[workload][1] + backoff_delay(policy, streak) - now)


def cordoned_count(journal: GateState) -> int:
    """Nodes llm-vitals has cordoned and no human has released: what `max_cordoned_nodes` bounds."""
    return len(journal.cordoned_nodes)


def gpu_refusal(status: TargetStatus, policy: GatePolicy) -> str:
    """What a human reads of a refused GPU fault (the pod's Event): the fault, its node, what to do."""
    fault = f" ({status.gpu_fault_detail[:300]})" if status.gpu_fault_detail else ""
    where = f" on node {status.node}" if status.node else ""
    if policy.gpu_fault_action == "cordon_and_move":
        todo = "move the workload off it by hand (cordon_and_move needs the pod and node the exporter names)"
    else:
        todo = "move the workload off it, or set gpu_fault_action: cordon_and_move"
    return f"a GPU fault is flagged{fault}{where}; a restart would not help: {todo}"


def degraded_refusal(status: TargetStatus, policy: GatePolicy, evidence: str | None) -> str:
    """Why a degraded replica is not moved: degraded alone never restarts or moves anything."""
    if evidence is None:
        where = f"node {status.node}" if status.node else "an unknown node"
        return (f"degraded beside its peers, but nothing else points at {where} (no other workload's replica degraded"
                " or with a GPU fault there): degraded alone never restarts or moves anything")
    if policy.gpu_fault_action != "cordon_and_move":
        return f"degraded on node {status.node}, where {evidence}: set gpu_fault_action: cordon_and_move to move it"
    return f"degraded on node {status.node}, where {evidence}, but the exporter names no pod to move"
