"""The soak's invariants: pure functions over what happened (the remediator's actions and decisions,
the humans' acts), the fleet's truth and the stored state, each naming its violations by a key so
that a violation seen after many steps is counted once.

Each invariant states the issue's *intended* rule (issue 30), not what a given version does:

- `no_restart_while_paged`: no restart or cordon of a workload while a page holds for it, from the
  page (an `escalated_to_human` refusal) until a human releases it;
- `no_cordon_without_node_evidence`: a node is cordoned only while the exporter flags a GPU fault on
  it, or for a hang that was the node's doing (its pods keep hanging there, whatever runs on it: this
  hang, or another workload's acted on there within `escalate_within` before);
  a workload's own hang, which follows its pod from node to node or stays with a pinned pod, is no
  evidence against the node;
- `cordons_within_limit`: at most MAX_CORDONED_NODES nodes cordoned by llm-vitals at once;
- `restarts_within_budget_and_backoff`: per workload, at most `max_restarts` actions in the budget
  window since a human's last reset, each further one at least BACKOFF_BASE * 2^(k-1) after the
  k-th one before it;
- `hangs_handled_within_bound`: no hang spends more than HANG_BOUND unhandled and untold: it ends when
  the hung pod itself is restarted or moved (by the remediator or the kubelet; an action on another
  pod of its workload does not end it) or by itself, and the time counts while the last answer about
  it is not a refusal a human sees (a page, an open circuit, a held backoff: a hold on purpose, told,
  stops the clock; an early refusal followed by cooldowns does not);
- `nothing_forgotten`: what holds until a human releases it (a page, an open circuit, a node
  llm-vitals cordoned), the budget spent within the window and the fields a newer replica wrote
  stay in the stored state, across crashes, writes and pruning;
- `lost_state_refuses`: nothing is acted on from the loss of the shared state until a human
  re-initialises it;
- `no_action_on_a_mismatched_pod`: an executor is handed only the pod the API server holds under
  that name and UID (a pod a rollout replaced after the exporter's poll is refused `identity_mismatch`).

The History is kept incrementally by the soak (`record_*`), so that each check looks at what is new
since the last one (`Marks`) and looks the rest up by workload, target or node.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

# The intended limits (bench/soak.py sets the remediator's settings to them): `max_cordoned_nodes` ...
MAX_CORDONED_NODES = 2
# ... the per-workload backoff: the action after k actions of the workload within the budget window waits this
# times 2^(k-1) after the last one (the remediator's own `budget.backoff.initial`, which the soak passes) ...
BACKOFF_BASE = 900.0
# ... and the bound on a hang: detection (STUCK_AFTER + for:), then Alertmanager's re-sends every
# repeat_interval (15m: a refusal for the cooldown is judged afresh at the next, one hang restarted
# per cooldown), and a margin for several hangs at once. A refusal that can last longer (a backoff,
# a page, an open circuit) must be told to a human.
HANG_BOUND = 3 * 3600.0
# The remediator's `escalate_within` in the soak (bench/soak.py's SETTINGS): how far back the gate looks
# for other workloads' restarts on a node as evidence against it.
ESCALATE_WITHIN = 3600.0
# The kubelet's restarts (Action.replica) reach the stored budget once the exporter's next poll shows the
# new start time and the remediator's next look counts it: within two steps of the soak.
KUBELET = "kubelet"
SEEN_WITHIN = 120.0

# Refusals a human is told of (an Event, a page or an alert of their own): a hang refused so is handled.
# (A `backoff` refusal is told by LLMVitalsRemediatorBackoffHolding, where the state shows it: the soak
# checks that, `History.record_told`.)
TOLD_REASONS = frozenset({
    "gpu_fault", "circuit_open", "fleet_gate", "escalated_to_human", "disruption_budget", "paused",
    "state_unreachable", "state_lost", "cordon_limit", "identity_mismatch",
})


@dataclass(frozen=True)
class Action:
    """What an executor was handed after the gate allowed it: a restart (pod or group) or a cordon-and-move."""

    seq: int
    at: float
    kind: str  # restart | group_restart | cordon_and_move
    workload: str
    target: str
    node: str | None
    replica: str
    done: bool  # False: the pod was gone already (nothing happened)
    cordoned_after: int = 0  # nodes cordoned by llm-vitals right after it (truth)
    # The hang it acted on was the node's doing (a GPU fault, a node whose pods keep hanging), as the
    # fleet's truth says; False for a workload's own hang, which follows its pod to any node.
    node_at_fault: bool = False
    # The pod the executor was handed (by name and UID) was the one the API server held then.
    pod_matched: bool = True


@dataclass(frozen=True)
class Seen:
    """One decision the remediator answered for one alert."""

    seq: int
    at: float
    target: str
    workload: str | None
    reason: str
    replica: str


@dataclass(frozen=True)
class HumanAct:
    seq: int
    at: float
    kind: str  # release_page | reset_circuit | release_node | reinitialise
    subject: str


class Episode(Protocol):
    """A hang, as the invariants read it (bench/fleet_sim.py's `Episode`)."""

    id: int
    target: str
    workload: str
    start: float
    end: float | None


@dataclass(frozen=True)
class StoredState:
    """What the shared state holds now, as the invariants read it (None in `Check.state`: unreadable or gone)."""

    pages: frozenset[str]
    open_circuits: frozenset[str]
    marked_nodes: frozenset[str]
    fields: frozenset[str]  # the top-level keys of its JSON
    # When each workload's restarts (and moves) counted against its budget started.
    restart_times: Mapping[str, Sequence[float]] = field(default_factory=dict)
    # Workloads whose stuck alerts are refused for their backoff, as the state records it
    # (llm_vitals_remediator_backoff_refused_seconds: LLMVitalsRemediatorBackoffHolding tells a human).
    held_back: frozenset[str] = frozenset()


@dataclass
class Interval:
    start: int  # seq
    end: int | None = None
    at: float = 0.0  # the start's time


@dataclass
class History:
    """Everything the invariants judge, in the order it happened (`seq`)."""

    window: float  # the budget window
    max_restarts: int
    backoff_base: float = 0.0  # the first wait of the per-workload backoff (BACKOFF_BASE, or the remediator's own)
    seq: int = 0
    actions: list[Action] = field(default_factory=list)
    decisions: list[Seen] = field(default_factory=list)
    humans: list[HumanAct] = field(default_factory=list)
    by_workload: dict[str, list[Action]] = field(default_factory=dict)
    told: dict[str, list[float]] = field(default_factory=dict)  # target -> times of told refusals
    # target -> (time, told) of every answer about it: a refusal a human sees, or another answer
    answers: dict[str, list[tuple[float, bool]]] = field(default_factory=dict)
    # episode id -> how far `untold_until` has read its answers: (next index, untold so far, since, told)
    untold: dict[int, tuple[int, float, float, bool]] = field(default_factory=dict)
    pages: dict[str, list[Interval]] = field(default_factory=dict)
    resets: dict[str, list[int]] = field(default_factory=dict)  # workload -> seqs of a human's reset or release
    evidence: dict[str, list[Interval]] = field(default_factory=dict)  # node -> GPU fault flagged
    lost: list[Interval] = field(default_factory=list)
    # What holds until a human releases it, as the stored state was seen to hold it: item -> seq since.
    held: dict[tuple[str, str], int] = field(default_factory=dict)
    fresh_since: int = 0  # a human's last re-initialisation of the state
    reinits: list[int] = field(default_factory=list)  # seqs of every re-initialisation

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    # -- recording --------------------------------------------------------------------------------

    def record_action(self, action: Action) -> None:
        self.actions.append(action)
        self.by_workload.setdefault(action.workload, []).append(action)
        if action.kind == "cordon_and_move" and action.done and action.node:
            self.held.setdefault(("node", action.node), action.seq)

    def record_decision(self, seen: Seen) -> None:
        self.decisions.append(seen)
        if seen.reason in TOLD_REASONS:
            self.told.setdefault(seen.target, []).append(seen.at)
        if seen.reason != "duplicate":  # an HA pair's second copy says nothing new about the hang
            self.answers.setdefault(seen.target, []).append((seen.at, seen.reason in TOLD_REASONS))
        if seen.reason == "escalated_to_human" and seen.workload and self.page_open(seen.workload) is None:
            self.pages.setdefault(seen.workload, []).append(Interval(seen.seq, None, seen.at))
            self.held[("page", seen.workload)] = seen.seq

    def record_human(self, act: HumanAct) -> None:
        self.humans.append(act)
        if act.kind == "reset_circuit":  # the budget is forgiven (and the backoff's streak ends)
            self.resets.setdefault(act.subject, []).append(act.seq)
            self.held.pop(("circuit", act.subject), None)
        if act.kind == "release_page":
            page = self.page_open(act.subject)
            if page is not None:
                page.end = act.seq
            self.held.pop(("page", act.subject), None)
        elif act.kind == "release_node":
            self.held.pop(("node", act.subject), None)
        elif act.kind == "reinitialise":
            self.fresh_since = act.seq
            self.reinits.append(act.seq)
            if self.lost and self.lost[-1].end is None:
                self.lost[-1].end = act.seq
            # The human starts the state afresh (`from: empty`): what it held is theirs to carry over,
            # its pages ended, its budgets and backoffs forgiven, as the runbook says.
            self.held = {}
            for spans in self.pages.values():
                if spans[-1].end is None:
                    spans[-1].end = act.seq

    def record_told(self, target: str, at: float) -> None:
        """A human was told of the target's hang by an alert of the remediator's own (not a refusal's word)."""
        self.told.setdefault(target, []).append(at)
        answers = self.answers.setdefault(target, [])
        if answers and answers[-1][0] == at:
            answers[-1] = (at, True)
        else:
            answers.append((at, True))

    def record_evidence(self, node: str, flagged: bool, at: float) -> None:
        spans = self.evidence.setdefault(node, [])
        if flagged and (not spans or spans[-1].end is not None):
            spans.append(Interval(self.next_seq(), None, at))
        elif not flagged and spans and spans[-1].end is None:
            spans[-1].end = self.next_seq()

    def record_loss(self, at: float) -> None:
        if not self.lost or self.lost[-1].end is not None:
            self.lost.append(Interval(self.next_seq(), None, at))

    def record_field(self, name: str) -> None:
        self.held[("field", name)] = self.next_seq()

    def observe(self, state: StoredState | None) -> None:
        """Open circuits seen in the stored state hold from then on, until a human resets them."""
        if state is not None:
            for workload in state.open_circuits:
                self.held.setdefault(("circuit", workload), self.seq)

    # -- lookups ----------------------------------------------------------------------------------

    def page_open(self, workload: str) -> Interval | None:
        spans = self.pages.get(workload)
        return spans[-1] if spans and spans[-1].end is None else None

    def paged_at(self, workload: str, seq: int) -> bool:
        return any(p.start < seq and (p.end is None or p.end > seq) for p in self.pages.get(workload, ()))

    def flagged_at(self, node: str | None, seq: int) -> bool:
        return node is not None and any(e.start < seq and (e.end is None or e.end > seq)
                                        for e in self.evidence.get(node, ()))

    def lost_at(self, seq: int) -> bool:
        return any(span.start < seq and (span.end is None or span.end > seq) for span in self.lost)

    def last_reset(self, workload: str, seq: int) -> int:
        """The last human act before `seq` that forgave the workload's budget: its reset, or a re-initialisation."""
        seqs = self.resets.get(workload, [])
        i = bisect.bisect_left(seqs, seq)
        j = bisect.bisect_left(self.reinits, seq)
        return max(seqs[i - 1] if i else 0, self.reinits[j - 1] if j else 0)


@dataclass(frozen=True)
class Marks:
    """How far the last check went: the new records are those from these indexes on."""

    actions: int = 0
    decisions: int = 0
    episodes: int = 0


@dataclass(frozen=True)
class Check:
    history: History
    since: Marks
    now: float
    state: StoredState | None
    episodes: Sequence[Episode]  # the hangs not settled yet (`hang_outcome`), in the order they began

    @property
    def new_actions(self) -> list[Action]:
        return self.history.actions[self.since.actions:]


Invariant = Callable[[Check], Iterable[Hashable]]


def no_restart_while_paged(c: Check) -> Iterable[Hashable]:
    for a in c.new_actions:
        if c.history.paged_at(a.workload, a.seq):
            yield a.seq


def no_cordon_without_node_evidence(c: Check) -> Iterable[Hashable]:
    for a in c.new_actions:
        if (a.kind == "cordon_and_move" and not a.node_at_fault and not c.history.flagged_at(a.node, a.seq)
                and not others_hung_there(c.history, a)):
            yield a.seq


def others_hung_there(h: History, a: Action) -> bool:
    """Whether another workload's pod on `a`'s node was acted on for a hang that was that node's doing
    (the fleet's truth), within ESCALATE_WITHIN before `a`: the node's pods keep hanging there, whatever
    runs on it, so a cordon of it is on evidence about the node even when `a`'s own hang was its workload's."""
    return any(b.node == a.node and b.workload != a.workload and b.node_at_fault and b.seq < a.seq
               and b.at >= a.at - ESCALATE_WITHIN for b in reversed(h.actions))


def cordons_within_limit(c: Check) -> Iterable[Hashable]:
    for a in c.new_actions:
        if a.kind == "cordon_and_move" and a.cordoned_after > MAX_CORDONED_NODES:
            yield a.seq


def restarts_within_budget_and_backoff(c: Check) -> Iterable[Hashable]:
    h = c.history
    for a in c.new_actions:
        since = h.last_reset(a.workload, a.seq)
        before = [b for b in h.by_workload.get(a.workload, ()) if since < b.seq < a.seq and b.at > a.at - h.window]
        if len(before) + 1 > h.max_restarts:
            yield ("budget", a.seq)
        elif before and a.at - before[-1].at < (h.backoff_base or BACKOFF_BASE) * 2 ** (len(before) - 1):
            yield ("backoff", a.seq)


def hangs_handled_within_bound(c: Check) -> Iterable[Hashable]:
    for e in c.episodes:  # the hangs not settled yet (the soak drops those `hang_outcome` settles)
        if hang_outcome(e, c.history, c.now) == "violated":
            yield e.id


def hang_outcome(e: Episode, h: History, now: float) -> str | None:
    """`handled` (the hung pod itself acted on, or the hang ended, within the bound of untold time),
    `violated` (more than HANG_BOUND of it unhandled and untold), or None: not settled yet."""
    ended = e.end if e.end is not None and e.end <= now else None
    acted = next((a.at for a in h.by_workload.get(e.workload, ())
                  if a.target == e.target and a.done and e.start <= a.at <= now), None)
    until = min(t for t in (ended, acted, now) if t is not None)
    if untold_until(h, e, until) >= HANG_BOUND:
        return "violated"
    return "handled" if until < now or ended is not None or acted is not None else None


def untold_until(h: History, e: Episode, until: float) -> float:
    """`untold_seconds` of the hang up to `until`, carried on from where the last check left it (a hang
    held for days has hundreds of answers; `until` only grows from one check to the next)."""
    answers = h.answers.get(e.target, [])
    i, total, at, told = h.untold.get(e.id) or (bisect.bisect_left(answers, (e.start, False)), 0.0, e.start, False)
    while i < len(answers) and answers[i][0] <= until:
        if not told:
            total += answers[i][0] - at
        at, told = answers[i]
        i += 1
    h.untold[e.id] = (i, total, at, told)
    return total if told else total + (until - at)


def untold_seconds(answers: Sequence[tuple[float, bool]], start: float, until: float) -> float:
    """The time from `start` to `until` while the last answer about the hang (none yet: detection) was
    not a refusal a human sees."""
    total, at, told = 0.0, start, False
    for when, flag in answers[bisect.bisect_left(answers, (start, False)):]:
        if when > until:
            break
        if not told:
            total += when - at
        at, told = when, flag
    return total if told else total + (until - at)


def nothing_forgotten(c: Check) -> Iterable[Hashable]:
    if c.state is None:
        return
    h = c.history
    for (kind, name), since in h.held.items():
        kept = {"page": c.state.pages, "circuit": c.state.open_circuits, "node": c.state.marked_nodes,
                "field": c.state.fields}[kind]
        if name not in kept:
            yield (kind, name, since)
    # The budget spent stays spent: every action within the window (since a human's reset) is counted.
    recent: dict[str, list[int]] = {}
    for a in reversed(h.actions):
        if a.at <= c.now - h.window:
            break
        if a.replica == KUBELET and a.at > c.now - SEEN_WITHIN:
            continue  # not seen yet: the exporter's next poll and the remediator's next look count it
        if a.seq > max(h.last_reset(a.workload, h.seq + 1), h.fresh_since):
            recent.setdefault(a.workload, []).append(a.seq)
    for workload, seqs in recent.items():
        if len(seqs) > sum(1 for t in c.state.restart_times.get(workload, ()) if t > c.now - h.window):
            yield ("budget", workload, max(seqs))


def no_action_on_a_mismatched_pod(c: Check) -> Iterable[Hashable]:
    for a in c.new_actions:
        if not a.pod_matched:
            yield a.seq


def lost_state_refuses(c: Check) -> Iterable[Hashable]:
    for a in c.new_actions:
        if c.history.lost_at(a.seq):
            yield a.seq


INVARIANTS: dict[str, Invariant] = {
    "no_restart_while_paged": no_restart_while_paged,
    "no_cordon_without_node_evidence": no_cordon_without_node_evidence,
    "cordons_within_limit": cordons_within_limit,
    "restarts_within_budget_and_backoff": restarts_within_budget_and_backoff,
    "hangs_handled_within_bound": hangs_handled_within_bound,
    "nothing_forgotten": nothing_forgotten,
    "lost_state_refuses": lost_state_refuses,
    "no_action_on_a_mismatched_pod": no_action_on_a_mismatched_pod,
}


def unsettled(episodes: Iterable[Episode], history: History, now: float) -> list[Episode]:
    """The hangs `hang_outcome` has not settled by `now`: what the next check judges again."""
    return [e for e in episodes if hang_outcome(e, history, now) is None]
