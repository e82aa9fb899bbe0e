"""The fleet as the gate counts it: the targets it guards, and whether too many are unhealthy at once.

A mass failure points elsewhere (network, storage, the exporter): the fleet gate refuses every
restart while it lasts, and the storm cooldown after it (checks.py).
"""

from __future__ import annotations

from itertools import chain

from llm_vitals.remediator import fleet_limit
from llm_vitals.targets import UNHEALTHY_STATES

from .model import FleetView, TargetStatus
from .policy import GatePolicy, template_index


def managed_targets(policy: GatePolicy, fleet: FleetView) -> list[str]:
    """The fleet the gate guards: static targets, and the exporter's targets a template takes
    (withheld ones included: the fleet gate counts the whole fleet)."""
    known = fleet.managed.get(id(policy))
    if known is not None and known[0] is policy:
        return list(known[1])
    reported = chain(fleet.targets.items(), fleet.withheld.items())
    extra = [n for n, s in reported if n not in policy.targets and template_index(policy, n, s) is not None]
    found = sorted(policy.targets) + sorted(extra)
    fleet.managed[id(policy)] = (policy, tuple(found))
    return found


def unhealthy_limit(policy: GatePolicy, fleet_size: int) -> int:
    """`max_unhealthy` as a count of this fleet (llm_vitals/remediator/fleet_limit.py)."""
    return fleet_limit.unhealthy_limit(policy.max_unhealthy, policy.max_unhealthy_percent, fleet_size)


def fleet_storm(fleet: FleetView, policy: GatePolicy) -> str | None:
    """Why the fleet is in a storm (more unhealthy servers than allowed), or None.

    A LeaderWorkerSet group is one server: its pods count once, unhealthy when any of them is."""
    statuses = {name: fleet.targets.get(name) or fleet.withheld.get(name) for name in managed_targets(policy, fleet)}
    units: dict[str, bool] = {}
    for name, status in statuses.items():
        unit = status.workload if status is not None and status.group is not None and status.workload else name
        units[unit] = units.get(unit, False) or is_unhealthy(status)
    limit = unhealthy_limit(policy, len(units))
    unhealthy = sum(units.values())
    if unhealthy > limit:
        return f"{unhealthy} of {len(units)} targets unhealthy (max {limit})"
    return None


def is_unhealthy(status: TargetStatus | None) -> bool:
    """What the fleet gate counts: unhealthy now, or within the exporter's last two polls."""
    return status is not None and (status.state in UNHEALTHY_STATES or status.recently_unhealthy)
