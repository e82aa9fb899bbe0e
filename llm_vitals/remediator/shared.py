"""The state the gate reads, as its stores keep it: pure transitions and its JSON form.

Both stores (`store.py`) keep the whole `JournalState` as the JSON below (a state written before
the ladder existed has no `ladder` key and loads as none; one written before workloads keys its
budgets and circuits by target name, which is a static target's workload): one replica in a row of
its SQLite file, replicas in one Kubernetes Lease (an annotation). Every change is one of the
transitions below applied to the state read at some version, and committed only if the store is
still at that version: else the caller reads again and decides again (the Lease's
`resourceVersion` makes the API server refuse a stale write, so exactly one replica's intent
wins). Nothing here does I/O.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .gate import AlertFacts, Effects, HeldAlert, JournalState, dedupe_key

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
# State keys written only when they hold something (a state without them reads as before).
SPARSE_KEYS = frozenset({"held", "outside_restarts", "seen_restarts"})
# A backoff streak older than this is over (settings.py caps `budget.backoff.reset_after` at 7d).
BACKOFF_MEMORY_SECONDS = 7 * 86400.0


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


def undo_of(state: JournalState, workload: str) -> Undo:
    """What a commit of an intent for `workload` will replace in `state`."""
    return Undo(state.last_restart_started, workload in state.open_circuits, state.ladder.get(workload),
                state.ladder_nodes.get(workload), state.backoff.get(workload))


def with_effects(state: JournalState, effects: Effects, alert: AlertFacts, now: float, intent: Intent | None) -> JournalState:
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


def held_for(state: JournalState, alert: AlertFacts, workload: str, reason: str, now: float) -> JournalState:
    """The alert's target is held for `reason` now: the backstop holds its workload, and the remediator
    decides it again when the hold ends (holds.py). A hold of the same workload keeps its start."""
    target = alert.target or ""
    was = state.held.get(target)
    since = was.since if was is not None and was.workload == workload else now
    entry = HeldAlert(workload, reason, since, now, alert.fingerprint, alert.starts_at, alert.alertname)
    return replace(state, held={**state.held, target: entry})


def restart_seen(state: JournalState, target: str, workload: str, at: float | None, counted: bool,
                 backoff_on: bool) -> JournalState:
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


def seen_kept(state: JournalState, present: set[str]) -> JournalState:
    """Only the targets the exporter reports now keep their last restart seen (a target back later is new)."""
    return replace(state, seen_restarts={t: v for t, v in state.seen_restarts.items() if t in present})


def unheld(state: JournalState, target: str) -> JournalState:
    """The held target's alert resolved, or is no longer the gate's: its hold ends."""
    return replace(state, held={t: h for t, h in state.held.items() if t != target})


def circuit_opened(state: JournalState, workload: str) -> JournalState:
    """The workload's budget is used up (by restarts no remediator made): its circuit opens."""
    return replace(state, open_circuits=state.open_circuits | {workload})


def finished(state: JournalState, holder: str, ran: str | None = None) -> JournalState:
    """The restart held by `holder` ended; a newer intent (after this one expired) is left alone.
    `ran`: the workload it restarted (it ran): a streak of refusals by its disruption budget is over."""
    if ran is not None and ran in state.disrupted:
        state = replace(state, disrupted={w: v for w, v in state.disrupted.items() if w != ran})
    if state.in_progress_by != holder:
        return state
    return replace(state, in_progress=None, in_progress_expires=None, in_progress_by=None, in_progress_key=None)


def claim_lapsed(state: JournalState, now: float | None = None) -> JournalState:
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


def disruption_refused(state: JournalState, workload: str, now: float) -> JournalState:
    """A PodDisruptionBudget refused the workload's restart now: the streak starts, or goes on."""
    first = state.disrupted[workload][0] if workload in state.disrupted else now
    return replace(state, disrupted={**state.disrupted, workload: (first, now)})


def undone(state: JournalState, intent: Intent, key: tuple[str, float]) -> JournalState:
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


def node_marked(state: JournalState, node: str) -> JournalState:
    """llm-vitals cordoned `node` (the cordon succeeded): it is escalated once, until released."""
    return replace(state, gpu_nodes=state.gpu_nodes | {node})


def node_released(state: JournalState, node: str) -> JournalState:
    """A human released `node` (POST /api/v1/nodes/{node}/release): it may be escalated again."""
    return replace(state, gpu_nodes=state.gpu_nodes - {node})


def workload_released(state: JournalState, workload: str) -> JournalState:
    """A human released `workload` (POST /api/v1/workloads/release): its page ends and its ladder
    starts again at a restart (its budget, circuit and backoff are the circuit reset's)."""
    return replace(
        state,
        pages={w: v for w, v in state.pages.items() if w != workload},
        ladder={w: v for w, v in state.ladder.items() if w != workload},
        ladder_nodes={w: v for w, v in state.ladder_nodes.items() if w != workload},
    )


def paused_state(state: JournalState, until: float | None, reason: str) -> JournalState:
    return replace(state, paused_until=until, pause_reason=reason if until is not None else "")


