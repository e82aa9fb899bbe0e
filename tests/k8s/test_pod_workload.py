"""Each discovered pod's workload on the real API server and controller-manager: a Deployment's pods
(Pod -> ReplicaSet -> Deployment, as kube-controller-manager really writes the owners), a
StatefulSet's pod, a LeaderWorkerSet group's pods (its labels win over the StatefulSet that owns
them) and a bare pod; then a ReplicaSet read that RBAC forbids: shown, never a crash, and the
Deployment named once the right is granted.

The exporter is a live exporter app with the `llm-vitals-exporter` token and exactly the Role of
deploy/kubernetes/base/exporter.yaml (the forbidden case: that Role without its ReplicaSet rule). The
test plays the scheduler-less kubelet: each pod the controllers make is reported Running on
127.0.0.1, its `http` port a FakeVllm on loopback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from test_exporter_helpers import FakeVllm, wait_for

from llm_vitals.exporter.keys import STORE

from .control_plane import ControlPlane
from .test_pod_discovery import EXPORTER, deployed_pod_rules, exporter, in_thread

LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
CONTROLLERS = ("deployment", "replicaset", "statefulset", "serviceaccount")


def pod_template(labels: Mapping[str, str], port: int) -> dict[str, Any]:
    return {"metadata": {"labels": dict(labels)},
            "spec": {"containers": [{"name": "server", "image": "llm-vitals-test/none",
                                     "ports": [{"name": "http", "containerPort": port}]}]}}


def create_deployment(cp: ControlPlane, ns: str, name: str, replicas: int, port: int) -> None:
    labels = {"app": "vllm", "workload": name}
    cp.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": pod_template(labels, port)}})


def create_stateful_set(cp: ControlPlane, ns: str, name: str, replicas: int, port: int,
                        labels: Mapping[str, str] | None = None) -> None:
    selector = {"app": "vllm", "workload": name}
    cp.request("POST", f"/apis/apps/v1/namespaces/{ns}/statefulsets", {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
        "spec": {"replicas": replicas, "serviceName": name, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": selector}, "template": pod_template({**selector, **(labels or {})}, port)}})


def run_pending_pods(cp: ControlPlane, ns: str) -> list[str]:
    """Play the kubelet for every pod of the namespace not Running yet; the names of all its pods."""
    pods = cp.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Running":
            cp.play_kubelet(ns, pod["metadata"]["name"])
    return sorted(pod["metadata"]["name"] for pod in pods)


async def kubelet_until(cp: ControlPlane, ns: str, count: int, timeout: float = 60) -> list[str]:
    """Run the controllers' pods as they appear, until `count` pods exist and run; their names."""
    deadline = time.monotonic() + timeout
    while True:
        names = await in_thread(run_pending_pods, cp, ns)
        if len(names) >= count:
            return names
        if time.monotonic() > deadline:
            raise AssertionError(f"only {names} of {count} pods made by the controllers after {timeout:g}s")
        await asyncio.sleep(0.2)


async def workloads(client) -> dict[str, str]:
    """pod name -> its workload, as `GET /api/v1/targets` says."""
    answer = await (await client.get("/api/v1/targets")).json()
    return {target["pod"]: target["workload"] for target in answer["targets"]}


async def discovery_source(client) -> dict[str, Any]:
    return (await (await client.get("/api/v1/discovery")).json())["sources"][0]


