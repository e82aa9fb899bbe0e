"""Kubernetes pod discovery: pods listed and then watched by label selector, each Running pod with an
IP a target named `<namespace>/<pod>`.

Each namespace is followed by the one informer of `llm_vitals.kube` (shared with the node watch):
a list, then a watch from its `resourceVersion` that is resumed from the last version seen (a
bookmark's too) whenever the server ends it, and a relist after a 410 Gone, with client-go's
jittered backoff. While the API server cannot be reached the last list is kept, so no target is
lost; the error is shown in `/api/v1/discovery` and `llm_vitals_discovery_up`. A 403 names the
missing right.

Each namespace's ReplicaSets are followed by a second informer (all of them: a pod's ReplicaSet
need not match the pods' selector), so that a Deployment's pod carries `Deployment/<ns>/<name>`
as its workload (workload.py has the rule). Without the right to list them the pods are still
targets, under `ReplicaSet/<ns>/<name>`, and the 403 is shown as the source's error.

`pod_target` is the pure rule (a PodView in, a target or a skip reason out); the rest is I/O.
Readiness is not a filter: an unready pod is what the exporter is for. A pod being deleted (a
`deletionTimestamp`) is no longer a target: its server is going away on purpose.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from llm_vitals.exporter.discovery.source import Report, SourceStatus
from llm_vitals.exporter.discovery.targetset import DiscoveredTarget, build_target, pod_target_name
from llm_vitals.exporter.discovery.workload import Controller, ReplicaSets, controller_of, group_of, pod_workload, replica_set_controller
from llm_vitals.exporter.settings import ConfigError, KubernetesDiscovery, TargetSettings
from llm_vitals.kube.client import KubeClient
from llm_vitals.kube.errors import ApiError, KubeError
from llm_vitals.kube.informer import Health, Informer
from llm_vitals.kube.objects import Query

log = logging.getLogger("llm_vitals.exporter")

# No ReplicaSet listed yet (and none failing): a ReplicaSet's pod waits for the first list.
NOT_LISTED = ReplicaSets()
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class PodView:
    """What pod discovery reads of a Pod."""

    namespace: str
    name: str
    uid: str
    phase: str | None = None
    pod_ip: str | None = None
    node: str | None = None
    ports: tuple[tuple[str | None, int], ...] = ()  # every container's (name, containerPort)
    deleting: bool = False  # a deletionTimestamp is set
    group: tuple[str, str] | None = None  # its LeaderWorkerSet and group index, from its labels
    controller: Controller | None = None  # its managing owner (a ReplicaSet, a StatefulSet...)


def pod_view(pod: Mapping[str, Any]) -> PodView:
    """A Pod, as the API server's JSON, as a PodView."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    ports = tuple((port.get("name"), int(port["containerPort"]))
                  for container in spec.get("containers") or () for port in container.get("ports") or ())
    return PodView(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""), status.get("phase"),
                   status.get("podIP"), spec.get("nodeName"), ports, meta.get("deletionTimestamp") is not None,
                   group_of(meta.get("labels")), controller_of(meta))


def pod_port(pod: PodView, port: str | int) -> int | None:
    """The port to poll: a number as given, a name looked up in the pod's containers (None: no such port)."""
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    return next((number for name, number in pod.ports if name == port), None)


def pod_target(pod: PodView, config: KubernetesDiscovery, source: str, environ: Mapping[str, str],
               replica_sets: ReplicaSets = NOT_LISTED) -> tuple[DiscoveredTarget | None, str | None]:
    """(the pod's target, None), or (None, why it is not one: `<reason>: <detail>`).

    `replica_sets` is what is known of the ReplicaSets of the pod's namespace (for its workload);
    the default, nothing listed yet, holds a ReplicaSet's pod as `owner_pending`.
    """
    if pod.deleting:
        return None, "terminating: the pod is being deleted"
    if pod.phase != "Running":
        return None, f"not_running: phase {pod.phase or 'unknown'}"
    if not pod.pod_ip:
        return None, "no_ip: the pod has no IP yet"
    number = pod_port(pod, config.port)
    if number is None:
        return None, f"no_port: no container port named {config.port!r}"
    # A template's workload is the operator's word: it wins over the pod's owners.
    workload = config.template.get("workload") or pod_workload(pod.namespace, pod.name, pod.group, pod.controller,
                                                               replica_sets)
    if workload is None:
        return None, f"owner_pending: waiting for the ReplicaSets of namespace {pod.namespace} to be listed"
    host = f"[{pod.pod_ip}]" if ":" in pod.pod_ip else pod.pod_ip
    try:
        target = build_target(config.template, environ, name=pod_target_name(pod.namespace, pod.name),
                              url=f"{config.scheme}://{host}:{number}", source=source, node=pod.node,
                              namespace=pod.namespace, pod=pod.name, pod_uid=pod.uid, workload=workload)
    except ValidationError as exc:
        first = exc.errors()[0]
        return None, f"bad_target: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    except ConfigError as exc:
        return None, f"bad_target: {exc}"
    return target, None