def circuits_reset(state: JournalState, workloads: list[str]) -> JournalState:
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
    state: JournalState,
    now: float,
    budget_window: float,
    key_memory: float = KEY_MEMORY_SECONDS,
    max_keys: int | None = MAX_KEYS,
) -> JournalState:
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


def to_json(state: JournalState) -> str:
    """The state as the Lease annotation's JSON (keys sorted, so equal states write equal text)."""
    doc: dict[str, Any] = {
        "in_progress": state.in_progress,
        "in_progress_expires": state.in_progress_expires,
        "in_progress_by": state.in_progress_by,
        "in_progress_key": list(state.in_progress_key) if state.in_progress_key is not None else None,
        "last_restart_started": state.last_restart_started,
        "restart_times": {t: list(v) for t, v in state.restart_times.items()},
        "open_circuits": sorted(state.open_circuits),
        "paused_until": state.paused_until,
        "pause_reason": state.pause_reason,
        "storm_seen_at": state.storm_seen_at,
        "gpu_nodes": sorted(state.gpu_nodes),
        "ladder": {w: [step, at] for w, (step, at) in sorted(state.ladder.items())},
        "disrupted": {w: [first, last] for w, (first, last) in sorted(state.disrupted.items())},
        "decided": [[fp, sa, at] for (fp, sa), at in sorted(state.decided_at.items())],
        "ladder_nodes": dict(sorted(state.ladder_nodes.items())),
        "pages": dict(sorted(state.pages.items())),
        "backoff": {w: [count, at] for w, (count, at) in sorted(state.backoff.items())},
        "backoff_refused": {w: [first, last] for w, (first, last) in sorted(state.backoff_refused.items())},
        "held": {t: [h.workload, h.reason, h.since, h.at, h.fingerprint, h.starts_at, h.alertname]
                 for t, h in sorted(state.held.items())},
        "outside_restarts": {w: list(v) for w, v in sorted(state.outside_restarts.items())},
        "seen_restarts": dict(sorted(state.seen_restarts.items())),
    }
    for key in SPARSE_KEYS:  # written only when they hold something: the document of a state without them is as before
        if not doc[key]:
            del doc[key]
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


class BadState(ValueError):
    """The shared state's text is not ours (hand-edited or from another version)."""


def from_json(text: str | None) -> JournalState:
    """Parse the annotation; absent means a fresh state. Raises BadState on anything else."""
    if not text:
        return JournalState()
    try:
        doc = json.loads(text)
        decided_at = {dedupe_key(str(fp), float(sa)): float(at) for fp, sa, at in doc.get("decided", [])}
        return JournalState(
            decided_keys=frozenset(decided_at),
            decided_at=decided_at,
            in_progress=_opt_str(doc.get("in_progress")),
            in_progress_expires=_opt_float(doc.get("in_progress_expires")),
            in_progress_by=_opt_str(doc.get("in_progress_by")),
            in_progress_key=_opt_key(doc.get("in_progress_key")),
            last_restart_started=_opt_float(doc.get("last_restart_started")),
            restart_times={str(t): tuple(float(x) for x in v) for t, v in doc.get("restart_times", {}).items()},
            open_circuits=frozenset(str(t) for t in doc.get("open_circuits", [])),
            paused_until=_opt_float(doc.get("paused_until")),
            pause_reason=str(doc.get("pause_reason") or ""),
            storm_seen_at=_opt_float(doc.get("storm_seen_at")),
            gpu_nodes=frozenset(str(n) for n in doc.get("gpu_nodes", [])),
            ladder={str(w): (str(step), float(at)) for w, (step, at) in (doc.get("ladder") or {}).items()},
            disrupted={str(w): (float(a), float(b)) for w, (a, b) in (doc.get("disrupted") or {}).items()},
            ladder_nodes={str(w): str(n) for w, n in (doc.get("ladder_nodes") or {}).items()},
            pages={str(w): float(at) for w, at in (doc.get("pages") or {}).items()},
            backoff={str(w): (int(c), float(at)) for w, (c, at) in (doc.get("backoff") or {}).items()},
            backoff_refused={str(w): (float(a), float(b)) for w, (a, b) in (doc.get("backoff_refused") or {}).items()},
            held={str(t): HeldAlert(str(w), str(r), float(since), float(at), str(fp), float(sa), str(name))
                  for t, (w, r, since, at, fp, sa, name) in (doc.get("held") or {}).items()},
            outside_restarts={str(w): tuple(float(x) for x in v) for w, v in (doc.get("outside_restarts") or {}).items()},
            seen_restarts={str(t): float(at) for t, at in (doc.get("seen_restarts") or {}).items()},
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise BadState(f"the shared state is not readable: {type(exc).__name__}: {exc}") from None


# -- the stored document: the state, the store's own fields, and fields this version does not know ---

# The store's own keys beside the state's: which initialisation the state belongs to (`epoch`), the
# budget window its restart times were kept for, and the last re-initialisation by a human.
STORE_KEYS = frozenset({"epoch", "budget_window", "reinitialised"})


@dataclass(frozen=True)
class Stored:
    """One stored document as read: the state, the store's fields, and what this version does not know.

    `carried` holds the keys a newer version wrote (a ladder, marks this version has no field for):
    they are written back as they were, so an older replica's write during a rolling upgrade never
    drops a newer one's state."""

    state: JournalState
    epoch: str | None = None
    budget_window: float | None = None
    reinitialised: Mapping[str, Any] | None = None
    carried: Mapping[str, Any] = field(default_factory=dict)


def known_keys() -> frozenset[str]:
    """Every key this version writes (the state's, whatever fields it has, and the store's)."""
    return frozenset(json.loads(to_json(JournalState()))) | SPARSE_KEYS | STORE_KEYS


def load(text: str) -> Stored:
    """Parse a stored document (the state, the store's fields, the rest kept). Raises BadState."""
    state = from_json(text)
    doc = json.loads(text) if text else {}
    if not isinstance(doc, dict):
        raise BadState("the shared state is not readable: not a JSON object")
    known = known_keys()
    epoch, window, reinit = doc.get("epoch"), doc.get("budget_window"), doc.get("reinitialised")
    if epoch is not None and not isinstance(epoch, str):
        raise BadState("the shared state is not readable: epoch is not a string")
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, float))):
        raise BadState("the shared state is not readable: budget_window is not a number")
    return Stored(state, epoch, None if window is None else float(window),
                  reinit if isinstance(reinit, dict) else None,
                  {k: v for k, v in doc.items() if k not in known})


