"""Issue 22 on the real API server (kube-apiserver 1.20.2 + etcd, and kube-controller-manager where a
Deployment must make ReplicaSets and pods, and the disruption controller must compute a
PodDisruptionBudget's status): safety that follows the workload.

- a Deployment of 2 whose new pods keep getting stuck: its circuit opens after max_restarts
  evictions across pod names and across the two replicas (each evicts one), and the reset (naming
  the Deployment, through the replica that did not open it) closes it;
- a PodDisruptionBudget (minAvailable 2) refuses the eviction (429): `disruption_budget`, no pod
  goes, an Event, and the re-send is judged afresh;
- a pod target without a UID is refused (`no_pod_uid`), nothing evicted or deleted;
- a LeaderWorkerSet group of 3 (leader and workers) is restarted together once, counted once;
- two replicas 60 s apart (one replica's clock seam) never restart twice;
- one unknown reason in the exporter's answer refuses that target only;
- the ladder: restart, cordon_and_move (the real cordon), page; a failed cordon marks nothing; the
  node's release clears it in the shared state;
- the sibling case: a Deployment's pod restarted on one node, then its sibling stuck on another: no
  cordon, a page; the page holds (re-sends to either replica, a new alert after escalate_within)
  until POST /api/v1/workloads/release with the act token (not the read token).

The replicas are real `llm-vitals-remediator` processes sharing one Lease, with the shipped
manifest's RBAC; every eviction and delete is counted from the API server's audit log. The
exporter's answers come from a small real aiohttp server (replicas.ExporterStandIn) serving
`TargetView` JSON for the real pods, with their real UIDs, each pod's `workload` computed by the
exporter's own rule (`llm_vitals.exporter.discovery.workload.pod_workload`) from its LeaderWorkerSet
labels or its ownerReferences (Pod -> ReplicaSet -> Deployment, the ReplicaSet read here);
test_pod_workload.py checks that the exporter itself reports those workloads, and
test_chain_deployment_circuit.py runs the Deployment's case with nothing stood in: the real exporter,
Prometheus and Alertmanager, one replica.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from waits import wait_until

from llm_vitals.exporter.discovery.workload import ReplicaSets, controller_of, group_of, pod_workload, replica_set_controller
from llm_vitals.remediator.pods import CORDONED_BY, GPU_TAINT_KEY

from .control_plane import DEFAULT_CONTROLLERS, ControlPlane
from .replicas import (
    AUTH,
    USER,
    ExporterStandIn,
    Replica,
    alert,
    deployment_replica_set,
    events,
    finished_restarts,
    owner_reference,
    pod_deletes,
    pod_evictions,
    pod_removals,
    reasons,
    rights_used,
    shared_state,
)

LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"


@pytest.fixture
def controllers(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """kube-controller-manager with the deployment, replicaset and disruption controllers, for this test only."""
    control_plane.start_controller_manager((*DEFAULT_CONTROLLERS, "disruption"))
    try:
        yield control_plane
    finally:
        control_plane.stop_controller_manager()


async def journal(replicas: list[Replica]) -> list[dict[str, Any]]:
    """Every replica's journal, oldest first by each row's time (two replicas' clocks agree within a second)."""
    rows = [row for r in replicas for row in await r.actions()]
    return sorted(rows, key=lambda row: row["time"])


def workload_of(cp: ControlPlane, pod: dict[str, Any]) -> str:
    """The pod's workload as the exporter reports it (its rule, `pod_workload`): its LeaderWorkerSet
    group, else its controller (a ReplicaSet's own controller: the Deployment), else `Pod/<ns>/<pod>`."""
    meta = pod["metadata"]
    controller = controller_of(meta)
    replica_sets = ReplicaSets(listed=True)
    if controller is not None and controller.kind == "ReplicaSet":
        rs = cp.request("GET", f"/apis/apps/v1/namespaces/{meta['namespace']}/replicasets/{controller.name}")
        replica_sets = ReplicaSets({controller.name: replica_set_controller(rs)}, listed=True)
    workload = pod_workload(meta["namespace"], meta["name"], group_of(meta.get("labels")), controller, replica_sets)
    assert workload is not None  # the ReplicaSets count as listed: never pending
    return workload


def deployment(cp: ControlPlane, namespace: str, name: str, replicas: int) -> None:
    labels = {"app": name}
    cp.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "server", "image": "llm-vitals-test/none",
                                     "ports": [{"name": "http", "containerPort": 8000}]}]}}}})