def pod_list_error(error: KubeError, namespace: str) -> str:
    """Why pods cannot be listed or watched, in one sentence; a 401/403 names the right the exporter lacks."""
    if not isinstance(error, ApiError):
        return str(error)  # the API server cannot be reached, a kubeconfig that cannot be used
    if error.status in (401, 403):
        return (f"HTTP {error.status} listing pods in namespace {namespace}: the exporter needs list and watch "
                f"on pods there (a Role and RoleBinding, deploy/kubernetes/base/exporter.yaml)")
    return f"HTTP {error.status} {error.reason} listing pods in namespace {namespace}: {error.message}".replace("  ", " ")


def replica_set_list_error(error: KubeError, namespace: str) -> str:
    """Why ReplicaSets cannot be listed or watched, and what the pods' workload is meanwhile."""
    meanwhile = "meanwhile a pod whose ReplicaSet is not known has that ReplicaSet as its workload"
    if not isinstance(error, ApiError):
        return f"listing replicasets in namespace {namespace}: {error}; {meanwhile}"
    if error.status in (401, 403):
        return (f"HTTP {error.status} listing replicasets in namespace {namespace}: the exporter needs list and watch "
                f"on replicasets (apps) there to name a pod's Deployment (a Role and RoleBinding, "
                f"deploy/kubernetes/base/exporter.yaml); {meanwhile}")
    return (f"HTTP {error.status} {error.reason} listing replicasets in namespace {namespace}: {error.message}; "
            f"{meanwhile}").replace("  ", " ")


