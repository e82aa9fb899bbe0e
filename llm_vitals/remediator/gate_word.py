"""The gate's word for the kubelet's liveness backstop, per workload: `act` or `hold` (pure).

On Kubernetes two actors restart a stuck server: the remediator, behind its gate, and the kubelet,
through the liveness probe each server's shim answers. Only one may decide. The shim asks the
remediator (GET /api/v1/backstop, read token) for its workload's word, and while the word is `hold`
its liveness answers 200 however long the server is stuck (llm_vitals/exporter/backstop_rule.py). The
word's type and its wire shape are the shared contract's (llm_vitals/backstop_word.py).

The word walks the gate's own table of checks (gate.py `CHECKS`: the pause, then checks.py `HOLDS`, through
`checks.first_refusal` as `gate.decide` does), asked about the workload rather than an alert, then the
shared state's holds; the first that holds wins:
- `state_lost`: the shared state is lost, and the gate restarts nothing until a human re-initialises it;
- each check of `CHECKS` that needs no fresh reading of a target: `paused`, `escalated_to_human`
  (paged), `restart_in_progress` (a restart of this workload; another's is the cooldown's),
  `cooldown`, `circuit_open`, `backoff`, `fleet_gate` (a storm the state saw, for `checks.STORM_HOLD`
  or the storm cooldown when longer), `storm_cooldown`;
- a target of the workload the gate refused for a hold (`GateState.held`: `gpu_fault`,
  `cordon_limit`, `fleet_gate`, a pause lifted but not re-decided yet, any of `reasons.HOLDING`), with
  the reason of that refusal, until the remediator has decided it again (redecide.py); an entry no
  replica re-decided for HELD_STALE holds nothing (the remediator cannot decide: the kubelet may);
- `unknown_workload`: a workload the remediator has never heard of (a typo, a shim without
  `workload:`), for UNKNOWN_HOLD after it was first asked about (service.py keeps when), then `act`;
  counted and alerted all along (`LLMVitalsBackstopUnknownWorkload`).
Anything else is `act`: the gate would decide this workload's alert on its merits, so the kubelet's
backstop may act as it always did. A remediator in `dry_run` restarts nothing: its word is the gate's
all the same, and `act` leaves the backstop as it was without it.

Every input is shared state (the Lease, or the one replica's SQLite row), so every replica answers the
same word, and a restarted replica the word it answered before.
"""

from __future__ import annotations

from llm_vitals.backstop_word import BackstopWord, act, hold
from llm_vitals.remediator.checks import Subject, first_refusal
from llm_vitals.remediator.gate import CHECKS
from llm_vitals.remediator.model import GateState, TargetStatus
from llm_vitals.remediator.policy import GatePolicy
from llm_vitals.remediator.reasons import HOLDING

# Every reason the word may hold with, in the order the word walks them: derived, never kept by hand.
HOLD_REASONS = ("state_lost", *dict.fromkeys(c.reason for c in CHECKS), *sorted(HOLDING - {c.reason for c in CHECKS}),
                "unknown_workload")
# A held target's entry older than this (no replica re-decided it: the exporter unreadable, the
# remediator stuck) holds its workload no more: the kubelet's backstop is all there is then.
HELD_STALE = 600.0
# How long a workload the remediator never heard of is held after the first ask about it: long
# enough for a new workload's first pods to reach the exporter's discovery, short enough that a typo
# leaves the kubelet's backstop off for a bounded time only (its alert tells a human at once).
UNKNOWN_HOLD = 900.0


def restart_actor(status: TargetStatus | None, journal: GateState, workload: str, alert_start: float) -> str:
    """Who restarted a server the exporter saw restart after its alert began (the journal's `actor`).

    `remediator` when a restart of the workload by it started since the alert did; else, for a
    target in a pod, `kubelet` (a container restarted in its pod is always the kubelet's doing: its
    liveness probe, or the server's own exit under restartPolicy Always); else `other` (systemd,
    Docker's restart policy, a person)."""
    if any(started >= alert_start for started in journal.restart_times.get(workload, ())):
        return "remediator"
    return "kubelet" if status is not None and status.pod else "other"


def known(workload: str, journal: GateState, policy: GatePolicy, reported: frozenset[str]) -> bool:
    """Whether the remediator has heard of `workload`: a static target, one the exporter reports
    (`reported`), or one its state keeps anything of."""
    return (workload in policy.targets or workload in reported or workload in journal.restart_times
            or workload in journal.open_circuits or workload in journal.ladder or workload in journal.pages
            or workload in journal.backoff or workload in journal.outside_restarts
            or any(h.workload == workload for h in journal.held.values()))


def word_for(workload: str, journal: GateState, policy: GatePolicy, now: float, *, lost: bool = False,
             unknown_since: float | None = None) -> BackstopWord:
    """The gate's word for `workload`'s liveness backstop now; the first hold reason wins.
    `unknown_since`: when the remediator was first asked about a workload it has never heard of (None: known)."""

    if lost:
        return hold(workload, "state_lost", None, "the remediator's shared state is lost: nothing restarts until a"
                                                  " human re-initialises it")
    refusal = first_refusal(CHECKS, Subject(journal, policy, workload, now))
    if refusal is not None:
        check, held = refusal
        return hold(workload, check.reason, held.since, held.detail)
    entries = sorted((h.since, t, h) for t, h in journal.held.items()
                     if h.workload == workload and 0 <= now - h.at < HELD_STALE)
    if entries:
        since, target, entry = entries[0]
        return hold(workload, entry.reason, since, f"the gate refused {target} for {entry.reason}: the remediator"
                                                   " decides it again itself when that hold ends")
    if unknown_since is not None and 0 <= now - unknown_since < UNKNOWN_HOLD:
        return hold(workload, "unknown_workload", unknown_since, f"the remediator has never heard of {workload} (a"
                    f" typo, a shim without workload:?): held for {UNKNOWN_HOLD:.0f}s at most")
    return act(workload)
