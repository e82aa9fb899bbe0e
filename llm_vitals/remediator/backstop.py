"""The gate's word for the kubelet's liveness backstop, per workload: `act` or `hold` (pure).

On Kubernetes two actors restart a stuck server: the remediator, behind its gate, and the kubelet,
through the liveness probe each server's shim answers. Only one may decide. The shim asks the
remediator (GET /api/v1/backstop, read token) for its workload's word, and while the word is `hold`
its liveness answers 200 however long the server is stuck (llm_vitals/exporter/backstop.py).

`hold` means the remediator holds the workload, for one of HOLD_REASONS:
- `state_lost`: the shared state is lost, and the gate restarts nothing until a human re-initialises it;
- `paused`: a human paused the remediator;
- `escalated_to_human`: the workload was paged and not released;
- `circuit_open`: its restart budget is used up (open circuit, or the window's restarts);
- `restart_in_progress`: a restart of this workload is running (its claim is held);
- `cooldown`: the global cooldown since the last restart of any workload (one at a time, fleet-wide);
- `backoff`: the workload restarts in a loop and its backoff has not passed;
- `fleet_gate`: the fleet was refused as a storm (a fleet_gate or storm_cooldown refusal of any
  workload within `REFUSAL_HOLD`, or the state's storm within its storm cooldown): a fleet-wide hang
  must not be restarted everywhere by the kubelets either;
- `gpu_fault`: the gate refused a restart of this workload for a GPU fault lately: a restart on the
  same GPU does not fix it.
Anything else is `act`: the gate would decide this workload's alert on its merits, so the kubelet's
backstop may act as it always did. A remediator in `dry_run` restarts nothing and holds nothing of
its own: its word is the gate's all the same, and `act` leaves the backstop as it was without it.

The word is computed from the gate's own state and policy (the same helpers `gate.decide` uses), and
from the refusals this replica made lately (`Refusals`), with the time as an input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from llm_vitals.remediator import gate
from llm_vitals.remediator.gate import GatePolicy, JournalState, TargetStatus

Word = Literal["act", "hold"]
HOLD_REASONS = ("state_lost", "paused", "escalated_to_human", "circuit_open", "restart_in_progress", "cooldown",
                "backoff", "fleet_gate", "gpu_fault")
# How long a refusal the gate made holds the backstop after it: longer than Alertmanager's
# group_interval (5 m), so a storm's refusals, re-sent while it lasts, keep the kubelets held.
REFUSAL_HOLD = 600.0
# Refusals of one workload that hold the fleet's backstop: a storm is fleet-wide.
FLEET_REFUSALS = frozenset({"fleet_gate", "storm_cooldown"})
# Refusals that hold their own workload's backstop: a restart would not help.
WORKLOAD_REFUSALS = frozenset({"gpu_fault"})


@dataclass(frozen=True)
class BackstopWord:
    """The word for one workload: what GET /api/v1/backstop answers (`since` in the remediator's clock)."""

    workload: str
    word: Word
    reason: str = ""  # one of HOLD_REASONS with `hold`; empty with `act`
    since: float | None = None  # when the hold began, where the state says so
    detail: str = ""

    def as_json(self) -> dict[str, object]:
        return {"workload": self.workload, "word": self.word, "reason": self.reason, "since": self.since,
                "detail": self.detail}


@dataclass(frozen=True)
class Refusals:
    """The gate's recent refusals that hold a backstop, as this replica made them (not shared state).

    `fleet`: the last fleet_gate/storm_cooldown refusal (any workload); `workloads`: each workload's
    last refusal among WORKLOAD_REFUSALS, as (reason, at)."""

    fleet: float | None = None
    workloads: Mapping[str, tuple[str, float]] = field(default_factory=dict)


def noted(refusals: Refusals, workload: str, reason: str, now: float) -> Refusals:
    """`refusals` with the gate's refusal of `workload` for `reason` at `now` (unchanged for other reasons)."""
    if reason in FLEET_REFUSALS:
        return Refusals(now, refusals.workloads)
    if reason in WORKLOAD_REFUSALS:
        return Refusals(refusals.fleet, {**refusals.workloads, workload: (reason, now)})
    return refusals


def restart_actor(status: TargetStatus | None, journal: JournalState, workload: str, alert_start: float) -> str:
    """Who restarted a server the exporter saw restart after its alert began (the journal's `actor`).

    `remediator` when a restart of the workload by it started since the alert did; else, for a
    target in a pod, `kubelet` (a container restarted in its pod is always the kubelet's doing: its
    liveness probe, or the server's own exit under restartPolicy Always); else `other` (systemd,
    Docker's restart policy, a person)."""
    if any(started >= alert_start for started in journal.restart_times.get(workload, ())):
        return "remediator"
    return "kubelet" if status is not None and status.pod else "other"


def _restarting(journal: JournalState, workload: str, now: float) -> bool:
    """Whether the restart running now (its claim held) is one of `workload`: its latest restart is the last one."""
    if gate.in_progress(journal, now) is None or journal.last_restart_started is None:
        return False
    times = journal.restart_times.get(workload, ())
    last = times[-1] if times else (journal.backoff.get(workload) or (0, None))[1]
    return last == journal.last_restart_started or journal.in_progress == workload


def word_for(workload: str, journal: JournalState, policy: GatePolicy, now: float,
             refusals: Refusals = Refusals(), *, lost: bool = False) -> BackstopWord:
    """The gate's word for `workload`'s liveness backstop now; the first hold reason wins."""

    def hold(reason: str, since: float | None, detail: str) -> BackstopWord:
        return BackstopWord(workload, "hold", reason, since, detail[:500])

    if lost:
        return hold("state_lost", None, "the remediator's shared state is lost: nothing restarts until a human"
                                        " re-initialises it")
    if gate.paused(journal, now):
        return hold("paused", None, f"the remediator is paused until {journal.paused_until:.0f}"
                                    f"{': ' + journal.pause_reason if journal.pause_reason else ''}")
    if gate.paged(journal, workload):
        return hold("escalated_to_human", journal.pages.get(workload),
                    f"{workload} was paged: POST /api/v1/workloads/release once a human has looked")
    times = journal.restart_times.get(workload, ())
    if workload in journal.open_circuits or gate.restarts_in_window(journal, policy, workload, now) >= policy.max_restarts:
        return hold("circuit_open", times[-1] if times else None,
                    f"restart budget exhausted for {workload}; POST /api/v1/circuit/reset")
    last = journal.last_restart_started
    if _restarting(journal, workload, now):
        return hold("restart_in_progress", last, f"the remediator is restarting {workload}")
    if last is not None and policy.global_cooldown > 0 and 0 <= now - last < policy.global_cooldown:
        return hold("cooldown", last, f"global cooldown: {policy.global_cooldown - (now - last):.0f}s left")
    wait = gate.backoff_left(journal, policy, workload, now)
    if wait > 0:
        return hold("backoff", journal.backoff[workload][1], f"{workload} restarts in a loop: {wait:.0f}s of backoff left")
    storm = journal.storm_seen_at
    if storm is not None and 0 <= now - storm < max(policy.storm_cooldown, REFUSAL_HOLD):
        return hold("fleet_gate", storm, "the fleet was in a storm: no restart anywhere until it has passed")
    if refusals.fleet is not None and 0 <= now - refusals.fleet < REFUSAL_HOLD:
        return hold("fleet_gate", refusals.fleet, "the fleet gate refused a restart lately: too many unhealthy at once")
    refused = refusals.workloads.get(workload)
    if refused is not None and 0 <= now - refused[1] < REFUSAL_HOLD:
        return hold(refused[0], refused[1], f"the gate refused {workload} for {refused[0]}: a restart would not help")
    return BackstopWord(workload, "act")
