"""One fleet view from n sharded exporters (docs/configuration.md: `shard: {index, count}`): the pure rule.

Every shard is read and the views are joined, rather than each re-check being routed to the shard
that owns the alert's target: the fleet gate (`max_unhealthy`) must count the whole fleet anyway,
and a join needs no copy of the exporters' hash. Reading them is exporter_client.FleetReader's job;
a shard that cannot be read makes the whole view None before this is called.
"""

from __future__ import annotations

from collections.abc import Sequence

from .gate import is_unhealthy
from .model import FleetView, TargetStatus


def merge_views(views: Sequence[tuple[str, FleetView]]) -> tuple[FleetView, dict[str, tuple[str, ...]]]:
    """The union of every exporter's view, and the targets more than one exporter reported.

    `views` is (exporter URL, its view) per exporter, as read. Shards that overlap are a
    misconfiguration: a target reported twice is never acted on (which copy would be the truth?),
    so it is left out of `targets` and put in `withheld`, where the fleet gate still counts it at
    its least healthy copy. The duplicates map each such name to the URLs that reported it, in the
    order given.
    """
    seen: dict[str, list[tuple[str, TargetStatus]]] = {}
    for url, view in views:
        for name, status in view.targets.items():
            seen.setdefault(name, []).append((url, status))
    targets: dict[str, TargetStatus] = {}
    withheld: dict[str, TargetStatus] = {}
    duplicates: dict[str, tuple[str, ...]] = {}
    for name, found in seen.items():
        if len(found) == 1:
            targets[name] = found[0][1]
            continue
        withheld[name] = least_healthy([status for _, status in found])
        duplicates[name] = tuple(url for url, _ in found)
    return FleetView(targets=targets, withheld=withheld), duplicates


def least_healthy(copies: Sequence[TargetStatus]) -> TargetStatus:
    """The copy the fleet gate counts: the first unhealthy one, else the first."""
    return next((status for status in copies if is_unhealthy(status)), copies[0])

