"""What the remediator does of its own between Alertmanager's re-sends (pure): which held targets to
decide again now, and which restarts the exporter shows that no remediator made.

A hold ends (a pause lifted, a page released, a cooldown, backoff or storm over) long before
Alertmanager re-sends the alert of a target it held: a firing alert comes back only every
`repeat_interval` rounded up to its `group_interval` (16 min as shipped), while the kubelet restarts
a stuck server about 6 min after its backstop's hold ends (a 240 s budget, then 6 probes 20 s apart).
So the remediator keeps the stuck targets it refused for a hold (`GateState.held`), the backstop's
word holds their workloads meanwhile, and every REDECIDE_INTERVAL it decides again each one whose
decision would be another now (`due`), on a fresh read of the exporter, as a re-check does.

Restarts no remediator made (the kubelet's liveness restarting a server's container, the server's own
exit under restartPolicy Always) show on the exporter as a new `last_restart_time` of the same target:
`outside_restarts` finds them, once each (by that time), for the workload's budget, circuit and backoff.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_vitals.remediator import gate, model
from llm_vitals.remediator.gate import Decision, GatePolicy
from llm_vitals.remediator.model import FleetView, GateState, HeldAlert, TargetStatus

# How often the remediator looks at its held targets and the exporter's restarts: what the bound from
# a hold's end to its decision is made of (docs/remediator.md), far below the kubelet's ~6 minutes.
REDECIDE_INTERVAL = 10.0
# A restart of a workload the remediator started within this long before the exporter saw the new
# process (a static target's executor; a pod restarted in place) is the remediator's own.
OWN_RESTART_WINDOW = 900.0
# The exporter's clock and the state's (the API server's) may differ by this much.
CLOCK_MARGIN = 30.0
# The exporter shows a restart's time converted from its monotonic clock at each read: the same restart
# reads a few milliseconds apart from one read to the next. A restart is another only this much later.
RESTART_RESOLUTION = 5.0


@dataclass(frozen=True)
class Due:
    """A held target to decide again now, and what the gate would decide on the state and fleet as read."""

    target: str
    held: HeldAlert
    decision: Decision


def due(state: GateState, fleet: FleetView | None, policy: GatePolicy, now: float) -> list[Due]:
    """The held targets whose decision is another now (allowed, another refusal, not stuck any more),
    or whose hold is HELD_REFRESH old (still held: written again), the longest held first. Without a
    fleet (the exporter unreadable) nothing is due: a re-decision could only say so."""
    if fleet is None:
        return []
    found = []
    for target, held in sorted(state.held.items(), key=lambda item: (item[1].since, item[0])):
        decision = gate.decide(held.facts(target), fleet, state, policy, now)
        refresh = now - held.at >= gate.HELD_REFRESH
        if held.reason in gate.AFTER_GATE:
            # The API server refused it (a disruption budget): the gate would allow it again at once, so
            # it is tried again only every HELD_REFRESH, not at every look.
            if refresh:
                found.append(Due(target, held, decision))
        elif decision.allowed or decision.reason != held.reason or refresh:
            found.append(Due(target, held, decision))
    return found


@dataclass(frozen=True)
class Seen:
    """A restart the exporter shows for `target`: at `at` (None: none yet); `actor` None when it is not
    counted (the first sight of the target, or the remediator's own restart)."""

    target: str
    workload: str
    at: float | None
    actor: str | None
    status: TargetStatus


def outside_restarts(state: GateState, fleet: FleetView, policy: GatePolicy) -> list[Seen]:
    """What changed in the restarts the exporter shows for the fleet the gate guards: a target seen the
    first time (remembered, not counted: what came before is not known), and a restart newer than the
    one remembered, counted as `kubelet` (a target in a pod) or `other` unless the remediator restarted
    the workload shortly before it."""
    found = []
    for target in gate.managed_targets(policy, fleet):
        status = fleet.targets.get(target)
        if status is None:
            continue
        at = status.last_restart_time
        before = state.seen_restarts.get(target)
        if before is None:
            found.append(Seen(target, model.workload_of(target, status), at, None, status))
            continue
        if at is None or at <= before + RESTART_RESOLUTION:
            continue
        workload = model.workload_of(target, status)
        own = any(max(before, at - OWN_RESTART_WINDOW) < started <= at + CLOCK_MARGIN
                  for started in state.restart_times.get(workload, ()))
        found.append(Seen(target, workload, at, None if own else ("kubelet" if status.pod else "other"), status))
    return found
