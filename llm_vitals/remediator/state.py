"""How the gate's state changes: pure transitions, each a function of the state read (no I/O).

Every change to the state is one of these, applied to the state read at some version and committed
only if the store is still at that version (store/: else the caller reads again and decides again;
the Lease's `resourceVersion` makes the API server refuse a stale write, so exactly one replica's
intent wins). `ledger.py` is the one door that commits them, each with its journal row. The
stored form is state_codec.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, replace
from typing import TypeVar

from .gate import Decision, Effects, Plan, Rule
from .model import AlertFacts, Claim, FleetView, GateState, HeldAlert, Intent, Undo

# Alert keys older than this are dropped from the Lease's state.
KEY_MEMORY_SECONDS = 24 * 3600.0
# Cap on the keys kept, so that the Lease stays far below the API server's object size limit.
MAX_KEYS = 200
# Ladder steps older than this are dropped (no `escalate_within` is longer).
LADDER_MEMORY_SECONDS = 24 * 3600.0
# A streak of disruption-budget refusals ends when no refusal came for this long (two of Alertmanager's
# hourly re-sends of a still-firing alert, as alerts/alertmanager.yml routes them to the remediator).
DISRUPTION_MEMORY_SECONDS = 2 * 3600.0
# A streak of backoff refusals ends when no refusal came for this long (as the disruption budget's).
BACKOFF_REFUSAL_MEMORY_SECONDS = DISRUPTION_MEMORY_SECONDS
# A held target no replica re-decided for this long is forgotten (the re-decision refreshes it every
# gate.HELD_REFRESH while the hold lasts), and at most MAX_HELD are kept, the newest.
HELD_MEMORY_SECONDS = 3600.0
MAX_HELD = 500
# A backoff streak older than this is over (settings.py caps `budget.backoff.reset_after` at 7d).
BACKOFF_MEMORY_SECONDS = 7 * 86400.0

T = TypeVar("T")
# A transaction's pure step (`store.GateStore.transact`): the state read and the store's time in; its
# result and the new state out.
Step = Callable[[GateState, float], tuple[T, GateState]]


@dataclass(frozen=True)
class Pruning:
    """How a store prunes what it commits (`pruned`): one replica remembers keys longer than the Lease."""

    budget_window: float
    key_memory: float = KEY_MEMORY_SECONDS
    max_keys: int | None = MAX_KEYS


def transition(step: Step[T], state: GateState, now: float, pruning: Pruning) -> tuple[T, GateState | None]:
    """A transaction's step on `state` at `now`: its result, and the state to commit, pruned (None: the
    step changed nothing, and nothing is written)."""
    result, new = step(state, now)
    return result, None if new == state else pruned(new, now, pruning.budget_window, pruning.key_memory,
                                                     pruning.max_keys)


@dataclass(frozen=True)
class Committed:
    """An alert's decision as committed: when it was made, and for a restart its claim and journal row.
    `needs_identity`: nothing was committed, the pod it would act on must be confirmed first.
    `found`: the holder of the claim the decision found; `orphaned`: whether the decision ended that
    claim, one no restart of this process runs (`orphan_ended`)."""

    decision: Decision
    now: float
    intent: Intent | None = None
    action_id: int | None = None
    needs_identity: bool = False
    found: str | None = None
    orphaned: bool = False


@dataclass(frozen=True)
class OwnClaims:
    """What one replica (its claims never expire) knows of the claims it committed: those whose restart
    runs, and those ended whose release could not be written (holder -> the workload it restarted)."""

    running: Set[str]
    unreleased: Mapping[str, str | None]


def alert_decided(alert: AlertFacts, fleet: FleetView | None, rule: Rule, claim: Claim, checked: bool,
                  own: OwnClaims | None, state: GateState, now: float) -> tuple[Committed, GateState]:
    """An alert's transaction (ledger.Ledger.decide): a claim no restart of this process runs ended
    (`own`: one replica; None where claims expire), then the decision (`decided`). A restart or a dry
    run of a pod not `checked` yet commits only that ending and asks for the identity check first."""
    holder = state.in_progress_by
    orphaned = own is not None and holder is not None and holder not in own.running
    state = orphan_ended(state, own)
    decision, intent, new = decided(alert, fleet, state, rule, now, claim)
    # A dry run runs every check a live run does, the identity included: its "would restart" is then true.
    if (decision.allowed or decision.reason == "dry_run") and not checked:
        return Committed(decision, now, needs_identity=True, found=holder, orphaned=orphaned), state
    return Committed(decision, now, intent, found=holder, orphaned=orphaned), new


def orphan_ended(state: GateState, own: OwnClaims | None) -> GateState:
    """`state` without its claim, which no restart of this process runs (one replica): its restart ended
    (or never started) and its end could not be written (a conflict with this process's other commits,
    a failed write, a task cancelled). It is released as its end would have been, else lapsed
    (`claim_lapsed`: its alert judged afresh); its budget and cooldown spent."""
    holder = state.in_progress_by
    if own is None or holder is None or holder in own.running:
        return state
    if holder in own.unreleased:
        return finished(state, holder, own.unreleased[holder])
    return claim_lapsed(state)


def restart_ended(holder: str, ran: str | None, node: str | None, state: GateState,
                  now: float) -> tuple[None, GateState]:
    """A restart's end as a transaction's step (ledger.Ledger.finished): its claim released, the node
    it cordoned marked (`node`), and, where it ran (`ran`: its workload), its refusal streak ended."""
    return None, finished(node_cordoned(state, node) if node is not None else state, holder, ran)


def decided(alert: AlertFacts, fleet: FleetView | None, state: GateState, rule: Rule, now: float,
            claim: Claim) -> tuple[Decision, Intent | None, GateState]:
    """The gate's decision on `state` (a claim past its expiry ended first), the claim an allowed one
    takes, and the state its effects make: the one pure step an alert's commit applies (ledger.py).
    `rule`: the gate on this alert (`gate.on_alert`, resumed), which rules on the state sent."""
    state = claim_lapsed(state, now)
    ruled = rule((fleet, state, now))
    assert ruled is not None, "only the gate's look answers None"
    decision, effects = ruled
    intent = claim_of(claim, decision.plan, now, state) if decision.allowed and decision.plan is not None else None
    return decision, intent, with_effects(state, effects, alert, now, intent)


def claim_of(claim: Claim, plan: Plan, now: float, state: GateState) -> Intent:
    """The claim on the planned restart, with what its commit replaces in `state` (to take it back if
    the API server refuses the restart outright). It ends `claim.margin` after the plan's pre_restart
    and executor timeouts (None: when the restart ends)."""
    expires = None if claim.margin is None else now + plan.claim_for + claim.margin
    return Intent(claim.holder, plan.target, expires, plan.workload, now, undo_of(state, plan.workload))


def undo_of(state: GateState, workload: str) -> Undo:
    """What a commit of an intent for `workload` will replace in `state`."""
    return Undo(state.last_restart_started, workload in state.open_circuits, state.ladder.get(workload),
                state.ladder_nodes.get(workload), state.backoff.get(workload))


def with_effects(state: GateState, effects: Effects, alert: AlertFacts, now: float, intent: Intent | None) -> GateState:
    """The state after a decision's effects; `intent` is required when `effects.intent`."""
    new = state
    workload = effects.workload or alert.target or ""
    if effects.intent:
        assert intent is not None
        new = replace(
            new,
            in_progress=alert.target or "",
            in_progress_expires=intent.expires,
            in_progress_by=intent.holder,
            in_progress_key=alert.key,
            last_restart_started=max(new.last_restart_started or now, now),
            restart_times={**new.restart_times, workload: (*new.restart_times.get(workload, ()), now)},
        )
    if effects.intent or effects.remember:
        new = replace(new, decided_keys=new.decided_keys | {alert.key}, decided_at={**new.decided_at, alert.key: now})
    if effects.open_circuit and workload:
        new = replace(new, open_circuits=new.open_circuits | {workload})
    if effects.storm_seen_at is not None:
        new = replace(new, storm_seen_at=effects.storm_seen_at)
    if effects.step is not None and workload:
        new = replace(new, ladder={**new.ladder, workload: (effects.step, now)})
        nodes = {w: n for w, n in new.ladder_nodes.items() if w != workload}
        new = replace(new, ladder_nodes=nodes | ({workload: effects.node} if effects.node else {}))
    if effects.page and workload:
        new = replace(new, pages={**new.pages, workload: now})
    if effects.backoff is not None and workload:
        new = replace(new, backoff={**new.backoff, workload: effects.backoff})
    if effects.intent and workload in new.backoff_refused:  # the workload is acted on: nothing held back now
        new = replace(new, backoff_refused={w: v for w, v in new.backoff_refused.items() if w != workload})
    if effects.backoff_refused and workload:
        first = new.backoff_refused[workload][0] if workload in new.backoff_refused else now
        new = replace(new, backoff_refused={**new.backoff_refused, workload: (first, now)})
    target = alert.target or ""
    if effects.unhold and target in new.held:
        new = replace(new, held={t: h for t, h in new.held.items() if t != target})
    if effects.hold is not None and target:
        new = held_for(new, alert, workload, effects.hold, now)
    return new


