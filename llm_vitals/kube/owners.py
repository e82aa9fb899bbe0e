"""Who owns an object, read from its `ownerReferences` and labels, and so which workload a pod is
part of: one rule for the exporter's discovery (a pod's workload, as a hint) and for the remediator
(the workload it counts, checked).

- The owner is the reference marked `controller: true` (Kubernetes allows one). A pod whose
  references carry no such mark (a controller that does not set it, an older tool) is owned by
  its first reference with a kind and a name: never by nobody, which would make the pod its own
  workload and give each new pod of it a budget of its own.
- A LeaderWorkerSet group is named by the labels `leaderworkerset.sigs.k8s.io/name` and
  `.../group-index` (a number); these win over the owners (each group's pods are owned by a
  StatefulSet of their own).
- A pod's workload (`workload_name`), first match wins: its LeaderWorkerSet group
  (`LeaderWorkerSet/<ns>/<name>/<group-index>`); no owner, `Pod/<ns>/<pod>` (nothing recreates
  it); an owner other than a ReplicaSet, `<Kind>/<ns>/<name>`; a ReplicaSet, that ReplicaSet's
  own owner (`Deployment/<ns>/<name>`, `Rollout/...`), or `ReplicaSet/<ns>/<name>` when it has
  none. How a ReplicaSet's owner is learnt, and what to do while it cannot be, is each caller's
  (`replica_set_to_resolve` names the one to learn).

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


def replica_set_to_resolve(group: tuple[str, str] | None, controller: Controller | None) -> str | None:
    """The ReplicaSet whose own owner names the pod's workload, or None when the pod's labels and owner say it."""
    if group is None and controller is not None and controller.kind == "ReplicaSet":
        return controller.name
    return None


def workload_name(namespace: str, pod: str, group: tuple[str, str] | None, controller: Controller | None,
                  replica_set_owner: Controller | None = None) -> str:
    """The pod's workload (the module docstring's rule); `replica_set_owner` is the owner of the
    ReplicaSet `replica_set_to_resolve` named (None: it has none)."""
    if group is not None:
        return f"LeaderWorkerSet/{namespace}/{group[0]}/{group[1]}"
    if controller is None:
        return f"Pod/{namespace}/{pod}"
    if controller.kind != "ReplicaSet":
        return f"{controller.kind}/{namespace}/{controller.name}"
    if replica_set_owner is None:
        return f"ReplicaSet/{namespace}/{controller.name}"
    return f"{replica_set_owner.kind}/{namespace}/{replica_set_owner.name}"