def live_pods(cp: ControlPlane, namespace: str, app: str) -> list[dict[str, Any]]:
    items = cp.request("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=app%3D{app}")["items"]
    return sorted((p for p in items if not p["metadata"].get("deletionTimestamp")), key=lambda p: p["metadata"]["name"])


async def running_replicas(cp: ControlPlane, namespace: str, app: str, count: int, node: str) -> list[dict[str, Any]]:
    """The Deployment's `count` live pods, each bound to `node` and reported Running and Ready (the
    scheduler's and the kubelet's parts, played here)."""
    pods = await wait_until(lambda: asyncio.sleep(0, (lambda p: p if len(p) == count else [])(
        live_pods(cp, namespace, app))), 90, f"{count} live pods of {app}")
    ready = []
    for pod in pods:
        name = pod["metadata"]["name"]
        if not pod["spec"].get("nodeName"):
            cp.bind_pod(namespace, name, node)
        ready.append(cp.play_kubelet(namespace, name))
    return ready


def standalone_pod(cp: ControlPlane, namespace: str, name: str, node: str | None = None,
                   labels: dict[str, str] | None = None, owners: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """A Running pod, made here (no controller-manager); with `owners`, the workload the remediator reads is theirs."""
    cp.create_pod(namespace, name, labels=labels or {"app": "vllm"}, node=node, owners=owners)
    return cp.play_kubelet(namespace, name)


async def test_a_deployments_circuit_opens_after_max_restarts_across_new_pod_names_and_its_reset_closes_it(
        controllers: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    """Two replicas share the Deployment's budget through the Lease: replica-a evicts the first pod,
    replica-b its replacement, the third pod is refused at replica-a, and replica-b's reset lets
    replica-a evict it. (test_chain_deployment_circuit.py has the real exporter, Prometheus and
    Alertmanager deliver to one replica; only here is the budget split between replicas.)"""
    cp = controllers
    node = f"node-{namespace}"
    cp.create_node(node)
    deployment(cp, namespace, "vllm", 2)
    a, b = await replicas(budget={"max_restarts": 2, "window": "1h", "backoff": {"initial": "0s"}},
                          global_cooldown="0s", max_unhealthy=1)
    workload = f"Deployment/{namespace}/vllm"
    evicted: list[str] = []
    seen: set[str] = set()
    for round_ in range(3):
        pods = await running_replicas(cp, namespace, "vllm", 2, node)
        fresh = [p for p in pods if p["metadata"]["name"] not in seen]
        stuck = fresh[0] if round_ else pods[0]  # after a restart: the pod the ReplicaSet made for it
        seen.update(p["metadata"]["name"] for p in pods)
        exporter.targets = {}
        for pod in pods:
            exporter.put_pod(namespace, pod, "stuck" if pod is stuck else "idle", workload=workload_of(cp, pod))
        target = f"{namespace}/{stuck['metadata']['name']}"
        await asyncio.sleep(0.5)  # the replicas reuse an exporter read for up to 0.2 s
        answer = await (a, b)[round_ % 2].webhook(alert(target, f"fp-{round_}", starts_at=time.time()))
        if round_ < 2:
            assert reasons([answer]) == ["allowed"], answer.json()
            await wait_until(lambda: finished_restarts([a, b]), 60, "the eviction to finish")
            evicted.append(stuck["metadata"]["name"])
            assert pod_evictions(cp, namespace, stuck["metadata"]["name"]) == [201]
        else:
            decision = answer.json()["decisions"][0]
            assert decision["reason"] == "circuit_open" and workload in decision["detail"], decision
    assert len(set(evicted)) == 2  # two pod names, one Deployment
    assert workload in shared_state(cp, namespace)["open_circuits"]
    assert len(pod_removals(cp, namespace)) == 2
    metrics = await a.text("/metrics")
    assert f'llm_vitals_remediator_circuit_open{{workload="{workload}"}} 1.0' in metrics

    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        reset = await client.post(f"{b.url}/api/v1/circuit/reset", json={"workload": workload}, headers=AUTH)
    assert reset.status_code == 200 and reset.json() == {"reset": [workload], "were_open": [workload]}
    assert workload not in shared_state(cp, namespace)["open_circuits"]
    answer = await a.webhook(alert(target, "fp-after-reset", starts_at=time.time()))
    assert reasons([answer]) == ["allowed"], answer.json()
    await wait_until(lambda: finished_restarts([a, b]), 60, "the eviction after the reset")
    assert len(pod_removals(cp, namespace)) == 3


async def test_a_disruption_budget_refuses_the_eviction_and_no_pod_goes(
        controllers: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    cp = controllers
    node = f"node-{namespace}"
    cp.create_node(node)
    deployment(cp, namespace, "vllm", 2)
    cp.request("POST", f"/apis/policy/v1beta1/namespaces/{namespace}/poddisruptionbudgets", {
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "vllm"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "vllm"}}}})
    pods = await running_replicas(cp, namespace, "vllm", 2, node)

    def budget_computed() -> dict[str, Any]:
        status = cp.request("GET", f"/apis/policy/v1beta1/namespaces/{namespace}/poddisruptionbudgets/vllm")["status"]
        return status if status.get("observedGeneration") and status.get("currentHealthy") == 2 else {}

    status = await wait_until(lambda: asyncio.sleep(0, budget_computed()), 60, "the disruption controller")
    assert status["disruptionsAllowed"] == 0
    stuck = pods[0]
    for pod in pods:
        exporter.put_pod(namespace, pod, "stuck" if pod is stuck else "idle", workload=workload_of(cp, pod))
    a, b = await replicas(global_cooldown="10m")
    target = f"{namespace}/{stuck['metadata']['name']}"
    payload = alert(target, "fp-pdb")

    answer = await a.webhook(payload)
    assert answer.status_code == 200 and reasons([answer]) == ["allowed"]  # the gate allowed; the API server refuses
    await wait_until(lambda: asyncio.sleep(0, pod_evictions(cp, namespace)), 60, "the eviction's answer")
    refused = await wait_until(lambda: _refusals(a), 30, "the restart journaled as the refusal")
    assert [(r["decision"], r["reason"], r["result"]) for r in refused] == [("refused", "disruption_budget", None)]
    assert "The disruption budget vllm needs 2 healthy pods and has 2 currently" in refused[0]["detail"]
    # Nothing was spent: the re-send (Alertmanager's repeat, here to the other replica) is judged afresh.
    # The refusal is journaled before the take-back's Lease write (ledger.taken_back): wait for the write.
    state = await wait_until(lambda: asyncio.sleep(0, _taken_back(cp, namespace)), 30, "the take-back in the Lease")
    assert state["in_progress"] is None and state["last_restart_started"] is None
    assert state["restart_times"] == {} and state["decided"] == []
    again = await b.webhook(payload)
    assert reasons([again]) == ["allowed"]
    await wait_until(lambda: asyncio.sleep(0, len(pod_evictions(cp, namespace)) == 2), 60, "the second eviction")
    await wait_until(lambda: _refusals(b), 30, "b's refusal")
    await asyncio.gather(a.stop(), b.stop())  # each waits for its background Events

    assert pod_evictions(cp, namespace) == [429, 429] and pod_deletes(cp, namespace) == []
    assert [p["metadata"]["uid"] for p in live_pods(cp, namespace, "vllm")] == [p["metadata"]["uid"] for p in pods]
    budget_events = events(cp, namespace, "LLMVitalsDisruptionBudget")
    assert {e["involvedObject"]["uid"] for e in budget_events} == {stuck["metadata"]["uid"]}
    assert len(budget_events) == 1  # one per alert episode and reason, whichever replica wrote it
    assert "disruption budget" in budget_events[0]["message"]
    assert workload_of(cp, stuck) in shared_state(cp, namespace)["disrupted"]