async def test_deployment_statefulset_and_leaderworkerset_pods_carry_their_workload(
        control_plane, namespace, aiohttp_server, aiohttp_client) -> None:
    cp, ns = control_plane, namespace
    await in_thread(cp.grant, ns, EXPORTER, deployed_pod_rules(), name="llm-vitals-exporter-pods")
    port = (await aiohttp_server(FakeVllm().app())).port
    # In this thread, not in_thread: the harness's processes die with the thread that started them.
    cp.start_controller_manager(CONTROLLERS)
    try:
        client = await exporter(cp, ns, aiohttp_client)
        await in_thread(create_deployment, cp, ns, "vllm", 2, port)
        await in_thread(create_stateful_set, cp, ns, "solo", 1, port)
        # One group of a LeaderWorkerSet `big`: LWS makes a StatefulSet per group, and labels its pods.
        await in_thread(create_stateful_set, cp, ns, "big-1", 2, port, {LWS_NAME: "big", LWS_GROUP: "1"})
        await in_thread(cp.create_pod, ns, "bare", labels={"app": "vllm"}, port=port)
        pods = await kubelet_until(cp, ns, 6)
        await wait_for(lambda: len(client.app[STORE].records) == 6, timeout=10, what="six targets")

        found = await workloads(client)
        replica_set_pods = [pod for pod in pods if pod.startswith("vllm-")]
        assert len(replica_set_pods) == 2
        assert found == {
            **{pod: f"Deployment/{ns}/vllm" for pod in replica_set_pods},
            "solo-0": f"StatefulSet/{ns}/solo",
            "big-1-0": f"LeaderWorkerSet/{ns}/big/1",
            "big-1-1": f"LeaderWorkerSet/{ns}/big/1",
            "bare": f"Pod/{ns}/bare",
        }
        info = [line for line in (await (await client.get("/metrics")).text()).splitlines()
                if line.startswith("llm_vitals_target_info") and f'pod="{replica_set_pods[0]}"' in line]
        assert info and f'workload="Deployment/{ns}/vllm"' in info[0]
        page = await (await client.get("/")).text()
        assert f"LeaderWorkerSet/{ns}/big/1" in page
        status = await discovery_source(client)
        assert status["up"] is True and status["error"] is None and status["skipped"] == {}

        # A pod the Deployment makes anew, under a new name, is the same workload.
        gone = replica_set_pods[0]
        await in_thread(cp.request, "DELETE", f"/api/v1/namespaces/{ns}/pods/{gone}?gracePeriodSeconds=0")
        pods = await kubelet_until(cp, ns, 6)
        (new,) = [pod for pod in pods if pod.startswith("vllm-") and pod not in replica_set_pods]
        await wait_for(lambda: f"{ns}/{new}" in client.app[STORE].records, timeout=10, what="the new pod's target")
        assert (await workloads(client))[new] == f"Deployment/{ns}/vllm"
    finally:
        cp.stop_controller_manager()


async def test_a_forbidden_replicaset_read_is_shown_and_the_pods_stay_targets_under_their_replicaset(
        control_plane, namespace, aiohttp_server, aiohttp_client) -> None:
    cp, ns = control_plane, namespace
    pods_only = [rule for rule in deployed_pod_rules() if "replicasets" not in rule["resources"]]
    assert pods_only != deployed_pod_rules()
    await in_thread(cp.grant, ns, EXPORTER, pods_only, name="pods-only")
    port = (await aiohttp_server(FakeVllm().app())).port
    # In this thread, not in_thread: the harness's processes die with the thread that started them.
    cp.start_controller_manager(CONTROLLERS)
    try:
        client = await exporter(cp, ns, aiohttp_client)
        await in_thread(create_deployment, cp, ns, "vllm", 1, port)
        (pod,) = await kubelet_until(cp, ns, 1)
        replica_set = pod.rsplit("-", 1)[0]  # `<deployment>-<pod-template-hash>-<random>`
        await wait_for(lambda: len(client.app[STORE].records) == 1, timeout=10, what="the pod's target")
        assert (await workloads(client)) == {pod: f"ReplicaSet/{ns}/{replica_set}"}
        status = await discovery_source(client)
        assert status["up"] is False and status["targets"] == 1
        assert status["error"].startswith(
            f"HTTP 403 listing replicasets in namespace {ns}: the exporter needs list and watch on replicasets (apps)")
        assert 'llm_vitals_discovery_up{source="kubernetes[0]"} 0.0' in await (await client.get("/metrics")).text()
        assert (await client.get("/healthz")).status == 200

        # Granted later, the Deployment is named (the informer retries on its own backoff).
        await in_thread(cp.grant, ns, EXPORTER, deployed_pod_rules(), name="llm-vitals-exporter-pods")
        deadline = time.monotonic() + 40
        while (await workloads(client)).get(pod) != f"Deployment/{ns}/vllm" and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert (await workloads(client)) == {pod: f"Deployment/{ns}/vllm"}
        status = await discovery_source(client)
        assert status["up"] is True and status["error"] is None
    finally:
        cp.stop_controller_manager()
