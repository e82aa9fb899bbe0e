"""A pod's workload: what the operator owns and a restart does not replace, read from the pod's
labels and owners. The remediator's budget, circuit and restart-loop alert key on it, so that a
Deployment whose new pods keep hanging is counted once, across pod names.

The rule, first match wins (`pod_workload`, pure; tests/test_discovery_workload.py is its table; the
names are written by `workload_name` in llm_vitals/kube/owners.py, the remediator's rule too):

1. The LeaderWorkerSet labels `leaderworkerset.sigs.k8s.io/name` and `.../group-index` (a number):
   `LeaderWorkerSet/<ns>/<name>/<group-index>`. A group (its leader and workers) is one workload,
   as LeaderWorkerSet restarts it as one unit; these labels win over the owners (each group's pods
   are owned by StatefulSets of their own).
2. No ownerReferences (a bare pod): `Pod/<ns>/<pod>`, its own workload. Nothing recreates it, so
   its name is as stable as anything it has. References without `controller: true` name the
   owner by the first of them (llm_vitals/kube/owners.py), never the pod.
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

# The owner and workload rule is shared with the remediator, which reads the workload itself (llm_vitals/kube/owners.py).
from llm_vitals.kube.owners import (
    LWS_GROUP_INDEX_LABEL,
    LWS_NAME_LABEL,
    Controller,
    controller_of,
    group_of,
    replica_set_to_resolve,
    workload_name,
)

__all__ = ["LWS_GROUP_INDEX_LABEL", "LWS_NAME_LABEL", "Controller", "ReplicaSets", "controller_of", "group_of",
           "pod_workload", "replica_set_controller"]


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
    replica_set = replica_set_to_resolve(group, controller)
    if replica_set is not None and replica_set not in replica_sets.controllers and not replica_sets.settled:
        return None
    owner = replica_sets.controllers.get(replica_set) if replica_set is not None else None
    return workload_name(namespace, pod, group, controller, owner)


def replica_set_controller(replica_set: Mapping[str, Any]) -> Controller | None:
    """A ReplicaSet, as the API server's JSON, as what the rule needs of it: its controller."""
    return controller_of(replica_set.get("metadata") or {})
