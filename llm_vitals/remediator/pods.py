"""Kubernetes actions on a target's own pod (or its group): the restart, the move off a node, and Events.

The pod is the one the exporter named (namespace, name and the UID it saw), never one from the
alert, and it is acted on only by UID: an eviction or a delete carries the UID as its precondition,
so a pod recreated under the same name since is never hit, and a pod without a UID is never acted
on at all (the gate refuses it, `no_pod_uid`).

- `pod_action: evict` (the default) goes through the Eviction API (`policy/v1`, or `policy/v1beta1`
  on 1.20-1.21, found once), which respects PodDisruptionBudgets: a budget that forbids it is a 429,
  nothing is deleted, and the restart is refused (`ExecResult.refused = "disruption_budget"`: the
  gate's decision is taken back, so that Alertmanager's next re-send is judged afresh).
  `pod_action: delete` deletes the pod, as kubectl delete does.
- A LeaderWorkerSet group is restarted as a whole: every pod of the group, listed by its labels,
  each by its UID (as LWS's RecreateGroupOnRestart does).
- `cordon_and_move` cordons and taints the node (marked as llm-vitals'), then moves the pod.

Every action and every refusal a human must see is also an Event on the pod (and on the node for a
move), so `kubectl describe pod` tells the story. An Event has its own short timeout, apart from
the action's: a slow or failing Event POST never changes what the action's outcome was.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from llm_vitals.kube.client import KubeClient
from llm_vitals.kube.errors import ApiError, KubeError
from llm_vitals.kube.evictions import PodRef, PodRemover, Sweep
from llm_vitals.kube.objects import create_event, get_node, get_pod, get_replica_set, list_pods, merge_patch_node
from llm_vitals.kube.times import micro_time
from llm_vitals.logs import log_event

from . import identity
from .executors import ExecResult
from .gate import Decision, Group, TargetStatus, taint_value

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
    "escalated_to_human": "LLMVitalsEscalated",
    "disruption_budget": "LLMVitalsDisruptionBudget",
    "cordon_limit": "LLMVitalsCordonLimit",
}
# An Event POST's own limit: short, and apart from the restart's (a completed eviction must never
# be journaled as a timeout because its Event was slow).
EVENT_TIMEOUT_SECONDS = 5.0


def notes_seconds() -> float:
    """How long all the Events of one action may take together, after its outcome (a group's one per
    pod, a move's two): the restart's claim covers this too (acting.Actor.claim)."""
    return 2 * (EVENT_TIMEOUT_SECONDS + 1.0)


async def within_notes(*events: Coroutine[Any, Any, bool]) -> list[bool]:
    """Send `events` one after another within `notes_seconds()`; those left when it is over are dropped
    (logged). Returns which were recorded."""
    recorded: list[bool] = []
    pending = list(events)
    try:
        async with asyncio.timeout(notes_seconds()):
            while pending:
                recorded.append(await pending.pop(0))
    except TimeoutError:
        log_event(log, "Events not recorded: the action's time for its notes is over", level=logging.WARNING,
                  dropped=len(pending) + 1)
    for event in pending:
        event.close()
    return recorded + [False] * (len(events) - len(recorded))


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
    name: str | None = None, timeout: float | None = None,
) -> bool:
    """Create one Event about `involved` within `timeout` (EVENT_TIMEOUT_SECONDS); any failure is logged, never raised.

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
    limit = EVENT_TIMEOUT_SECONDS if timeout is None else timeout
    try:
        async with asyncio.timeout(limit + 1.0):  # the request's own limit, and a bound on connecting too
            await create_event(client, namespace, body, limit)
    except ApiError as exc:
        if name and exc.status == 409:
            log_event(log, "Event already recorded", level=logging.DEBUG, reason=reason, event=name)
            return True
        log_event(log, "cannot record an Event", level=logging.WARNING, reason=reason, status=exc.status, error=exc.message)
        return False
    except (KubeError, TimeoutError) as exc:
        log_event(log, "cannot record an Event", level=logging.WARNING, reason=reason,
                  error=str(exc) or f"not recorded within {limit:g}s")
        return False
    except Exception:  # an Event is a note: whatever goes wrong with it never fails the action it tells of
        log.exception("cannot record an Event")
        return False
    return True


def pod_object(pod: PodRef) -> dict[str, Any]:
    found = {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name}
    return found | ({"uid": pod.uid} if pod.uid else {})


async def pod_event(
    client: KubeClient, pod: PodRef, reason_word: str, message: str, identity: str, name: str | None = None
) -> bool:
    """Record an Event on the pod for `reason_word` (a Warning unless a restart was allowed); never raises."""
    kind = "Normal" if reason_word == "allowed" else "Warning"
    return await record_event(client, pod_object(pod), pod.namespace, EVENT_REASONS[reason_word], message, kind,
                              identity, name)


@dataclass(eq=False)
class PodExecutor:
    """Restart = evict (or delete) the target's own pod by UID, then an Event on it (its own timeout)."""

    kind = "kubernetes_pod"

    remover: PodRemover
    pod: PodRef
    identity: str
    message: str
    timeout: float

    async def restart(self) -> ExecResult:
        try:
            async with asyncio.timeout(self.timeout):
                removal = await self.remover.remove(self.pod)
        except TimeoutError:
            return ExecResult("timeout", f"pod {self.pod.namespace}/{self.pod.name}: not done within {self.timeout:g}s")
        if removal.refused is not None:
            return ExecResult("error", removal.detail, refused=removal.refused)
        if not removal.done:
            return ExecResult("error", removal.detail)
        # After the outcome is settled: the Event is a note on it, never a cause of another outcome.
        if not await pod_event(self.remover.client, self.pod, "allowed", self.message, self.identity):
            return ExecResult("ok", f"{removal.detail}; its Event was not recorded")
        return ExecResult("ok", removal.detail)


@dataclass(eq=False)
class GroupExecutor:
    """Restart a LeaderWorkerSet group as one: every pod of the group, listed by its labels, each by UID.

    The target's own pod must be among them (else the group was recreated since: nothing is done).
    A PodDisruptionBudget that refuses the first pod's eviction refuses the restart (nothing done);
    one that refuses a later pod ends it as an error naming what was done."""

    kind = "kubernetes_group"

    remover: PodRemover
    group: Group
    pod: PodRef
    identity: str
    message: str
    timeout: float

    async def restart(self) -> ExecResult:
        sweep = Sweep()
        steps: list[str] = []
        try:
            async with asyncio.timeout(self.timeout):
                result = await self._restart(sweep, steps)
        except TimeoutError:
            said = [removal.detail for _, removal in sweep.passed]
            result = ExecResult("timeout", "; ".join([*steps, *said, f"not done within {self.timeout:g}s"]))
        # After the outcome: an Event never changes it; all of them within the notes' time.
        await within_notes(*(pod_event(self.remover.client, pod, "allowed", self.message, self.identity)
                             for pod in sweep.removed))
        return result

    async def _restart(self, sweep: Sweep, steps: list[str]) -> ExecResult:
        where = f"group {self.group.name}/{self.group.index} in {self.group.namespace}"
        try:
            listed = await list_pods(self.remover.client, self.group.namespace, self.group.selector)
            pods = sorted((PodRef(self.group.namespace, item["metadata"]["name"], item["metadata"].get("uid"),
                                  (item.get("spec") or {}).get("nodeName"))
                           for item in listed if not item["metadata"].get("deletionTimestamp")),
                          key=lambda p: p.name)
        except KubeError as exc:
            return ExecResult("error", f"list the pods of {where}: {exc}; nothing done")
        except (KeyError, TypeError) as exc:
            return ExecResult("error", f"list the pods of {where}: unexpected answer ({type(exc).__name__}); nothing done")
        if self.pod.uid not in {p.uid for p in pods}:
            return ExecResult("error", f"pod {self.pod.name} (uid {self.pod.uid}) is no longer in {where} (recreated"
                                       " since?); nothing done")
        steps.append(f"{where}: {len(pods)} pods")
        await self.remover.remove_each(pods, sweep)
        said = [*steps, *(removal.detail for _, removal in sweep.passed)]
        if sweep.stopped is None:
            return ExecResult("ok", "; ".join(said))
        return ExecResult("error", "; ".join([*said, sweep.stopped.detail]), refused=sweep.refused)


class CordonAndMoveExecutor:
    """Cordon and taint the node (marked as ours), Event on it, move the pod (evict or delete by UID),
    Event on it. For a GPU fault, or the escalation ladder's second step.

    A node already cordoned by someone else is left exactly as it is (no taint, no mark): llm-vitals
    never changes, and never uncordons, what it did not cordon. Only a cordon that succeeded names
    its node in the result (`cordoned`): only then is the node marked as escalated. Every step is in
    the result's detail.
    """

    kind = "cordon_and_move"

    def __init__(self, remover: PodRemover, pod: PodRef, identity: str, cause: str, timeout: float,
                 taint: str | None = None):
        assert pod.node is not None
        self.remover = remover
        self.client = remover.client
        self.pod = pod
        self.node = pod.node
        self.identity = identity
        self.cause = cause or "GPU fault"  # for a human: why the node is cordoned
        self.taint = taint or taint_value(self.cause)  # the taint's value: the fault's reason, or the ladder's word
        self.timeout = timeout

    async def restart(self) -> ExecResult:
        steps: list[str] = []
        cordoned: list[str] = []
        try:
            async with asyncio.timeout(self.timeout):
                failed = await self._cordon(steps, cordoned)
                if failed is not None:
                    return ExecResult("error", "; ".join([*steps, failed]))
                removal = await self.remover.remove(self.pod)
        except TimeoutError:
            return ExecResult("timeout", "; ".join([*steps, f"not done within {self.timeout:g}s"]),
                              cordoned=cordoned[0] if cordoned else None)
        steps.append(removal.detail)
        # After the outcome is settled: the Events are notes on it.
        node = {"apiVersion": "v1", "kind": "Node", "name": self.node}
        message = f"{self.cause}: moving pod {self.pod.namespace}/{self.pod.name} off this node"
        notes: list[tuple[str, Coroutine[Any, Any, bool]]] = []
        if cordoned:
            notes.append(("Event on the node", record_event(self.client, node, "default",
                                                            EVENT_REASONS["cordon_and_move"], message, "Warning",
                                                            self.identity)))
        if removal.done:
            note = f"{self.cause} on node {self.node}: node cordoned, pod moved off it"
            notes.append(("Event on the pod", pod_event(self.client, self.pod, "cordon_and_move", note, self.identity)))
        elif removal.blocked:
            notes.append(("", pod_event(self.client, self.pod, "disruption_budget", removal.detail, self.identity)))
        recorded = await within_notes(*(event for _, event in notes))
        steps.extend(said for (said, _), ok in zip(notes, recorded, strict=True) if ok and said)
        return ExecResult("ok" if removal.done else "error", "; ".join(steps),
                          cordoned=cordoned[0] if cordoned else None)

    async def _cordon(self, steps: list[str], cordoned: list[str]) -> str | None:
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
                taints.append({"key": GPU_TAINT_KEY, "value": self.taint, "effect": "NoSchedule"})
                patch = {
                    "metadata": {
                        "resourceVersion": meta["resourceVersion"],
                        "annotations": {CORDONED_BY: self.identity, CORDONED_AT: micro_time(time.time()),
                                        CORDON_REASON: self.cause[:1024]},
                    },
                    "spec": {"unschedulable": True, "taints": taints},
                }
            except ApiError as exc:
                return f"read node {self.node}: {exc}; not cordoned, nothing moved"
            except KubeError as exc:
                return f"node {self.node}: {exc}; not cordoned, nothing moved"
            except (KeyError, TypeError, AttributeError) as exc:
                return f"node {self.node}: unexpected answer ({type(exc).__name__}); not cordoned, nothing moved"
            try:
                await merge_patch_node(self.client, self.node, patch)
            except ApiError as exc:
                if exc.status == 409:
                    continue  # the node changed meanwhile (its status, another controller): read it again
                return f"cordon node {self.node}: {exc}; not cordoned, nothing moved"
            except KubeError as exc:
                return f"node {self.node}: {exc}; not cordoned, nothing moved"
            steps.append(f"node {self.node} cordoned and tainted {GPU_TAINT_KEY}={self.taint}:NoSchedule,"
                         f" marked {CORDONED_BY}={self.identity}")
            cordoned.append(self.node)
            return None
        return f"node {self.node}: still conflicting after 5 tries; not cordoned, nothing moved"


class IdentityReader:
    """The edge of the identity check (identity.py decides): the pod the exporter names, read by
    namespace and name, and its ReplicaSet when the workload needs one."""

    def __init__(self, client: KubeClient):
        self.client = client

    async def check(self, status: TargetStatus) -> identity.Checked:
        """The status as the API server confirms it, or the refusal (never raises for its answers)."""
        if not status.namespace or not status.pod:
            return identity.Checked(None, Decision(False, "identity_mismatch", "the exporter names part of a pod"
                                                   f" (namespace {status.namespace!r}, pod {status.pod!r}): never acted on"))
        where = f"pod {status.namespace}/{status.pod}"
        try:
            pod: dict[str, Any] | None = await get_pod(self.client, status.namespace, status.pod)
        except ApiError as exc:
            if exc.status != 404:
                return identity.Checked(None, Decision(False, "identity_unverified", f"read {where}: {exc}"))
            pod = None
        except KubeError as exc:
            return identity.Checked(None, Decision(False, "identity_unverified", f"read {where}: {exc}"))
        owner: dict[str, Any] | None = None
        wanted = identity.owner_to_read(pod) if pod is not None else None
        if wanted is not None:
            try:
                owner = await get_replica_set(self.client, status.namespace, wanted.name)
            except KubeError as exc:  # the rule refuses `owner_pending` without it; say why in the log
                log_event(log, "cannot read a pod's owner", level=logging.WARNING, pod=where, owner=wanted.name,
                          error=str(exc))
        return identity.verified(status, pod, owner)