def held_for(state: GateState, alert: AlertFacts, workload: str, reason: str, now: float) -> GateState:
    """The alert's target is held for `reason` now: the backstop holds its workload, and the remediator
    decides it again when the hold ends (holds.py). A hold of the same workload keeps its start."""
    target = alert.target or ""
    was = state.held.get(target)
    since = was.since if was is not None and was.workload == workload else now
    entry = HeldAlert(workload, reason, since, now, alert.fingerprint, alert.starts_at, alert.alertname)
    return replace(state, held={**state.held, target: entry})


def restart_seen(state: GateState, target: str, workload: str, at: float | None, counted: bool,
                 backoff_on: bool) -> GateState:
    """The exporter shows `target`'s last restart at `at` (None: none yet). `counted`: a restart no
    remediator made (the kubelet's), to count in the workload's budget and, with `backoff_on`, its
    backoff streak; else only remembered, so that it is never counted twice."""
    new = replace(state, seen_restarts={**state.seen_restarts, target: at if at is not None else -1.0})
    if not counted or at is None:
        return new
    new = replace(new, outside_restarts={**new.outside_restarts,
                                         workload: (*new.outside_restarts.get(workload, ()), at)})
    if backoff_on:
        streak = new.backoff.get(workload)
        new = replace(new, backoff={**new.backoff, workload: ((streak[0] if streak else 0) + 1, max(at, streak[1])
                                                              if streak else at)})
    return new


