"""Who owns an object, read from its `ownerReferences` and labels: one rule for the exporter's
discovery (a pod's workload, as a hint) and for the remediator (the workload it counts, checked).

- The owner is the reference marked `controller: true` (Kubernetes allows one). A pod whose
  references carry no such mark (a controller that does not set it, an older tool) is owned by
  its first reference with a kind and a name: never by nobody, which would make the pod its own
  workload and give each new pod of it a budget of its own.
- A LeaderWorkerSet group is named by the labels `leaderworkerset.sigs.k8s.io/name` and
  `.../group-index` (a number); these win over the owners (each group's pods are owned by a
  StatefulSet of their own).

Pure: plain dicts in, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"


@dataclass(frozen=True)
class Controller:
    """The owner that manages an object: its `controller: true` reference, else its first one."""

    kind: str
    name: str


def controller_of(metadata: Mapping[str, Any]) -> Controller | None:
    """The owner among an object's `ownerReferences` (the `controller: true` one, else the first
    with a kind and a name), or None when it has none."""
    references = [r for r in metadata.get("ownerReferences") or () if isinstance(r, Mapping)]
    named = [r for r in references if r.get("kind") and r.get("name")]
    marked = [r for r in named if r.get("controller") is True]
    chosen = marked or named
    return Controller(str(chosen[0]["kind"]), str(chosen[0]["name"])) if chosen else None


def group_of(labels: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(the LeaderWorkerSet's name, the group index) from a pod's labels, or None when they are not both there."""
    labels = labels or {}
    name, index = labels.get(LWS_NAME_LABEL), labels.get(LWS_GROUP_INDEX_LABEL)
    if not isinstance(name, str) or not name or not isinstance(index, str) or not index.isdigit():
        return None
    return name, index
