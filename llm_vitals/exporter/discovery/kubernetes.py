"""Kubernetes pod discovery: pods listed and then watched by label selector, each Running pod with an
IP a target named `<namespace>/<pod>`.

The client is kubernetes-asyncio (llm_vitals/exporter/kube.py, shared with the node watch): a maintained
asyncio port of the official client, on the aiohttp the exporter already runs, with list/watch,
`resourceVersion` and in-cluster config built in.

Per namespace, one list and then one watch from the list's `resourceVersion`; a watch that ends (the
server's timeout, a lost connection, a restarted API server) resumes from the last
`resourceVersion` seen, and a 410 Gone (that version compacted away) relists. While the API server
cannot be reached the last list is kept, so no target is lost; the error is shown in
`/api/v1/discovery` and `llm_vitals_discovery_up`. A 403 names the missing right.

`pod_target` is the pure rule (a PodView in, a target or a skip reason out); the rest is I/O.
Readiness is not a filter: an unready pod is what the exporter is for. A pod being deleted (a
`deletionTimestamp`) is no longer a target: its server is going away on purpose.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from llm_vitals.exporter.discovery.manager import Report, SourceStatus
from llm_vitals.exporter.discovery.targetset import DiscoveredTarget, build_target
from llm_vitals.exporter.kube import KubeConfigError, api_client
from llm_vitals.exporter.settings import ConfigError, KubernetesDiscovery, TargetSettings

log = logging.getLogger("llm_vitals.exporter")

WATCH_SECONDS = 300  # the server ends each watch after this; it is resumed from the last resourceVersion
BACKOFF_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
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


def pod_view(pod: Any) -> PodView:
    """A kubernetes-asyncio V1Pod (or its JSON dict) as a PodView."""
    if isinstance(pod, Mapping):
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        ports = tuple((port.get("name"), int(port["containerPort"]))
                      for container in spec.get("containers") or () for port in container.get("ports") or ())
        return PodView(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""), status.get("phase"),
                       status.get("podIP"), spec.get("nodeName"), ports, meta.get("deletionTimestamp") is not None)
    meta, spec, status = pod.metadata, pod.spec, pod.status
    ports = tuple((port.name, int(port.container_port))
                  for container in ((spec.containers or []) if spec else []) for port in (container.ports or []))
    return PodView(meta.namespace, meta.name, meta.uid, status.phase if status else None,
                   status.pod_ip if status else None, spec.node_name if spec else None, ports,
                   meta.deletion_timestamp is not None)


def pod_port(pod: PodView, port: str | int) -> int | None:
    """The port to poll: a number as given, a name looked up in the pod's containers (None: no such port)."""
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    return next((number for name, number in pod.ports if name == port), None)


def pod_target(pod: PodView, config: KubernetesDiscovery, source: str,
               environ: Mapping[str, str]) -> tuple[DiscoveredTarget | None, str | None]:
    """(the pod's target, None), or (None, why it is not one: `<reason>: <detail>`)."""
    if pod.deleting:
        return None, "terminating: the pod is being deleted"
    if pod.phase != "Running":
        return None, f"not_running: phase {pod.phase or 'unknown'}"
    if not pod.pod_ip:
        return None, "no_ip: the pod has no IP yet"
    number = pod_port(pod, config.port)
    if number is None:
        return None, f"no_port: no container port named {config.port!r}"
    host = f"[{pod.pod_ip}]" if ":" in pod.pod_ip else pod.pod_ip
    try:
        target = build_target(config.template, environ, name=f"{pod.namespace}/{pod.name}",
                              url=f"{config.scheme}://{host}:{number}", source=source, node=pod.node,
                              namespace=pod.namespace, pod=pod.name, pod_uid=pod.uid)
    except ValidationError as exc:
        first = exc.errors()[0]
        return None, f"bad_target: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    except ConfigError as exc:
        return None, f"bad_target: {exc}"
    return target, None


def api_error(exc: ApiException, namespace: str) -> str:
    """An API answer as one sentence; a 401/403 names the right the exporter lacks."""
    if exc.status in (401, 403):
        return (f"HTTP {exc.status} listing pods in namespace {namespace}: the exporter needs list and watch "
                f"on pods there (a Role and RoleBinding, deploy/kubernetes/base/exporter.yaml)")
    return f"HTTP {exc.status} {exc.reason or ''} listing pods in namespace {namespace}".replace("  ", " ")