def seen_kept(state: GateState, present: set[str]) -> GateState:
    """Only the targets the exporter reports now keep their last restart seen (a target back later is new)."""
    return replace(state, seen_restarts={t: v for t, v in state.seen_restarts.items() if t in present})


def unheld(state: GateState, target: str) -> GateState:
    """The held target's alert resolved, or is no longer the gate's: its hold ends."""
    return replace(state, held={t: h for t, h in state.held.items() if t != target})


def circuit_opened(state: GateState, workload: str) -> GateState:
    """The workload's budget is used up (by restarts no remediator made): its circuit opens."""
    return replace(state, open_circuits=state.open_circuits | {workload})


def finished(state: GateState, holder: str, ran: str | None = None) -> GateState:
    """The restart held by `holder` ended; a newer intent (after this one expired) is left alone.
    `ran`: the workload it restarted (it ran): a streak of refusals by its disruption budget is over."""
    if ran is not None and ran in state.disrupted:
        state = replace(state, disrupted={w: v for w, v in state.disrupted.items() if w != ran})
    if state.in_progress_by != holder:
        return state
    return replace(state, in_progress=None, in_progress_expires=None, in_progress_by=None, in_progress_key=None)


def claim_lapsed(state: GateState, now: float | None = None) -> GateState:
    """A claim that ended without its holder finishing it (`now` past its expiry; None: whatever its
    expiry, as at a one-replica start): the claim is over, and its alert is judged afresh at the next
    re-send instead of being a `duplicate` for a day or a month. Its outcome is unknown (its commit's
    answer was lost, its journal row failed, its replica died), so the budget and the cooldown it spent
    stay spent (the safe side), and a restart that did run is seen by the gate's `restarted_since_alert`."""
    if state.in_progress is None and state.in_progress_by is None:
        return state
    if now is not None and (state.in_progress_expires is None or now < state.in_progress_expires):
        return state
    key = state.in_progress_key
    new = replace(state, in_progress=None, in_progress_expires=None, in_progress_by=None, in_progress_key=None)
    if key is None:
        return new
    return replace(new, decided_keys=new.decided_keys - {key},
                   decided_at={k: v for k, v in new.decided_at.items() if k != key})


