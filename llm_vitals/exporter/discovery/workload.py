"""A pod's workload: what the operator owns and a restart does not replace, read from the pod's
labels and owners. The remediator's budget, circuit and restart-loop alert key on it, so that a
Deployment whose new pods keep hanging is counted once, across pod names.

The rule, first match wins (`pod_workload`, pure; tests/test_discovery_workload.py is its table):

1. The LeaderWorkerSet labels `leaderworkerset.sigs.k8s.io/name` and `.../group-index` (a number):
   `LeaderWorkerSet/<ns>/<name>/<group-index>`. A group (its leader and workers) is one workload,
   as LeaderWorkerSet restarts it as one unit; these labels win over the owners (each group's pods
   are owned by StatefulSets of their own).
2. No controller among the pod's ownerReferences (a bare pod): `Pod/<ns>/<pod>`, its own workload.
   Nothing recreates it, so its name is as stable as anything it has.
3. A ReplicaSet: its own controller, read from the ReplicaSets of the namespace (an informer):
   `Deployment/<ns>/<name>` (or another controller of ReplicaSets, e.g. `Rollout/<ns>/<name>`),
   and `ReplicaSet/<ns>/<name>` for one that no controller owns. A ReplicaSet that cannot be
   read (no right to list ReplicaSets, or not seen yet after a successful list) falls back to
   `ReplicaSet/<ns>/<name>`: still stable across restarts, since a Deployment's new pods come back
   under the same ReplicaSet until its pod template changes. Before the ReplicaSets' first list
   has either worked or failed, the pod waits (None), so that a target does not start under one
   workload and move to another a moment later.
4. Any other controller (StatefulSet, DaemonSet, Job, a custom resource): `<Kind>/<ns>/<name>`.

A discovery `template` that names a `workload` wins over all of this (kubernetes.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"


@dataclass(frozen=True)
class Controller:
    """The ownerReference with `controller: true`: the one object that manages this one."""

    kind: str
    name: str


def controller_of(metadata: Mapping[str, Any]) -> Controller | None:
    """The managing controller among an object's `ownerReferences` (Kubernetes allows one), or None."""
    for reference in metadata.get("ownerReferences") or ():
        if isinstance(reference, Mapping) and reference.get("controller") is True \
                and reference.get("kind") and reference.get("name"):
            return Controller(str(reference["kind"]), str(reference["name"]))
    return None


def group_of(labels: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(the LeaderWorkerSet's name, the group index) from a pod's labels, or None when they are not both there."""
    labels = labels or {}
    name, index = labels.get(LWS_NAME_LABEL), labels.get(LWS_GROUP_INDEX_LABEL)
    if not isinstance(name, str) or not name or not isinstance(index, str) or not index.isdigit():
        return None
    return name, index


@dataclass(frozen=True)
class ReplicaSets:
    """What pod discovery knows of one namespace's ReplicaSets."""

    controllers: Mapping[str, Controller | None] = field(default_factory=dict)  # name -> its controller, None: none
    listed: bool = False  # a list has worked: `controllers` is what the API server holds (or held)
    failing: bool = False  # listing or watching fails now (a 403, the API server away)

    @property
    def settled(self) -> bool:
        """Whether a ReplicaSet missing from `controllers` is known to be unreadable, not merely not listed yet."""
        return self.listed or self.failing


def pod_workload(namespace: str, pod: str, group: tuple[str, str] | None, controller: Controller | None,
                 replica_sets: ReplicaSets) -> str | None:
    """The pod's workload (the module docstring's rule), or None while its ReplicaSet is not listed yet."""
    if group is not None:
        return f"LeaderWorkerSet/{namespace}/{group[0]}/{group[1]}"
    if controller is None:
        return f"Pod/{namespace}/{pod}"
    if controller.kind != "ReplicaSet":
        return f"{controller.kind}/{namespace}/{controller.name}"
    if controller.name in replica_sets.controllers:
        owner = replica_sets.controllers[controller.name]
        return f"{owner.kind}/{namespace}/{owner.name}" if owner else f"ReplicaSet/{namespace}/{controller.name}"
    if replica_sets.settled:
        return f"ReplicaSet/{namespace}/{controller.name}"
    return None


def replica_set_controller(replica_set: Mapping[str, Any]) -> Controller | None:
    """A ReplicaSet, as the API server's JSON, as what the rule needs of it: its controller."""
    return controller_of(replica_set.get("metadata") or {})