def own_namespace(path: Path = NAMESPACE_FILE) -> str | None:
    """The namespace of the pod the exporter runs in (its service account's), or None outside a pod."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class PodSource:
    """One `discovery: - kubernetes:` entry: an informer per namespace for its pods, one for its
    ReplicaSets (their controllers name a pod's Deployment), one report per batch of events."""

    kind = "kubernetes"

    def __init__(self, source_id: str, config: KubernetesDiscovery, environ: Mapping[str, str],
                 kube: KubeClient | None = None) -> None:
        self.id = source_id
        self.config = config
        self.environ = environ
        self.kube = kube or KubeClient(config.access)
        self.informers: dict[str, Informer[PodView]] = {}  # namespace -> its informer
        # namespace -> its ReplicaSets' informer; none when the template names the workload itself.
        self.replica_set_informers: dict[str, Informer[Controller | None]] = {}
        self.errors: dict[str, str] = {}  # namespace -> why its list or watch of pods fails now
        self.replica_set_errors: dict[str, str] = {}  # namespace -> why its list or watch of ReplicaSets fails now
        # pod target name -> (the pod, its workload as last reckoned, the target or None, the skip reason or None)
        self._built: dict[str, tuple[PodView, str | None, DiscoveredTarget | None, str | None]] = {}
        self._replica_sets_used: dict[str, set[str]] = {}  # namespace -> ReplicaSets that own a pod of ours
        self._report: Report | None = None
        self._flush_pending = False

    @property
    def pods(self) -> dict[str, dict[str, PodView]]:
        """namespace -> pod name -> the pod as last seen."""
        return {namespace: informer.objects for namespace, informer in self.informers.items()}

    @property
    def relists(self) -> int:
        """Lists after each namespace's first: after a 410 Gone or a failure."""
        return sum(informer.relists for informer in self.informers.values())

    def replica_sets(self, namespace: str) -> ReplicaSets:
        """What is known now of the ReplicaSets of `namespace`, as the workload rule reads it."""
        informer = self.replica_set_informers.get(namespace)
        if informer is None:
            return NOT_LISTED
        return ReplicaSets(informer.objects, listed=informer.synced, failing=namespace in self.replica_set_errors)

    def current(self) -> tuple[list[TargetSettings], SourceStatus]:
        """Every pod's target (namespaces, then pods, by name) and the source's status."""
        targets: list[TargetSettings] = []
        skipped: dict[str, str] = {}
        live: set[str] = set()
        pods = self.pods
        for namespace in sorted(pods):
            replica_sets = self.replica_sets(namespace)
            used = self._replica_sets_used[namespace] = set()
            for name in sorted(pods[namespace]):
                pod = pods[namespace][name]
                key = pod_target_name(namespace, name)
                live.add(key)
                if pod.controller is not None and pod.controller.kind == "ReplicaSet":
                    used.add(pod.controller.name)
                workload = pod_workload(namespace, name, pod.group, pod.controller, replica_sets)
                built = self._built.get(key)
                # Built once per change of the pod or of its workload, not per report.
                if built is None or built[0] != pod or built[1] != workload:
                    built = (pod, workload, *pod_target(pod, self.config, self.id, self.environ, replica_sets))
                    self._built[key] = built
                if built[2] is not None:
                    targets.append(built[2])
                else:
                    skipped[key] = built[3] or ""
        for gone in set(self._built) - live:
            del self._built[gone]
        errors = [why for _, why in sorted(self.errors.items())]
        errors += [why for _, why in sorted(self.replica_set_errors.items())]
        return targets, SourceStatus(self.id, self.kind, up=not errors, error="; ".join(errors) or None, skipped=skipped,
                                     relists=self.relists)

    def _changed(self, name: str | None = None) -> None:
        # Events that arrive together (a list, a burst of pods) are reported once, at the next turn of the loop.
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _replica_set_changed(self, namespace: str, name: str | None) -> None:
        # Only a ReplicaSet that owns one of our pods can change a target (a namespace's other
        # ReplicaSets, and each status update of ours, would otherwise each cost a reconcile).
        if name is None or name in self._replica_sets_used.get(namespace, ()):
            self._changed()

    def _flush(self) -> None:
        self._flush_pending = False
        if self._report is not None:
            self._report(*self.current())

    def _set_error(self, namespace: str, error: str | None, errors: dict[str, str] | None = None) -> None:
        errors = self.errors if errors is None else errors
        if errors.get(namespace) == error:
            return
        what = "pod discovery" if errors is self.errors else "reading ReplicaSets"
        if error is None:
            errors.pop(namespace, None)
            log.info(f"{what} working", extra={"fields": {"source": self.id, "namespace": namespace}})
        else:
            errors[namespace] = error
            log.warning(f"{what} failing; the pods last seen stay targets",
                        extra={"fields": {"source": self.id, "namespace": namespace, "error": error}})
        self._changed()

    def _health(self, namespace: str, health: Health) -> None:
        self._set_error(namespace, None if health.up or health.error is None else pod_list_error(health.error, namespace))

    def _replica_set_health(self, namespace: str, health: Health) -> None:
        error = None if health.up or health.error is None else replica_set_list_error(health.error, namespace)
        self._set_error(namespace, error, self.replica_set_errors)

    async def run(self, report: Report) -> None:
        self._report = report
        namespaces = self.config.namespaces or [ns for ns in [own_namespace()] if ns]
        if not namespaces:
            self.errors["-"] = "no namespaces given, and not running in a pod: set discovery[].kubernetes.namespaces"
            report(*self.current())
            await asyncio.Event().wait()  # nothing to watch until a reload fixes the config
        for namespace in namespaces:
            self.informers[namespace] = Informer(
                self.kube, Query("pods", namespace, self.config.selector), pod_view, self._changed,
                on_health=partial(self._health, namespace))
            if "workload" not in self.config.template:
                self.replica_set_informers[namespace] = Informer(
                    self.kube, Query("replicasets", namespace), replica_set_controller,
                    partial(self._replica_set_changed, namespace), on_health=partial(self._replica_set_health, namespace))
        try:
            runs = [informer.run() for informer in self.informers.values()]
            runs += [informer.run() for informer in self.replica_set_informers.values()]
            await asyncio.gather(*runs)
        finally:
            await self.kube.close()