def disruption_refused(state: GateState, workload: str, now: float) -> GateState:
    """A PodDisruptionBudget refused the workload's restart now: the streak starts, or goes on."""
    first = state.disrupted[workload][0] if workload in state.disrupted else now
    return replace(state, disrupted={**state.disrupted, workload: (first, now)})


def undone(state: GateState, intent: Intent, key: tuple[str, float]) -> GateState:
    """The restart `intent` committed did not happen at all (the API server refused it): its claim
    ends, and its entry in the budget, the cooldown, the alert's key, a circuit it opened and its
    ladder step are taken back, so that Alertmanager's next re-send is judged afresh."""
    new = finished(state, intent.holder)
    before, at, workload = intent.before, intent.started, intent.workload or intent.target
    if before is None or at is None:
        return new
    times = list(new.restart_times.get(workload, ()))
    if at in times:
        times.remove(at)
    restart_times = {w: v for w, v in new.restart_times.items() if w != workload} | ({workload: tuple(times)} if times else {})
    ladder = dict(new.ladder)
    ladder_nodes = dict(new.ladder_nodes)
    if (ladder.get(workload) or ("", None))[1] == at:  # the step this intent took (a later one is kept)
        if before.ladder is None:
            del ladder[workload]
        else:
            ladder[workload] = before.ladder
        ladder_nodes.pop(workload, None)
        if before.ladder_node is not None:
            ladder_nodes[workload] = before.ladder_node
    backoff = dict(new.backoff)
    if (backoff.get(workload) or (0, None))[1] == at:  # the streak entry this intent made
        if before.backoff is None:
            del backoff[workload]
        else:
            backoff[workload] = before.backoff
    decided_at = {k: v for k, v in new.decided_at.items() if k != key}
    return replace(
        new,
        restart_times=restart_times,
        last_restart_started=before.last_restart_started if new.last_restart_started == at else new.last_restart_started,
        open_circuits=new.open_circuits if before.circuit_was_open else new.open_circuits - {workload},
        ladder=ladder,
        ladder_nodes=ladder_nodes,
        backoff=backoff,
        decided_keys=new.decided_keys - {key},
        decided_at=decided_at,
    )


def node_cordoned(state: GateState, node: str) -> GateState:
    """llm-vitals cordoned `node` (the cordon succeeded): it is cordoned once, until released."""
    return replace(state, cordoned_nodes=state.cordoned_nodes | {node})


def node_released(state: GateState, node: str) -> GateState:
    """A human released `node` (POST /api/v1/nodes/{node}/release): it may be escalated again."""
    return replace(state, cordoned_nodes=state.cordoned_nodes - {node})


