"""Kubernetes actions on one target's own pod: the exact restart, the GPU move, and Events.

The pod is the one the exporter named (namespace, name and the UID it saw), never one from the
alert. The delete carries a UID precondition, so a pod recreated under the same name since is
never hit. Every action and every refusal a human must see is also an Event on the pod (and on
the node for a GPU move), so `kubectl describe pod` tells the story.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from llm_vitals.kube.client import KubeClient
from llm_vitals.kube.errors import ApiError, KubeError
from llm_vitals.kube.objects import create_event, get_node, merge_patch_node
from llm_vitals.kube.objects import delete_pod as delete_pod_object
from llm_vitals.kube.times import micro_time
from llm_vitals.logs import log_event

from .executors import ExecResult

log = logging.getLogger("llm_vitals.remediator.kubernetes")

COMPONENT = "llm-vitals-remediator"
GPU_TAINT_KEY = "llm-vitals/gpu-fault"
CORDONED_BY = "llm-vitals.io/cordoned-by"
CORDONED_AT = "llm-vitals.io/cordoned-at"
CORDON_REASON = "llm-vitals.io/gpu-fault-detail"
# Event reasons, one per thing that happened (CamelCase, as Kubernetes' own).
EVENT_REASONS = {
    "allowed": "LLMVitalsRestart",
    "cordon_and_move": "LLMVitalsGpuMove",
    "gpu_fault": "LLMVitalsGpuFault",
    "circuit_open": "LLMVitalsCircuitOpen",
    "fleet_gate": "LLMVitalsFleetGate",
}


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str | None
    node: str | None = None


# What this component's Event names carry after the involved object's name (`vllm-0.llm-vitals-...`).
EVENT_NAME_MARK = ".llm-vitals-"


def refusal_event_name(pod: str, uid: str | None, reason: str, alert_key: tuple[str, float]) -> str:
    """The one Event name for this pod, refusal and alert (fingerprint, startsAt): a DNS subdomain."""
    digest = hashlib.sha256(json.dumps([uid or "", reason, *alert_key]).encode()).hexdigest()[:16]
    suffix = f"{EVENT_NAME_MARK}{digest}"
    # A pod name is a DNS subdomain already; cut, it must still end in an alphanumeric.
    return pod[: 253 - len(suffix)].rstrip("-.") + suffix


async def record_event(
    client: KubeClient, involved: dict[str, Any], namespace: str, reason: str, message: str, kind: str, identity: str,
    name: str | None = None,
) -> bool:
    """Create one Event about `involved`; a failure is logged and never fails the caller.

    With `name`, an Event of that name already there (409: another replica's, or this one's before
    a restart) counts as recorded: the name is what makes copies of one Event one object.
    """
    now = micro_time(time.time())
    naming = {"name": name} if name else {"generateName": f"{involved['name']}{EVENT_NAME_MARK}"}
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {**naming, "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1024],
        "type": kind,
        "source": {"component": COMPONENT, "host": identity},
        "reportingComponent": COMPONENT,
        "reportingInstance": identity[:128],
        "firstTimestamp": now[:19] + "Z",
        "lastTimestamp": now[:19] + "Z",
        "count": 1,
    }
    try:
        await create_event(client, namespace, body)
    except ApiError as exc:
        if name and exc.status == 409:
            log_event(log, "Event already recorded", level=logging.DEBUG, reason=reason, event=name)
            return True
        log_event(log, "cannot record an Event", level=logging.WARNING, reason=reason, status=exc.status, error=exc.message)
        return False
    except KubeError as exc:
        log_event(log, "cannot record an Event", level=logging.WARNING, reason=reason, error=str(exc))
        return False
    return True


def pod_object(pod: PodRef) -> dict[str, Any]:
    found = {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name}
    return found | ({"uid": pod.uid} if pod.uid else {})


async def pod_event(
    client: KubeClient, pod: PodRef, reason_word: str, message: str, identity: str, name: str | None = None
) -> bool:
    """Record an Event on the pod for `reason_word` (a Warning unless a restart was allowed)."""
    kind = "Normal" if reason_word == "allowed" else "Warning"
    return await record_event(client, pod_object(pod), pod.namespace, EVENT_REASONS[reason_word], message, kind,
                              identity, name)


async def delete_pod(client: KubeClient, pod: PodRef) -> ExecResult:
    """DELETE the pod by name with a UID precondition; its controller makes a new one."""
    where = f"pod {pod.namespace}/{pod.name}"
    try:
        await delete_pod_object(client, pod.namespace, pod.name, pod.uid)
    except ApiError as exc:
        if exc.status == 404:
            return ExecResult("error", f"{where} is gone already; nothing deleted")
        if exc.status == 409:
            # The precondition failed: the name now belongs to a newer pod, which the alert is not about.
            return ExecResult("error", f"{where} has another UID than {pod.uid} now (recreated); nothing deleted")
        return ExecResult("error", f"delete {where}: {exc}")
    except KubeError as exc:
        return ExecResult("error", f"delete {where}: {exc}")
    return ExecResult("ok", f"deleted {where}" + (f" (uid {pod.uid})" if pod.uid else ""))


class PodExecutor:
    """Restart = delete the target's own pod (name + UID), then an Event on it."""

    kind = "kubernetes_pod"

    def __init__(self, client: KubeClient, pod: PodRef, identity: str, message: str, timeout: float):
        self.client = client
        self.pod = pod
        self.identity = identity
        self.message = message
        self.timeout = timeout

    async def restart(self) -> ExecResult:
        try:
            async with asyncio.timeout(self.timeout):
                result = await delete_pod(self.client, self.pod)
                if result.result == "ok":
                    await pod_event(self.client, self.pod, "allowed", self.message, self.identity)
        except TimeoutError:
            return ExecResult("timeout", f"pod {self.pod.namespace}/{self.pod.name}: not done within {self.timeout:g}s")
        return result


