"""The gate's state as its stores keep it: JSON, the same in a SQLite row and on a Lease.

Both stores (store/) keep the whole `GateState` as the JSON below (a state written before the
ladder existed has no `ladder` key and loads as none; one written before workloads keys its
budgets and circuits by target name, which is a static target's workload): one replica in a row of
its SQLite file, replicas in one Kubernetes Lease (an annotation, gzipped past PLAIN_LIMIT). The
keys never change meaning between versions: `gpu_nodes` holds `GateState.cordoned_nodes` (its
name from before the ladder cordoned nodes too), so a fleet upgrades, and downgrades, in place.
Nothing here does I/O.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .model import GateState, HeldAlert, dedupe_key

# State keys written only when they hold something (a state without them reads as before).
SPARSE_KEYS = frozenset({"held", "outside_restarts", "seen_restarts"})


def to_json(state: GateState) -> str:
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
        "gpu_nodes": sorted(state.cordoned_nodes),  # its key before the ladder cordoned too
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


def from_json(text: str | None) -> GateState:
    """Parse the annotation; absent means a fresh state. Raises BadState on anything else."""
    if not text:
        return GateState()
    try:
        doc = json.loads(text)
        decided_at = {dedupe_key(str(fp), float(sa)): float(at) for fp, sa, at in doc.get("decided", [])}
        return GateState(
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
            cordoned_nodes=frozenset(str(n) for n in doc.get("gpu_nodes", [])),
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

    state: GateState
    epoch: str | None = None
    budget_window: float | None = None
    reinitialised: Mapping[str, Any] | None = None
    carried: Mapping[str, Any] = field(default_factory=dict)


def known_keys() -> frozenset[str]:
    """Every key this version writes (the state's, whatever fields it has, and the store's)."""
    return frozenset(json.loads(to_json(GateState()))) | SPARSE_KEYS | STORE_KEYS


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


def summary(state: GateState) -> dict[str, Any]:
    """What a state holds, in a few words for a human (what a re-initialisation discards)."""
    return {
        "open_circuits": sorted(state.open_circuits),
        "workloads_with_restarts": len(state.restart_times),
        "paused_until": state.paused_until,
        "pause_reason": state.pause_reason,
        "cordoned_nodes": sorted(state.cordoned_nodes),
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