def workload_released(state: GateState, workload: str) -> GateState:
    """A human released `workload` (POST /api/v1/workloads/release): its page ends and its ladder
    starts again at a restart (its budget, circuit and backoff are the circuit reset's)."""
    return replace(
        state,
        pages={w: v for w, v in state.pages.items() if w != workload},
        ladder={w: v for w, v in state.ladder.items() if w != workload},
        ladder_nodes={w: v for w, v in state.ladder_nodes.items() if w != workload},
    )


def paused_state(state: GateState, until: float | None, reason: str) -> GateState:
    return replace(state, paused_until=until, pause_reason=reason if until is not None else "")


def circuits_reset(state: GateState, workloads: list[str]) -> GateState:
    """Close the circuits of `workloads`, forgive their budget and backoff so far and start their
    ladder again. A page is not the circuit's: it holds until the workload is released."""
    return replace(
        state,
        open_circuits=state.open_circuits - set(workloads),
        restart_times={w: v for w, v in state.restart_times.items() if w not in workloads},
        outside_restarts={w: v for w, v in state.outside_restarts.items() if w not in workloads},
        ladder={w: v for w, v in state.ladder.items() if w not in workloads or v[0] == "page"},
        ladder_nodes={w: v for w, v in state.ladder_nodes.items() if w not in workloads},
        backoff={w: v for w, v in state.backoff.items() if w not in workloads},
        backoff_refused={w: v for w, v in state.backoff_refused.items() if w not in workloads},
    )


def pruned(
    state: GateState,
    now: float,
    budget_window: float,
    key_memory: float = KEY_MEMORY_SECONDS,
    max_keys: int | None = MAX_KEYS,
) -> GateState:
    """Drop what can no longer matter: restart times outside the window, alert keys older than
    `key_memory` and, past `max_keys`, the oldest keys."""
    times = {t: kept for t, v in state.restart_times.items() if (kept := tuple(x for x in v if x > now - budget_window))}
    recent = sorted(((at, key) for key, at in state.decided_at.items() if at > now - key_memory), reverse=True)
    keep = dict((key, at) for at, key in recent[:max_keys])
    # A ladder step older than a day is past any escalate_within (settings.py caps it at 24h).
    # A `page` step of an older state is its page: kept until released, as `pages` are.
    ladder = {w: step for w, step in state.ladder.items() if step[1] > now - LADDER_MEMORY_SECONDS or step[0] == "page"}
    ladder_nodes = {w: n for w, n in state.ladder_nodes.items() if w in ladder}
    disrupted = {w: v for w, v in state.disrupted.items() if v[1] > now - DISRUPTION_MEMORY_SECONDS}
    backoff = {w: v for w, v in state.backoff.items() if v[1] > now - BACKOFF_MEMORY_SECONDS}
    backoff_refused = {w: v for w, v in state.backoff_refused.items() if v[1] > now - BACKOFF_REFUSAL_MEMORY_SECONDS}
    outside = {w: kept for w, v in state.outside_restarts.items() if (kept := tuple(x for x in v if x > now - budget_window))}
    held = dict(sorted(((t, h) for t, h in state.held.items() if h.at > now - HELD_MEMORY_SECONDS),
                       key=lambda item: item[1].since)[-MAX_HELD:])
    return replace(state, restart_times=times, decided_at=keep, decided_keys=frozenset(keep), ladder=ladder,
                   disrupted=disrupted, ladder_nodes=ladder_nodes, backoff=backoff, backoff_refused=backoff_refused,
                   outside_restarts=outside, held=held)


def prune_window(own: float, stored: float | None) -> float:
    """The window to prune restart times by: the longest of this replica's and the one stored with
    them, so that a replica with a shorter `budget.window` (a rolling change of it) never drops
    restarts another still counts. The stored one is replaced by the writer's at each write."""
    return max(own, stored or 0.0)
