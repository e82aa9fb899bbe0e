"""The state the gate reads, as its stores keep it: pure transitions and its JSON form.

Both stores (`store.py`) keep the whole `JournalState` as the JSON below: one replica in a row of
its SQLite file, replicas in one Kubernetes Lease (an annotation). Every change is one of the
transitions below applied to the state read at some version, and committed only if the store is
still at that version: else the caller reads again and decides again (the Lease's
`resourceVersion` makes the API server refuse a stale write, so exactly one replica's intent
wins). Nothing here does I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from .gate import AlertFacts, Effects, JournalState, dedupe_key

# Alert keys older than this are dropped from the Lease's state.
KEY_MEMORY_SECONDS = 24 * 3600.0
# Cap on the keys kept, so that the Lease stays far below the API server's object size limit.
MAX_KEYS = 200


@dataclass(frozen=True)
class Intent:
    """A restart one replica committed to run: who, and until when its claim holds (None: until it ends)."""

    holder: str  # "<replica>/<action token>"
    target: str
    expires: float | None


def with_effects(state: JournalState, effects: Effects, alert: AlertFacts, now: float, intent: Intent | None) -> JournalState:
    """The state after a decision's effects; `intent` is required when `effects.intent`."""
    new = state
    if effects.intent:
        assert intent is not None
        target = alert.target or ""
        new = replace(
            new,
            in_progress=target,
            in_progress_expires=intent.expires,
            in_progress_by=intent.holder,
            last_restart_started=max(new.last_restart_started or now, now),
            restart_times={**new.restart_times, target: (*new.restart_times.get(target, ()), now)},
        )
    if effects.intent or effects.remember:
        new = replace(new, decided_keys=new.decided_keys | {alert.key}, decided_at={**new.decided_at, alert.key: now})
    if effects.open_circuit and alert.target:
        new = replace(new, open_circuits=new.open_circuits | {alert.target})
    if effects.storm_seen_at is not None:
        new = replace(new, storm_seen_at=effects.storm_seen_at)
    if effects.gpu_node is not None:
        new = replace(new, gpu_nodes=new.gpu_nodes | {effects.gpu_node})
    return new


def finished(state: JournalState, holder: str) -> JournalState:
    """The restart held by `holder` ended; a newer intent (after this one expired) is left alone."""
    if state.in_progress_by != holder:
        return state
    return replace(state, in_progress=None, in_progress_expires=None, in_progress_by=None)


def paused_state(state: JournalState, until: float | None, reason: str) -> JournalState:
    return replace(state, paused_until=until, pause_reason=reason if until is not None else "")


def circuits_reset(state: JournalState, targets: list[str]) -> JournalState:
    """Close the circuits of `targets` and forgive their budget so far."""
    return replace(
        state,
        open_circuits=state.open_circuits - set(targets),
        restart_times={t: v for t, v in state.restart_times.items() if t not in targets},
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
    return replace(state, restart_times=times, decided_at=keep, decided_keys=frozenset(keep))


def to_json(state: JournalState) -> str:
    """The state as the Lease annotation's JSON (keys sorted, so equal states write equal text)."""
    doc: dict[str, Any] = {
        "in_progress": state.in_progress,
        "in_progress_expires": state.in_progress_expires,
        "in_progress_by": state.in_progress_by,
        "last_restart_started": state.last_restart_started,
        "restart_times": {t: list(v) for t, v in state.restart_times.items()},
        "open_circuits": sorted(state.open_circuits),
        "paused_until": state.paused_until,
        "pause_reason": state.pause_reason,
        "storm_seen_at": state.storm_seen_at,
        "gpu_nodes": sorted(state.gpu_nodes),
        "decided": [[fp, sa, at] for (fp, sa), at in sorted(state.decided_at.items())],
    }
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
            last_restart_started=_opt_float(doc.get("last_restart_started")),
            restart_times={str(t): tuple(float(x) for x in v) for t, v in doc.get("restart_times", {}).items()},
            open_circuits=frozenset(str(t) for t in doc.get("open_circuits", [])),
            paused_until=_opt_float(doc.get("paused_until")),
            pause_reason=str(doc.get("pause_reason") or ""),
            storm_seen_at=_opt_float(doc.get("storm_seen_at")),
            gpu_nodes=frozenset(str(n) for n in doc.get("gpu_nodes", [])),
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise BadState(f"the shared state is not readable: {type(exc).__name__}: {exc}") from None


def _opt_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)
