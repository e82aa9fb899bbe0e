"""Issue 30 on the real API server (kube-apiserver 1.20.2 + etcd): the remediator checks a pod's
identity itself, and a lost Lease fails closed.

- a labels-only target (a file_sd writer's words: the leader's name, its real UID, its node and its
  LeaderWorkerSet group) at an unrelated address restarts nothing: `identity_mismatch`, no pod
  evicted, the journal shows both sides;
- a pod whose owner reference lacks `controller: true` is counted against that owner, not its name,
  whatever workload the exporter says;
- a pod whose ReplicaSet cannot be read is `owner_pending`: nothing evicted, never the pod's name;
- the Lease deleted under two running replicas: every decision is `state_lost` (503), a pause too,
  `llm_vitals_remediator_state_lost` is 1, until POST /api/v1/state/reinit (the act token), which
  says what it discarded; then both replicas decide again.

Real `llm-vitals-remediator` processes with the shipped manifest's RBAC; evictions are counted from
the API server's audit log; the exporter's answers come from replicas.ExporterStandIn.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llm_vitals.remediator.store import STATE_ANNOTATION

from .control_plane import ControlPlane
from .replicas import (
    AUTH,
    LEASE,
    ExporterStandIn,
    alert,
    grant_remediator_rbac,
    pod_removals,
    refused_to_remediator,
    start_replicas,
)

LWS = {"leaderworkerset.sigs.k8s.io/name": "big", "leaderworkerset.sigs.k8s.io/group-index": "0"}


@pytest.fixture
async def exporter() -> AsyncIterator[ExporterStandIn]:
    stand_in = await ExporterStandIn().start()
    yield stand_in
    await stand_in.stop()


@pytest.fixture
async def replicas(control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, tmp_path: Path):
    began = time.time()  # the audit log holds the whole session: only this test's requests count
    started = []
    grant_remediator_rbac(control_plane, namespace)

    async def start(names: tuple[str, ...] = ("replica-a", "replica-b"), **over: Any):
        new = await start_replicas(control_plane, namespace, exporter.url, tmp_path / "replicas", names, **over)
        started.extend(new)
        return new

    yield start
    for replica in started:
        await replica.stop()
        print(replica.tail(60))  # shown by pytest when the test failed
    # The shipped RBAC (get on pods and replicasets) sufficed.
    assert refused_to_remediator(control_plane, namespace, began) == []


def owned_pod(cp: ControlPlane, namespace: str, name: str, owners: list[dict[str, Any]],
              labels: dict[str, str] | None = None, ip: str = "127.0.0.1") -> dict[str, Any]:
    """A pod with these ownerReferences (no controller-manager runs: nothing collects it), Running at `ip`."""
    cp.request("POST", f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "vllm", **(labels or {})},
                     "ownerReferences": owners},
        "spec": {"nodeName": "node-a", "containers": [{"name": "server", "image": "llm-vitals-test/none",
                                                       "ports": [{"name": "http", "containerPort": 8000}]}]}})
    return cp.play_kubelet(namespace, name, ip=ip)


def shared_state(cp: ControlPlane, namespace: str) -> dict[str, Any]:
    lease = cp.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}")
    return json.loads(lease["metadata"]["annotations"][STATE_ANNOTATION])


async def test_a_labels_only_target_at_an_unrelated_address_restarts_no_group(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    owner = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "big-0", "uid": "0f0f0f0f-0000-4000-8000-000000000001",
              "controller": True}]
    leader = owned_pod(control_plane, namespace, "big-0", owner, LWS)
    owned_pod(control_plane, namespace, "big-0-1", owner, LWS)
    # The writer copied everything but the address: the target polled is not this pod.
    target = exporter.put_pod(namespace, leader, "stuck", url="http://192.0.2.7:8000",
                              workload=f"LeaderWorkerSet/{namespace}/big/0")
    (a,) = await replicas(names=("replica-a",))
    answer = await a.webhook(alert(target, "fp-forged"))
    decision = answer.json()["decisions"][0]
    assert decision["reason"] == "identity_mismatch", decision
    assert "192.0.2.7" in decision["detail"] and "127.0.0.1" in decision["detail"]
    rows = [r for r in await a.actions() if r["reason"] == "identity_mismatch"]
    assert len(rows) == 1 and "192.0.2.7" in rows[0]["detail"]
    await a.stop()
    assert pod_removals(control_plane, namespace) == []


async def test_an_owner_without_controller_true_is_the_workload_counted(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    owner = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "vllm", "uid": "0f0f0f0f-0000-4000-8000-000000000002"}]
    pod = owned_pod(control_plane, namespace, "vllm-0", owner)
    target = exporter.put_pod(namespace, pod, "stuck", workload=f"Pod/{namespace}/vllm-0")  # the exporter's old rule
    (a,) = await replicas(names=("replica-a",))
    answer = await a.webhook(alert(target, "fp-owner"))
    assert answer.json()["decisions"][0]["reason"] == "allowed", answer.json()
    state = shared_state(control_plane, namespace)
    assert list(state["restart_times"]) == [f"StatefulSet/{namespace}/vllm"]


async def test_a_replica_set_that_cannot_be_read_is_owner_pending(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    owner = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "vllm-5d8f7",
              "uid": "0f0f0f0f-0000-4000-8000-000000000003", "controller": True}]
    pod = owned_pod(control_plane, namespace, "vllm-5d8f7-abcde", owner)  # its ReplicaSet is not there
    target = exporter.put_pod(namespace, pod, "stuck", workload=f"ReplicaSet/{namespace}/vllm-5d8f7")
    (a,) = await replicas(names=("replica-a",))
    answer = await a.webhook(alert(target, "fp-pending"))
    assert answer.status_code == 503 and answer.json()["decisions"][0]["reason"] == "owner_pending", answer.json()
    await a.stop()
    assert pod_removals(control_plane, namespace) == []


async def test_a_deleted_lease_fails_closed_until_a_human_reinitialises_it(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    pod = owned_pod(control_plane, namespace, "vllm-0", [])
    target = exporter.put_pod(namespace, pod, "idle")
    a, b = await replicas()
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        paused = await client.post(f"{a.url}/api/v1/pause", json={"until": 4102444800, "reason": "before"}, headers=AUTH)
        assert paused.status_code == 200
        # Replica b reads it too (a replica that never saw the Lease cannot tell its loss from a first start).
        seen = await client.get(f"{b.url}/api/v1/pause", headers=AUTH)
        assert seen.json()["paused"] is True
        control_plane.request("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}")
        for replica in (a, b):
            answer = await replica.webhook(alert(target, f"fp-lost-{replica.name}"))
            assert answer.status_code == 503 and answer.json()["decisions"][0]["reason"] == "state_lost", answer.json()
            assert "llm_vitals_remediator_state_lost 1.0" in await replica.text("/metrics")
        refused = await client.delete(f"{b.url}/api/v1/pause", headers=AUTH)
        assert refused.status_code == 503 and refused.json()["state_lost"] is True
        # The read token cannot release it; the act token can, and is told what was discarded.
        reinit = await client.post(f"{b.url}/api/v1/state/reinit", headers=AUTH,
                                   json={"from": "empty", "reason": "the Lease was deleted in a drill"})
        assert reinit.status_code == 200, reinit.text
        assert reinit.json()["discarded"] == {"lease": "absent"}
        for replica in (a, b):
            answer = await replica.webhook(alert(target, f"fp-after-{replica.name}"))
            assert answer.json()["decisions"][0]["reason"] == "not_stuck", answer.json()  # decided again
            assert "llm_vitals_remediator_state_lost 0.0" in await replica.text("/metrics")
    assert shared_state(control_plane, namespace)["reinitialised"]["reason"] == "the Lease was deleted in a drill"