def _taken_back(cp: ControlPlane, namespace: str) -> dict[str, Any]:
    """The shared state once no restart is in progress in it (the claim taken back), else {}."""
    state = shared_state(cp, namespace)
    return state if state["in_progress"] is None else {}


async def _refusals(replica: Replica) -> list[dict[str, Any]]:
    return [r for r in await replica.actions() if r["reason"] == "disruption_budget"]


async def test_a_pod_without_a_uid_is_refused_and_nothing_is_acted_on(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    pod = standalone_pod(control_plane, namespace, "vllm-0")
    target = exporter.put_pod(namespace, pod, "stuck", pod_uid=None)  # e.g. a file_sd writer naming a pod
    (a,) = await replicas(names=("replica-a",))
    answer = await a.webhook(alert(target, "fp-no-uid"))
    decision = answer.json()["decisions"][0]
    assert answer.status_code == 200 and decision["reason"] == "no_pod_uid", decision
    assert "never acted on by name" in decision["detail"]
    await a.stop()
    assert pod_removals(control_plane, namespace) == []
    assert control_plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/vllm-0")["metadata"]["uid"] == \
        pod["metadata"]["uid"]


async def test_a_group_is_restarted_together_once_and_counted_once(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    """A LeaderWorkerSet group of 3 (leader and two workers; the labels LWS gives its pods), all stuck,
    beside a healthy pod: with max_unhealthy 1 the group is one unhealthy server, not three."""
    group_labels = {"app": "vllm", LWS_NAME: "big", LWS_GROUP: "0"}
    pods = [standalone_pod(control_plane, namespace, name, labels={**group_labels, "role": role})
            for name, role in (("big-0", "leader"), ("big-0-1", "worker"), ("big-0-2", "worker"))]
    other_group = standalone_pod(control_plane, namespace, "big-1", labels={**group_labels, LWS_GROUP: "1"})
    solo = standalone_pod(control_plane, namespace, "solo")
    workload = f"LeaderWorkerSet/{namespace}/big/0"
    targets = [exporter.put_pod(namespace, p, "stuck", workload=workload_of(control_plane, p)) for p in pods]
    exporter.put_pod(namespace, other_group, "idle", workload=workload_of(control_plane, other_group))
    exporter.put_pod(namespace, solo, "idle", workload=workload_of(control_plane, solo))
    assert workload_of(control_plane, pods[1]) == workload
    a, b = await replicas(max_unhealthy=1, global_cooldown="10m")

    # The leader's and both workers' alerts, each to both replicas (an HA pair of Alertmanagers).
    answers = await asyncio.gather(*(r.webhook(alert(t, f"fp-{t}")) for t in targets for r in (a, b)))
    assert [x.status_code for x in answers] == [200] * 6
    assert reasons(answers).count("allowed") == 1, reasons(answers)
    assert set(reasons(answers)) - {"allowed"} <= {"duplicate", "restart_in_progress", "cooldown"}, reasons(answers)
    rows = await wait_until(lambda: finished_restarts([a, b]), 60, "the group's restart")
    assert [(row["result"], row["workload"]) for row in rows] == [("ok", workload)], rows
    await asyncio.gather(a.stop(), b.stop())

    assert sorted(pod_evictions(control_plane, namespace)) == [201, 201, 201]
    for pod in pods:
        assert pod_evictions(control_plane, namespace, pod["metadata"]["name"]) == [201]
    assert pod_removals(control_plane, namespace, "big-1") == [] and pod_removals(control_plane, namespace, "solo") == []
    state = shared_state(control_plane, namespace)
    assert list(state["restart_times"]) == [workload] and len(state["restart_times"][workload]) == 1  # counted once
    restarted = {(e["involvedObject"]["name"], e["involvedObject"]["uid"])
                 for e in events(control_plane, namespace, "LLMVitalsRestart")}
    assert restarted == {(p["metadata"]["name"], p["metadata"]["uid"]) for p in pods}
    assert ("list", "pods") in rights_used(control_plane, (namespace,))


# Holds replica-a's restart of vllm-0 in its pre_restart for 8 s (its claim: 10 + 10 + 3 + 12 + 5 = 40 s).
HOLD = "import sys, time\nif sys.argv[1] == 'vllm-0':\n    time.sleep(8)"


async def test_two_replicas_a_minute_apart_never_restart_twice(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    """replica-b's clock runs 60 s ahead (its clock seam). By that clock replica-a's claim would have
    expired and the 30 s cooldown passed at once; by the API server's, which both judge by, neither."""
    first = exporter.put_pod(namespace, standalone_pod(control_plane, namespace, "vllm-0"), "stuck")
    second = exporter.put_pod(namespace, standalone_pod(control_plane, namespace, "vllm-1"), "stuck")
    a, b = await replicas(global_cooldown="30s", clock_skews={"replica-b": 60.0}, template={
        "timeout": "3s", "pre_restart": {"argv": [sys.executable, "-c", HOLD, "{pod}"], "timeout": "10s"}})
    assert reasons([await a.webhook(alert(first, "fp-a"))]) == ["allowed"]
    began = time.time()
    seen: list[tuple[float, str]] = []
    attempt = 0
    while True:
        attempt += 1
        word = reasons([await b.webhook(alert(second, f"fp-b-{attempt}"))])[0]
        seen.append((round(time.time() - began, 1), word))
        if word == "allowed":
            break
        assert word in ("restart_in_progress", "cooldown"), seen
        assert time.time() - began < 90, seen
        await asyncio.sleep(1.0)
    allowed_after = seen[-1][0]
    assert allowed_after >= 30 - 2, seen  # the cooldown, on the API server's clock (Date: whole seconds)
    assert any(w == "restart_in_progress" for _, w in seen) and any(w == "cooldown" for _, w in seen), seen
    await wait_until(lambda: finished_restarts([a, b]), 60, "both restarts")
    assert pod_evictions(control_plane, namespace, "vllm-0") == [201]
    assert pod_evictions(control_plane, namespace, "vllm-1") == [201]
    # On the API server's own clock (its audit log), the second restart came a cooldown after the first.
    first_at, second_at = (datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
                           for e in sorted(control_plane.audit(verb="create", resource="pods", namespace=namespace,
                                                               user="llm-vitals-remediator"),
                                           key=lambda e: e["requestReceivedTimestamp"]))
    assert second_at - first_at >= 30 - 8 - 2, (first_at, second_at)  # cooldown from the decision; a's hold was 8 s
    print(f"replica-b (60 s ahead) was held {allowed_after} s: {seen}; evictions {second_at - first_at:.1f} s apart")


async def test_one_unknown_reason_in_the_exporters_answer_refuses_that_target_only(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    newer = exporter.put_pod(namespace, standalone_pod(control_plane, namespace, "vllm-0"), "stuck")
    known = exporter.put_pod(namespace, standalone_pod(control_plane, namespace, "vllm-1"), "stuck")
    exporter.targets[newer]["reason"] = "engine_wedged_in_allreduce"  # a newer exporter's word
    a, b = await replicas(global_cooldown="0s")
    refused = await a.webhook(alert(newer, "fp-newer"))
    decision = refused.json()["decisions"][0]
    assert refused.status_code == 200 and decision["reason"] == "unknown_verdict", decision
    assert "engine_wedged_in_allreduce" in decision["detail"]
    assert reasons([await b.webhook(alert(known, "fp-known"))]) == ["allowed"]
    await wait_until(lambda: finished_restarts([a, b]), 60, "the known target's restart")
    assert pod_removals(control_plane, namespace, "vllm-0") == []
    assert pod_evictions(control_plane, namespace, "vllm-1") == [201]


async def test_the_ladder_restarts_then_cordons_and_moves_then_pages_and_a_failed_cordon_marks_nothing(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    cp = control_plane
    node_a, node_b = f"ladder-a-{namespace}", f"ladder-b-{namespace}"
    cp.create_node(node_a)
    cp.create_node(node_b)
    # The backoff off and room for two cordons: the steps come seconds apart here, not 15 minutes.
    a, b = await replicas(escalate_within="10m", global_cooldown="0s", pod_action="delete", max_cordoned_nodes=2,
                          budget={"max_restarts": 3, "window": "1h", "backoff": {"initial": "0s"}})
    # The remediator reads each pod's owners itself (the identity check): the pods are the
    # Deployment's (through its ReplicaSet) or the StatefulSet's, whatever the exporter says.
    workload = f"Deployment/{namespace}/vllm"
    vllm = owner_reference(deployment_replica_set(cp, namespace, "vllm"))
    other = f"StatefulSet/{namespace}/sglang"
    sglang = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "sglang",
              "uid": "0f0f0f0f-0000-4000-8000-000000000022", "controller": True}
    # Neighbours: other workloads restarted on the same node, the node's own evidence (gate.node_suspect).
    neighbour, neighbour2 = ({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name,
                              "uid": f"0f0f0f0f-0000-4000-8000-00000000003{i}", "controller": True}
                             for i, name in enumerate(("neighbour", "neighbour2")))

    async def stuck_again(name: str, node: str, replica: Replica, fingerprint: str, owner: dict[str, Any] = vllm) -> str:
        pod = standalone_pod(cp, namespace, name, node=node, owners=(owner,))
        exporter.targets = {}
        target = exporter.put_pod(namespace, pod, "stuck", workload=workload_of(cp, pod))
        await asyncio.sleep(0.5)  # the replicas reuse an exporter read for up to 0.2 s
        answer = await replica.webhook(alert(target, fingerprint, starts_at=time.time()))
        await wait_until(lambda: finished_restarts([a, b]), 60, f"{name}'s step")
        return answer.json()["decisions"][0]["reason"]

    # The node's own evidence (gate.node_suspect): another workload restarted on node A meanwhile. One
    # workload hanging again on its own node alone pages instead (a pinned pod comes back there by design).
    assert await stuck_again("neighbour-0", node_a, b, "fp-0", neighbour) == "allowed"
    assert await stuck_again("vllm-1", node_a, a, "fp-1") == "allowed"  # step 1: restart
    assert await stuck_again("vllm-2", node_a, b, "fp-2") == "cordon_and_move"  # step 2, the real cordon
    node = cp.request("GET", f"/api/v1/nodes/{node_a}")
    assert node["spec"]["unschedulable"] is True
    assert {"key": GPU_TAINT_KEY, "value": "LadderEscalation", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert node["metadata"]["annotations"][CORDONED_BY] in ("replica-a", "replica-b")
    assert shared_state(cp, namespace)["gpu_nodes"] == [node_a]
    assert await stuck_again("vllm-3", node_b, a, "fp-3") == "escalated_to_human"  # step 3: the page
    assert pod_removals(cp, namespace, "vllm-3") == []
    assert shared_state(cp, namespace)["ladder"][workload][0] == "page"

    # Another workload: a restart, then, stuck again on the same node, a cordon that fails (its node
    # is gone): nothing marked, nothing moved.
    assert await stuck_again("neighbour-1", f"gone-{namespace}", a, "fp-6", neighbour2) == "allowed"
    assert await stuck_again("sglang-0", f"gone-{namespace}", b, "fp-4", sglang) == "allowed"
    assert await stuck_again("sglang-1", f"gone-{namespace}", a, "fp-5", sglang) == "cordon_and_move"
    rows = await journal([a, b])
    failed = next(r for r in rows if r["target"] == f"{namespace}/sglang-1")
    assert failed["result"] == "error" and "not cordoned, nothing moved" in failed["detail"], failed
    assert shared_state(cp, namespace)["gpu_nodes"] == [node_a]
    assert pod_removals(cp, namespace, "sglang-1") == []
    assert set(shared_state(cp, namespace)["ladder"]) == {workload, other, f"StatefulSet/{namespace}/neighbour",
                                                         f"StatefulSet/{namespace}/neighbour2"}

    # Every step journaled with its outcome, once. Not in the order of the rows' times: each replica times
    # its rows by its own clock corrected by the API server's whole-second Date headers (store/lease.py),
    # so two replicas' rows under a second apart may sort either way (a cold CI run sorted vllm-2's row, of
    # replica b, before vllm-1's, of replica a, 0.65 s earlier). The steps' order is what the answers above assert.
    steps = [(r["target"].split("/")[1], r["reason"], r["result"]) for r in rows if r["decision"] != "resolved"]
    assert sorted(steps, key=str) == sorted([
        ("neighbour-0", "allowed", "ok"), ("vllm-1", "allowed", "ok"), ("vllm-2", "cordon_and_move", "ok"),
        ("vllm-3", "escalated_to_human", None), ("neighbour-1", "allowed", "ok"), ("sglang-0", "allowed", "ok"),
        ("sglang-1", "cordon_and_move", "error")], key=str), steps
    escalated = events(cp, namespace, "LLMVitalsEscalated")
    assert [e["involvedObject"]["name"] for e in escalated] == ["vllm-3"]

    # A human uncordons node A and releases it, through either replica: the shared state forgets it.
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        released = await client.post(f"{b.url}/api/v1/nodes/{node_a}/release", headers=AUTH)
        refused = await client.post(f"{a.url}/api/v1/nodes/{node_a}/release")
    assert released.status_code == 200 and released.json()["was_escalated"] is True
    assert refused.status_code == 401
    assert shared_state(cp, namespace)["gpu_nodes"] == []
    assert ("delete", "pods") in rights_used(cp, (namespace,))  # pod_action: delete


READ_TOKEN = "k8s-tier-read-s3cret"
ESCALATE_WITHIN = 8.0  # seconds: long enough for one eviction on a loaded box, short enough to wait out


async def test_a_sibling_stuck_on_another_node_pages_without_a_cordon_and_the_page_holds_until_released(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas, tmp_path: Path) -> None:
    """Issue 30, both replicas on the shared Lease. Pod p1 of a Deployment is restarted on node 1; then
    its sibling p2, on node 2, is stuck within escalate_within: a hang that followed the software
    across nodes is no node's fault, so nothing is cordoned and the workload is paged. The page holds:
    Alertmanager's re-send of the alert (to either replica) and a new alert once escalate_within has
    passed are refused `escalated_to_human`, until a human releases the workload with the act token
    (not without a token, not with the read token); then the ladder starts again at a restart."""
    cp = control_plane
    node_1, node_2 = f"sibling-1-{namespace}", f"sibling-2-{namespace}"
    cp.create_node(node_1)
    cp.create_node(node_2)
    act_token, read_token = tmp_path / "act-token", tmp_path / "read-token"
    act_token.write_text(AUTH["Authorization"].removeprefix("Bearer ") + "\n")
    read_token.write_text(READ_TOKEN + "\n")
    a, b = await replicas(escalate_within=f"{ESCALATE_WITHIN:g}s", global_cooldown="0s",
                          budget={"max_restarts": 3, "window": "1h", "backoff": {"initial": "0s"}},
                          auth={"bearer_token_file": str(act_token), "read_token_file": str(read_token)})
    workload = f"Deployment/{namespace}/vllm"
    owner = owner_reference(deployment_replica_set(cp, namespace, "vllm"))
    p1 = standalone_pod(cp, namespace, "vllm-5d8f7-p1", node=node_1, owners=(owner,))
    p2 = standalone_pod(cp, namespace, "vllm-5d8f7-p2", node=node_2, owners=(owner,))
    first = exporter.put_pod(namespace, p1, "stuck", workload=workload_of(cp, p1))
    exporter.put_pod(namespace, p2, "idle", workload=workload_of(cp, p2))
    assert reasons([await a.webhook(alert(first, "fp-p1", starts_at=time.time()))]) == ["allowed"]
    await wait_until(lambda: finished_restarts([a, b]), 60, "p1's restart")
    assert pod_evictions(cp, namespace, "vllm-5d8f7-p1") == [201]

    # p1 is gone (evicted); its sibling on the other node is stuck now.
    del exporter.targets[first]
    second = exporter.put_pod(namespace, p2, "stuck", workload=workload_of(cp, p2))
    await asyncio.sleep(0.5)  # the replicas reuse an exporter read for up to 0.2 s
    resent = alert(second, "fp-p2", starts_at=time.time())
    paged = (await b.webhook(resent)).json()["decisions"][0]
    paged_by = time.time()
    assert paged["reason"] == "escalated_to_human", paged
    assert f"restart on node {node_1}, now on node {node_2}" in paged["detail"], paged
    state = shared_state(cp, namespace)
    assert list(state["pages"]) == [workload] and state["gpu_nodes"] == []
    assert state["ladder"][workload][0] == "page"
    escalated = await wait_until(lambda: asyncio.sleep(0, events(cp, namespace, "LLMVitalsEscalated")), 30,
                                 "the page's Event")
    assert [e["involvedObject"]["uid"] for e in escalated] == [p2["metadata"]["uid"]]

    # The page holds: Alertmanager's re-send, to each replica, ...
    for replica in (a, b):
        held = (await replica.webhook(resent)).json()["decisions"][0]
        assert held["reason"] == "escalated_to_human" and "was paged and not released yet" in held["detail"], held
    # ... and a new alert once escalate_within has passed (the ladder alone would start over at a restart).
    await asyncio.sleep(max(0.0, paged_by + ESCALATE_WITHIN + 0.5 - time.time()))
    later = alert(second, "fp-p2-later", starts_at=time.time())
    held = (await a.webhook(later)).json()["decisions"][0]
    assert held["reason"] == "escalated_to_human" and "was paged and not released yet" in held["detail"], held

    # Released by a human: not without a token, not with the read token; with the act token, on either replica.
    body = {"workload": workload}
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        anonymous = await client.post(f"{a.url}/api/v1/workloads/release", json=body)
        reader = await client.post(f"{a.url}/api/v1/workloads/release", json=body,
                                   headers={"Authorization": f"Bearer {READ_TOKEN}"})
        assert (anonymous.status_code, reader.status_code) == (401, 403)
        assert list(shared_state(cp, namespace)["pages"]) == [workload]
        released = await client.post(f"{a.url}/api/v1/workloads/release", json=body, headers=AUTH)
    assert released.status_code == 200, released.text
    assert released.json() == {"workload": workload, "released": True, "was_paged": True}
    state = shared_state(cp, namespace)
    assert state["pages"] == {} and workload not in state["ladder"]
    # The alert again, at the other replica: the ladder starts at a restart.
    assert reasons([await b.webhook(later)]) == ["allowed"]
    await wait_until(lambda: finished_restarts([a, b]), 60, "p2's restart")
    assert pod_evictions(cp, namespace, "vllm-5d8f7-p2") == [201]

    # Nothing was cordoned: no write to either node, ever.
    for node in (node_1, node_2):
        assert not cp.request("GET", f"/api/v1/nodes/{node}")["spec"].get("unschedulable")
    assert [e["verb"] for e in cp.audit(resource="nodes", user=USER) if e["objectRef"].get("name") in (node_1, node_2)
            and e["verb"] != "get"] == []
    # Each replica's journal in the order written (ids): the replicas' clocks, and a decision's clock (the
    # API server's, as estimated) and a release's, differ by a fraction of a second.
    steps = {r.name: [(row["target"].rsplit("/", 1)[1], row["fingerprint"], row["reason"], row["result"])
                      for row in sorted(await r.actions(), key=lambda row: row["id"]) if row["decision"] != "resolved"]
             for r in (a, b)}
    assert steps == {
        "replica-a": [("vllm-5d8f7-p1", "fp-p1", "allowed", "ok"), ("vllm-5d8f7-p2", "fp-p2", "escalated_to_human", None),
                      ("vllm-5d8f7-p2", "fp-p2-later", "escalated_to_human", None), ("vllm", None, "workload_release", None)],
        "replica-b": [("vllm-5d8f7-p2", "fp-p2", "escalated_to_human", None),
                      ("vllm-5d8f7-p2", "fp-p2", "escalated_to_human", None),
                      ("vllm-5d8f7-p2", "fp-p2-later", "allowed", "ok")]}, steps
