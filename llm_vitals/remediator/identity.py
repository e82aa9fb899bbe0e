"""Whose pod is it: the remediator's own check of a target's pod, and its own reading of the workload.

The exporter's answer names a pod (namespace, name, UID, node) and a workload, but a file_sd
writer can set every one of those as a label, UID included: a name someone else wrote is a hint,
not an identity. So before the gate decides on a target that names a pod, the remediator reads
that pod from the API server by namespace and name (`pods.IdentityReader`, the edge), and this
module decides (pure, plain dicts in):

- the pod must be there, with the UID the exporter saw, an IP that is the host of the target's
  address (what was polled is this pod), and the node the exporter named (if it named one);
  anything else is `identity_mismatch`, with both sides in the detail;
- the workload is read from the pod itself, never taken from the exporter: the LeaderWorkerSet
  labels, else the pod's owner (the `controller: true` reference, else the first one), and for a
  ReplicaSet its own owner, read from the API server (a Deployment, a Rollout, ...). A pod with no
  owner references at all is its own workload, `Pod/<ns>/<name>` (nothing recreates it, so its
  name is stable). An owner that cannot be read now is `owner_pending`: never a guess, never the
  pod's name, never a ReplicaSet's name that the next rollout changes.

What is verified replaces the exporter's words in the status the gate decides on (`verified`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from llm_vitals.kube.owners import controller_of, group_of, replica_set_to_resolve, workload_name

from .gate import Decision
from .model import TargetStatus


@dataclass(frozen=True)
class Owner:
    """An object to read to resolve a workload: its kind and name, in the pod's namespace."""

    kind: str
    name: str


def owner_to_read(pod: Mapping[str, Any]) -> Owner | None:
    """The owner whose own owner names the workload (a ReplicaSet), or None when the pod alone says it."""
    metadata = pod.get("metadata") or {}
    replica_set = replica_set_to_resolve(group_of(metadata.get("labels")), controller_of(metadata))
    return Owner("ReplicaSet", replica_set) if replica_set is not None else None


class OwnerPending(Exception):
    """The workload cannot be told now (an owner not readable): refused `owner_pending`."""


def workload_of_pod(pod: Mapping[str, Any], owner: Mapping[str, Any] | None) -> str:
    """The pod's workload from its labels and owners (the module docstring's rule).

    `owner` is the object `owner_to_read` named, as read (None: it could not be read, or there is
    none to read). Raises OwnerPending when the rule needs an owner it has not got."""
    metadata = pod.get("metadata") or {}
    namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
    group, controller = group_of(metadata.get("labels")), controller_of(metadata)
    if group is None and controller is None and metadata.get("ownerReferences"):
        raise OwnerPending(f"pod {namespace}/{name} has owner references without a kind and a name")
    replica_set = replica_set_to_resolve(group, controller)
    if replica_set is None:
        return workload_name(namespace, name, group, controller)
    if owner is None:
        raise OwnerPending(f"ReplicaSet {namespace}/{replica_set} (the owner of pod {name}) cannot be read now")
    owner_meta = owner.get("metadata") or {}
    if owner_meta.get("name") != replica_set:
        raise OwnerPending(f"read ReplicaSet {owner_meta.get('name')!r}, not {replica_set!r}")
    above = controller_of(owner_meta)
    if above is None and owner_meta.get("ownerReferences"):
        raise OwnerPending(f"ReplicaSet {namespace}/{replica_set} has owner references without a kind and a name")
    # `above` None: a bare ReplicaSet is the workload itself (no rollout renames it).
    return workload_name(namespace, name, group, controller, above)


def pod_ips(pod: Mapping[str, Any]) -> frozenset[str]:
    """Every IP the API server gives the pod (status.podIP and status.podIPs), normalised."""
    status = pod.get("status") or {}
    found = [status.get("podIP"), *((entry or {}).get("ip") for entry in status.get("podIPs") or ())]
    return frozenset(ip for ip in (_normal_ip(str(x)) for x in found if x) if ip is not None)


def _normal_ip(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def address_host(url: str | None) -> str | None:
    """The host of a target's address as an IP, or None when it is not one (a name proves nothing)."""
    if not url:
        return None
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return None
    return _normal_ip(host) if host else None


def mismatches(status: TargetStatus, pod: Mapping[str, Any]) -> list[str]:
    """How the pod the API server holds differs from what the exporter said of it: empty when it is the same."""
    metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    found: list[str] = []
    uid = metadata.get("uid")
    if not status.pod_uid or uid != status.pod_uid:
        found.append(f"uid: exporter {status.pod_uid!r}, API server {uid!r}")
    ips, host = pod_ips(pod), address_host(status.url)
    if host is None or host not in ips:
        found.append(f"address: exporter {status.url!r}, API server pod IPs {sorted(ips)}")
    node = spec.get("nodeName")
    if status.node and status.node != node:
        found.append(f"node: exporter {status.node!r}, API server {node!r}")
    return found


@dataclass(frozen=True)
class Checked:
    """The identity check's outcome: the status to decide on, or the refusal."""

    status: TargetStatus | None
    refusal: Decision | None = None


def verified(status: TargetStatus, pod: Mapping[str, Any] | None, owner: Mapping[str, Any] | None) -> Checked:
    """The status with the pod's UID, node and workload as the API server says them, or a refusal.

    `pod` is the pod read by the exporter's namespace and name (None: the API server has none of
    that name); `owner` is what `owner_to_read` named, as read (None if not readable)."""
    where = f"pod {status.namespace}/{status.pod}"
    if pod is None:
        return Checked(None, Decision(False, "identity_mismatch", f"{where}: the API server has no such pod"
                                                                  f" (the exporter says uid {status.pod_uid!r})"))
    wrong = mismatches(status, pod)
    if wrong:
        return Checked(None, Decision(False, "identity_mismatch", f"{where} is not the target's: " + "; ".join(wrong)))
    try:
        workload = workload_of_pod(pod, owner)
    except OwnerPending as exc:
        return Checked(None, Decision(False, "owner_pending", f"{where}: {exc}; its workload is not guessed"))
    node = (pod.get("spec") or {}).get("nodeName") or None
    return Checked(replace(status, workload=workload, node=node, pod_uid=(pod.get("metadata") or {}).get("uid")))


def names_a_pod(status: TargetStatus | None) -> bool:
    """Whether the exporter's answer names a pod (or a part of one) the remediator could act on."""
    return status is not None and bool(status.pod or status.namespace or status.pod_uid)