def taint_value(detail: str) -> str:
    """The fault's reason as a taint value (a label value: 63 chars of [A-Za-z0-9_.-], alphanumeric ends)."""
    word = re.sub(r"[^A-Za-z0-9_.-]+", "-", detail.split(":", 1)[0].strip())[:63].strip("-_.")
    return word or "GpuFault"


class CordonAndMoveExecutor:
    """GPU fault: cordon and taint the node (marked as ours), Event on it, delete the pod, Event on it.

    A node already cordoned by someone else is left exactly as it is (no taint, no mark): llm-vitals
    never changes, and never uncordons, what it did not cordon. Every step is in the result's detail.
    """

    kind = "cordon_and_move"

    def __init__(self, client: KubeClient, pod: PodRef, identity: str, fault: str, timeout: float):
        assert pod.node is not None
        self.client = client
        self.pod = pod
        self.node = pod.node
        self.identity = identity
        self.fault = fault or "GPU fault"
        self.timeout = timeout

    async def restart(self) -> ExecResult:
        steps: list[str] = []
        try:
            async with asyncio.timeout(self.timeout):
                return await self._move(steps)
        except TimeoutError:
            return ExecResult("timeout", "; ".join([*steps, f"not done within {self.timeout:g}s"]))

    async def _move(self, steps: list[str]) -> ExecResult:
        node_result = await self._cordon(steps)
        if node_result is not None:
            return ExecResult("error", "; ".join([*steps, node_result]))
        node = {"apiVersion": "v1", "kind": "Node", "name": self.node}
        message = f"GPU fault ({self.fault}): moving pod {self.pod.namespace}/{self.pod.name} off this node"
        if await record_event(self.client, node, "default", EVENT_REASONS["cordon_and_move"], message, "Warning",
                              self.identity):
            steps.append("Event on the node")
        deleted = await delete_pod(self.client, self.pod)
        steps.append(deleted.detail)
        if deleted.result == "ok":
            note = f"GPU fault on node {self.node} ({self.fault}): node cordoned, pod deleted to move it"
            if await pod_event(self.client, self.pod, "cordon_and_move", note, self.identity):
                steps.append("Event on the pod")
        return ExecResult(deleted.result, "; ".join(steps))

    async def _cordon(self, steps: list[str]) -> str | None:
        """Cordon and taint the node with a resourceVersion precondition; None when done (or left alone)."""
        for _ in range(5):
            try:
                node = await get_node(self.client, self.node)
                spec, meta = node.get("spec") or {}, node["metadata"]
                annotations = meta.get("annotations") or {}
                if spec.get("unschedulable") and CORDONED_BY not in annotations:
                    steps.append(f"node {self.node} was cordoned by someone else: left alone")
                    return None
                taints = [t for t in spec.get("taints") or [] if t.get("key") != GPU_TAINT_KEY]
                taints.append({"key": GPU_TAINT_KEY, "value": taint_value(self.fault), "effect": "NoSchedule"})
                patch = {
                    "metadata": {
                        "resourceVersion": meta["resourceVersion"],
                        "annotations": {CORDONED_BY: self.identity, CORDONED_AT: micro_time(time.time()),
                                        CORDON_REASON: self.fault[:1024]},
                    },
                    "spec": {"unschedulable": True, "taints": taints},
                }
            except ApiError as exc:
                return f"read node {self.node}: {exc}"
            except KubeError as exc:
                return f"node {self.node}: {exc}"
            except (KeyError, TypeError, AttributeError) as exc:
                return f"node {self.node}: unexpected answer ({type(exc).__name__})"
            try:
                await merge_patch_node(self.client, self.node, patch)
            except ApiError as exc:
                if exc.status == 409:
                    continue  # the node changed meanwhile (its status, another controller): read it again
                return f"cordon node {self.node}: {exc}"
            except KubeError as exc:
                return f"node {self.node}: {exc}"
            steps.append(f"node {self.node} cordoned and tainted {GPU_TAINT_KEY}={taint_value(self.fault)}:NoSchedule,"
                         f" marked {CORDONED_BY}={self.identity}")
            return None
        return f"node {self.node}: still conflicting after 5 tries; not cordoned"