def own_namespace(path: Path = NAMESPACE_FILE) -> str | None:
    """The namespace of the pod the exporter runs in (its service account's), or None outside a pod."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class PodSource:
    """One `discovery: - kubernetes:` entry: a list-then-watch per namespace, one report per batch of events."""

    kind = "kubernetes"

    def __init__(self, source_id: str, config: KubernetesDiscovery, environ: Mapping[str, str],
                 api: Callable[[], Awaitable[client.ApiClient]] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, request_timeout: float = 30.0) -> None:
        self.id = source_id
        self.config = config
        self.environ = environ
        self.api = api or (lambda: api_client(config.kubeconfig))
        self.sleep = sleep
        self.request_timeout = request_timeout
        self.pods: dict[str, dict[str, PodView]] = {}  # namespace -> pod name -> as last seen
        self.errors: dict[str, str] = {}  # namespace -> why its list or watch fails now
        self.relists = 0  # lists after a namespace's first: 410 Gone (compacted)
        self._built: dict[str, tuple[PodView, DiscoveredTarget | None, str | None]] = {}
        self._report: Report | None = None
        self._flush_pending = False

    def current(self) -> tuple[list[TargetSettings], SourceStatus]:
        """Every pod's target (namespaces, then pods, by name) and the source's status."""
        targets: list[TargetSettings] = []
        skipped: dict[str, str] = {}
        live: set[str] = set()
        for namespace in sorted(self.pods):
            for name in sorted(self.pods[namespace]):
                pod = self.pods[namespace][name]
                key = f"{namespace}/{name}"
                live.add(key)
                built = self._built.get(key)
                if built is None or built[0] != pod:  # built once per change of the pod, not per report
                    built = (pod, *pod_target(pod, self.config, self.id, self.environ))
                    self._built[key] = built
                if built[1] is not None:
                    targets.append(built[1])
                else:
                    skipped[key] = built[2] or ""
        for gone in set(self._built) - live:
            del self._built[gone]
        error = "; ".join(why for _, why in sorted(self.errors.items())) or None
        return targets, SourceStatus(self.id, self.kind, up=not self.errors, error=error, skipped=skipped,
                                     relists=self.relists)

    def _changed(self) -> None:
        # Events that arrive together (a list, a burst of pods) are reported once, at the next turn of the loop.
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        if self._report is not None:
            self._report(*self.current())

    def _set_error(self, namespace: str, error: str | None) -> None:
        if self.errors.get(namespace) == error:
            return
        if error is None:
            self.errors.pop(namespace, None)
            log.info("pod discovery working", extra={"fields": {"source": self.id, "namespace": namespace}})
        else:
            self.errors[namespace] = error
            log.warning("pod discovery failing; the pods last seen stay targets",
                        extra={"fields": {"source": self.id, "namespace": namespace, "error": error}})
        self._changed()

    async def run(self, report: Report) -> None:
        self._report = report
        namespaces = self.config.namespaces or [ns for ns in [own_namespace()] if ns]
        if not namespaces:
            self.errors["-"] = "no namespaces given, and not running in a pod: set discovery[].kubernetes.namespaces"
            report(*self.current())
            await asyncio.Event().wait()  # nothing to watch until a reload fixes the config
        api: client.ApiClient | None = None
        try:
            while api is None:
                try:
                    api = await self.api()
                except KubeConfigError as exc:
                    for namespace in namespaces:
                        self._set_error(namespace, str(exc))
                    await self.sleep(BACKOFF_SECONDS[-1])
            core = client.CoreV1Api(api)
            await asyncio.gather(*(self._watch_namespace(core, namespace) for namespace in namespaces))
        finally:
            if api is not None:
                await api.close()

    async def _watch_namespace(self, core: client.CoreV1Api, namespace: str) -> None:
        """Until cancelled: list, watch, resume, relist on 410; API trouble is kept as the error, never raised."""
        resource_version: str | None = None
        listed_once = False
        failures = 0
        while True:
            try:
                if resource_version is None:
                    listed = await core.list_namespaced_pod(namespace, label_selector=self.config.selector,
                                                            _request_timeout=self.request_timeout)
                    self.relists += listed_once
                    listed_once = True
                    self.pods[namespace] = {item.metadata.name: pod_view(item) for item in listed.items}
                    resource_version = listed.metadata.resource_version
                    self._set_error(namespace, None)
                    self._changed()
                stream = watch.Watch()
                async with stream.stream(core.list_namespaced_pod, namespace, label_selector=self.config.selector,
                                         resource_version=resource_version, timeout_seconds=WATCH_SECONDS,
                                         allow_watch_bookmarks=True,
                                         _request_timeout=WATCH_SECONDS + self.request_timeout) as events:
                    async for event in events:
                        kind, pod = event["type"], event["object"]
                        resource_version = pod.metadata.resource_version
                        failures = 0
                        self._set_error(namespace, None)
                        if kind == "BOOKMARK":
                            continue
                        pods = self.pods.setdefault(namespace, {})
                        if kind == "DELETED":
                            pods.pop(pod.metadata.name, None)
                        else:
                            pods[pod.metadata.name] = pod_view(pod)
                        self._changed()
                continue  # the server ended the watch: resume from resource_version
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status == 410:
                    log.info("pod watch expired (410 Gone): relisting",
                             extra={"fields": {"source": self.id, "namespace": namespace}})
                    resource_version = None
                    continue
                error = api_error(exc, namespace)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                error = f"the API server cannot be reached: {type(exc).__name__}: {exc}"[:300]
            except Exception as exc:  # a bug here must not end discovery for good
                log.exception("pod discovery failed unexpectedly", extra={"fields": {"source": self.id}})
                error = f"pod discovery failed: {type(exc).__name__}"
            self._set_error(namespace, error)
            await self.sleep(BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)])
            failures += 1