def dump(stored: Stored) -> str:
    """The document to store: the fields carried from a newer version, then this version's own."""
    doc: dict[str, Any] = {**stored.carried, **json.loads(to_json(stored.state))}
    if stored.epoch is not None:
        doc["epoch"] = stored.epoch
    if stored.budget_window is not None:
        doc["budget_window"] = stored.budget_window
    if stored.reinitialised is not None:
        doc["reinitialised"] = dict(stored.reinitialised)
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def prune_window(own: float, stored: float | None) -> float:
    """The window to prune restart times by: the longest of this replica's and the one stored with
    them, so that a replica with a shorter `budget.window` (a rolling change of it) never drops
    restarts another still counts. The stored one is replaced by the writer's at each write."""
    return max(own, stored or 0.0)


def summary(state: JournalState) -> dict[str, Any]:
    """What a state holds, in a few words for a human (what a re-initialisation discards)."""
    return {
        "open_circuits": sorted(state.open_circuits),
        "workloads_with_restarts": len(state.restart_times),
        "paused_until": state.paused_until,
        "pause_reason": state.pause_reason,
        "cordoned_nodes": sorted(state.gpu_nodes),
        "ladder": {w: step for w, (step, _) in sorted(state.ladder.items())},
        "restart_in_progress": state.in_progress,
        "decided_alerts": len(state.decided_at),
        # Stuck targets held on purpose, by the reason of their last refusal (the backstop holds them too).
        "held_targets": dict(sorted((t, h.reason) for t, h in state.held.items())[:100]),
    }


# -- the Lease annotation: plain JSON while small, gzip past that ---------------------------------------

# A Lease's annotations together must stay under 256 KiB (the API server's limit). A document up to
# this size is stored as plain JSON (`kubectl get lease -o yaml` shows it); a larger one (thousands
# of open circuits, hundreds of cordoned nodes) is stored gzipped and base64-encoded behind GZIP_MARK.
# Measured (tests/test_remediator_state_lost.py): 5,000 workloads' open circuits and 500 cordoned
# nodes are 273 KB as JSON, which would not fit, and about 20 KB gzipped.
PLAIN_LIMIT = 64 * 1024
# What the state may take of the 256 KiB, leaving room for others' annotations (kubectl's last-applied).
ANNOTATION_BUDGET = 192 * 1024
GZIP_MARK = "gzip+base64:"


class TooLarge(ValueError):
    """The state does not fit its annotation's budget even gzipped."""


def encode_annotation(text: str) -> str:
    """The annotation's value for a document: itself while small, else gzipped. Raises TooLarge."""
    if len(text.encode()) <= PLAIN_LIMIT:
        return text
    packed = GZIP_MARK + base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode()
    if len(packed) > ANNOTATION_BUDGET:
        raise TooLarge(f"the shared state is {len(packed)} bytes gzipped, over its budget of {ANNOTATION_BUDGET}")
    return packed


def decode_annotation(value: str) -> str:
    """The document an annotation holds (plain or gzipped). Raises BadState."""
    if not value.startswith(GZIP_MARK):
        return value
    try:
        return gzip.decompress(base64.b64decode(value[len(GZIP_MARK):], validate=True)).decode()
    except (ValueError, OSError, EOFError) as exc:
        raise BadState(f"the shared state is not readable: {type(exc).__name__}: {exc}") from None


def _opt_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _opt_key(value: object) -> tuple[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError("in_progress_key is not [fingerprint, startsAt]")
    return dedupe_key(str(value[0]), float(value[1]))


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)
