"""Issue 14 on the real API server: two remediator replicas sharing one Lease, exact pod restarts,
Events, a killed replica's claim, Lease conflicts, an API outage, pod identity, GPU escalation,
pause and storm cooldown.

The replicas are real `llm-vitals-remediator` processes with their own SQLite journals; the lock and
the shared state are a real `coordination.k8s.io/v1` Lease on kube-apiserver 1.20.2 + etcd 3.4; the
RBAC is the shipped manifest's Role and ClusterRole; every pod DELETE is counted from the API
server's own audit log. The exporter's answer (the target re-check) comes from a small real aiohttp
server returning `llm_vitals.targets.TargetView` JSON with namespace/pod/pod_uid/node, so that each
test sets exactly the view it needs (see replicas.py); the chain test uses the real exporter.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from waits import wait_until

from llm_vitals.remediator.pods import CORDONED_BY, GPU_TAINT_KEY

from .control_plane import ControlPlane
from .replicas import (
    LEASE,
    USER,
    ExporterStandIn,
    Replica,
    SlowLink,
    alert,
    events,
    finished_restarts,
    lease,
    pod_removals,
    reasons,
    rights_used,
    shared_state,
)


def running_pod(control_plane: ControlPlane, namespace: str, name: str, node: str | None = None) -> dict[str, Any]:
    control_plane.create_pod(namespace, name, labels={"app": "vllm"}, node=node)
    return control_plane.play_kubelet(namespace, name)


def pod_or_none(control_plane: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    with control_plane.client() as client:
        response = client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return response.json() if response.status_code == 200 else None


async def test_200_duplicate_webhooks_over_two_replicas_delete_the_pod_once_with_one_event(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    pod = running_pod(control_plane, namespace, "vllm-0")
    target = exporter.put_pod(namespace, pod, "stuck")
    a, b = await replicas()
    payload = alert(target, "fp-duplicates")

    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(trust_env=False, timeout=120, limits=limits) as client:
        answers = await asyncio.gather(*(r.webhook(payload, client) for r in (a, b) * 100))
    assert [x.status_code for x in answers] == [200] * 200
    assert sorted(set(reasons(answers))) == ["allowed", "duplicate"] and reasons(answers).count("allowed") == 1

    rows = await wait_until(lambda: finished_restarts([a, b]), 60, "the restart to finish")
    assert [(row["target"], row["result"]) for row in rows] == [(target, "ok")]
    assert pod_removals(control_plane, namespace) == [201]
    assert pod_or_none(control_plane, namespace, "vllm-0") is None
    restart_events = events(control_plane, namespace, "LLMVitalsRestart")
    assert [(e["involvedObject"]["name"], e["involvedObject"]["uid"]) for e in restart_events] == [
        ("vllm-0", pod["metadata"]["uid"])]
    conflicts = [e for e in control_plane.audit(resource="leases", namespace=namespace, user=USER)
                 if e["responseStatus"]["code"] == 409]
    print(f"Lease writes refused with 409 while the replicas raced: {len(conflicts)}")

    # A second stuck target inside the global cooldown: refused on both replicas, nothing deleted.
    other = exporter.put_pod(namespace, running_pod(control_plane, namespace, "vllm-1"), "stuck")
    second = [await r.webhook(alert(other, "fp-second")) for r in (a, b)]
    assert reasons(second) == ["cooldown", "duplicate"] or reasons(second) == ["cooldown", "cooldown"]
    third = await b.webhook(alert(other, "fp-third"))
    assert reasons([third]) == ["cooldown"]
    assert pod_removals(control_plane, namespace, "vllm-1") == []
    assert len(events(control_plane, namespace, "LLMVitalsRestart")) == 1


# The pre_restart of the crash drill: for pod vllm-0 it says it runs (its pid in the marker file),
# then blocks, so the replica is held after its intent is committed and before its executor deletes
# anything. For any other pod it returns at once.
HOLD = ("import os, sys, time\n"
        "if sys.argv[2] == 'vllm-0':\n"
        "    open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(60)")


async def test_a_replica_killed_after_its_intent_leaves_a_claim_the_other_honours_until_it_expires(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas, tmp_path: Path) -> None:
    marker = tmp_path / "pre-restart.pids"
    first = exporter.put_pod(namespace, running_pod(control_plane, namespace, "vllm-0"), "stuck")
    second = exporter.put_pod(namespace, running_pod(control_plane, namespace, "vllm-1"), "stuck")
    # The claim lasts the lock wait + pre_restart timeout + executor timeout + the Events + 5 s margin
    # = 10 + 10 + 3 + 12 + 5 = 40 s (acting.claim_seconds). A 1 s
    # cooldown, so that what holds the other replica back below is the claim, not the cooldown.
    a, b = await replicas(global_cooldown="1s", template={
        "timeout": "3s", "pre_restart": {"argv": [sys.executable, "-c", HOLD, str(marker), "{pod}"], "timeout": "10s"}})
    try:
        answer = await a.webhook(alert(first, "fp-crash"))
        assert reasons([answer]) == ["allowed"]
        await wait_until(lambda: asyncio.sleep(0, marker.exists()), 30, "replica-a's pre_restart to start")
        held = shared_state(control_plane, namespace)
        assert held["in_progress"] == first and held["in_progress_by"].startswith("replica-a/")
        assert lease(control_plane, namespace)["spec"]["holderIdentity"] == "replica-a"
        await a.kill()  # SIGKILL: committed intent, no delete, no release
    finally:
        for pid in marker.read_text().split() if marker.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)  # the orphaned pre_restart (its own session)

    assert reasons([await b.webhook(alert(first, "fp-crash"))]) == ["duplicate"]
    expires = held["in_progress_expires"]
    seen: list[str] = []
    attempt = 0
    while True:
        attempt += 1
        now = time.time()
        word = reasons([await b.webhook(alert(second, f"fp-after-crash-{attempt}"))])[0]
        seen.append(word)
        if word == "allowed":
            assert now >= expires - 1.0, f"allowed {expires - now:.1f}s before the dead replica's claim expired"
            break
        assert word == "restart_in_progress", seen
        assert time.time() < expires + 30, f"never allowed after the claim expired: {seen}"
        await asyncio.sleep(1.0)
    assert seen.count("restart_in_progress") >= 3, seen  # held for most of the 40 s claim

    await wait_until(lambda: finished_restarts([b]), 60, "replica-b's restart to finish")
    assert pod_removals(control_plane, namespace, "vllm-0") == []  # the dead replica's restart was not redone
    assert pod_removals(control_plane, namespace, "vllm-1") == [201]
    taken = lease(control_plane, namespace)["spec"]
    assert taken["leaseTransitions"] == 1  # the expired holder's claim was taken over
    assert [row["result"] for row in await b.restarts()] == ["ok"]


async def test_lease_conflicts_from_another_writer_are_retried_and_never_act_twice(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas, tmp_path: Path) -> None:
    names = [exporter.put_pod(namespace, running_pod(control_plane, namespace, f"vllm-{i}"), "stuck")
             for i in range(3)]
    target = names[0]
    # A storm first (3 stuck, 1 allowed): each of its fleet_gate refusals writes the storm marker to
    # the Lease, so the replicas write many times while the third writer runs, and meet conflicts.
    # The replicas reach the API server through a relay that holds each request 50 ms: between a
    # replica's read and its write the third writer below has written, more often than not.
    link = await SlowLink(control_plane, delay=0.05).start()
    slow = link.kubeconfig(control_plane, USER, tmp_path / "kubeconfig-slow")
    a, b = await replicas(max_unhealthy=1, storm_cooldown="2s", kubeconfig=slow)
    stop = threading.Event()
    writes = {"ok": 0, "conflict": 0}
    # Seconds between the third writer's changes. During the storm it writes as fast as it can; for the
    # restart it leaves gaps longer than a replica's relayed read-then-write (~0.1 s): on a quiet box a
    # writer that never pauses can win every race, and then no replica ever acts (seen once in CI).
    gap = [0.02]

    def hammer() -> None:
        """A third writer (admin) changing the Lease as fast as it can: every change moves its resourceVersion."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        with control_plane.client() as client:
            i = 0
            while not stop.is_set():
                i += 1
                got = client.get(f"{path}/{LEASE}")
                if got.status_code == 404:
                    client.post(path, json={"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                            "metadata": {"name": LEASE}, "spec": {}})
                    continue
                body = got.json()
                body["metadata"].setdefault("annotations", {})["test.llm-vitals.io/touch"] = str(i)
                code = client.put(f"{path}/{LEASE}", json=body).status_code
                writes["ok" if code == 200 else "conflict"] += 1
                time.sleep(gap[0])

    thread = threading.Thread(target=hammer, daemon=True)
    thread.start()
    try:
        await wait_until(lambda: asyncio.sleep(0, writes["ok"] >= 20), 30, "the third writer to get going")
        storm = await asyncio.gather(*(r.webhook(alert(names[i % 3], f"fp-storm-{i}"))
                                       for i, r in enumerate((a, b) * 10)))
        # A refusal that could not be written after 8 conflicts is a 503 (Alertmanager sends it again).
        assert {(x.status_code, w) for x, w in zip(storm, reasons(storm), strict=True)} <= {
            (200, "fleet_gate"), (503, "state_unreachable")}
        for name in names[1:]:
            exporter.set_state(name, "idle")  # the storm is over
        await asyncio.sleep(2.5)  # past the storm cooldown
        gap[0] = 0.3
        payload = alert(target, "fp-conflicts")
        decided: list[str] = []
        for _ in range(40):  # as Alertmanager: a 503 is sent again
            answers = await asyncio.gather(*(r.webhook(payload) for r in (a, b) * 5))
            decided += [w for x, w in zip(answers, reasons(answers), strict=True) if x.status_code == 200]
            if "allowed" in decided:
                break
            await asyncio.sleep(0.5)
        rows = await wait_until(lambda: finished_restarts([a, b]), 60, "the restart to finish")
    finally:
        stop.set()
        thread.join(10)
        await link.stop()
    assert decided.count("allowed") == 1 and set(decided) <= {"allowed", "duplicate", "storm_cooldown"}, decided
    assert [row["result"] for row in rows] == ["ok"]
    assert pod_removals(control_plane, namespace) == [201]
    refused = [e for e in control_plane.audit(resource="leases", namespace=namespace, user=USER)
               if e["responseStatus"]["code"] == 409]
    assert refused, "the remediator never met a conflict: the drill proved nothing"
    print(f"third writer: {writes}; remediator Lease writes refused with 409: {len(refused)}")
    # The other writer's annotation survived the remediator's writes (it keeps what it does not own).
    assert "test.llm-vitals.io/touch" in lease(control_plane, namespace)["metadata"]["annotations"]


async def test_with_the_api_server_stopped_webhooks_get_503_and_nothing_is_deleted_then_it_goes_on(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    target = exporter.put_pod(namespace, running_pod(control_plane, namespace, "vllm-0"), "stuck")
    a, b = await replicas()
    payload = alert(target, "fp-outage")
    control_plane.stop_apiserver()
    try:
        during = [await r.webhook(payload) for r in (a, b, a, b)]
        assert [x.status_code for x in during] == [503] * 4
        assert set(reasons(during)) == {"state_unreachable"}
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            paused = await client.post(f"{a.url}/api/v1/pause", json={"until": time.time() + 60, "reason": "x"},
                                       headers={"Authorization": "Bearer k8s-tier-webhook-s3cret"})
        assert paused.status_code == 503
    finally:
        control_plane.start_apiserver()
    assert pod_or_none(control_plane, namespace, "vllm-0") is not None
    assert pod_removals(control_plane, namespace) == []

    # Alertmanager sends again: now exactly one restart.
    after: list[httpx.Response] = []
    for attempt in range(10):
        after = await asyncio.gather(a.webhook(payload), b.webhook(payload))
        if 503 not in [x.status_code for x in after]:
            break
        print(f"after the API server returned, attempt {attempt}: {[x.json() for x in after]}")
        await asyncio.sleep(1)
    assert sorted(reasons(after)) == ["allowed", "duplicate"], [x.json() for x in after]
    await wait_until(lambda: finished_restarts([a, b]), 60, "the restart to finish")
    assert pod_removals(control_plane, namespace) == [201]
    coming_back = [e["verb"] for e in control_plane.audit(user=USER, namespace=namespace)
                   if e["responseStatus"]["code"] == 403 and control_plane.during_outage(e)]
    print(f"403s to the remediator while the API server came back (RBAC not synced yet): {len(coming_back)}")


async def test_a_recreated_pod_with_the_same_name_is_not_deleted_by_an_old_alert(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas, tmp_path: Path) -> None:
    """Two moments a pod can be replaced under an alert. Before the decision: the identity check reads
    the pod and refuses (`identity_mismatch`, both UIDs named), nothing is sent. After the decision,
    during the restart (its pre_restart held until the test has replaced the pod): the eviction
    carries the UID decided on and the API server's precondition refuses it (409)."""
    old = running_pod(control_plane, namespace, "vllm-0")
    target = exporter.put_pod(namespace, old, "stuck")  # what the exporter saw before the pod was replaced
    control_plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/vllm-0")
    new = running_pod(control_plane, namespace, "vllm-0")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    replaced = tmp_path / "replaced"
    (a,) = await replicas(names=("replica-a",), template={
        "pre_restart": {"argv": [sys.executable, "-c", WAIT_FOR_FILE, str(replaced)], "timeout": "20s"}})

    refused = (await a.webhook(alert(target, "fp-old"))).json()["decisions"][0]
    assert refused["reason"] == "identity_mismatch", refused
    assert old["metadata"]["uid"] in refused["detail"] and new["metadata"]["uid"] in refused["detail"]
    assert pod_removals(control_plane, namespace) == [] and await a.restarts() == []

    # The exporter sees the new pod; its alert is allowed, and the pod is replaced again meanwhile.
    target = exporter.put_pod(namespace, new, "stuck")
    await asyncio.sleep(0.5)  # the replica reuses an exporter read for up to 0.2 s
    assert reasons([await a.webhook(alert(target, "fp-new"))]) == ["allowed"]
    control_plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/vllm-0")
    newest = running_pod(control_plane, namespace, "vllm-0")
    replaced.touch()
    rows = await wait_until(lambda: finished_restarts([a]), 60, "the restart attempt to finish")
    assert [row["result"] for row in rows] == ["error"]
    assert "another UID" in rows[0]["detail"]
    assert pod_removals(control_plane, namespace) == [409]  # the UID precondition, enforced by the API server
    assert pod_or_none(control_plane, namespace, "vllm-0")["metadata"]["uid"] == newest["metadata"]["uid"]
    assert events(control_plane, namespace, "LLMVitalsRestart") == []


# A pre_restart that holds the restart until a file appears (at most 15 s).
WAIT_FOR_FILE = ("import os, sys, time\nend = time.monotonic() + 15\n"
                 "while not os.path.exists(sys.argv[1]) and time.monotonic() < end:\n    time.sleep(0.05)")


async def test_pause_set_on_one_replica_holds_both_and_resuming_on_the_other_lets_one_restart_run(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    target = exporter.put_pod(namespace, running_pod(control_plane, namespace, "vllm-0"), "stuck")
    a, b = await replicas()
    auth = {"Authorization": "Bearer k8s-tier-webhook-s3cret"}
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        paused = await client.post(f"{a.url}/api/v1/pause", json={"until": time.time() + 600, "reason": "upgrade"},
                                   headers=auth)
        assert paused.status_code == 200 and paused.json()["paused"] is True
        assert (await client.get(f"{b.url}/api/v1/pause", headers=auth)).json() == {
            "paused": True, "until": paused.json()["until"], "reason": "upgrade"}
        held = [await r.webhook(alert(target, f"fp-paused-{r.name}")) for r in (a, b)]
        assert reasons(held) == ["paused", "paused"]
        metrics = (await client.get(f"{b.url}/metrics")).text
        assert "llm_vitals_remediator_paused 1.0" in metrics
        assert pod_removals(control_plane, namespace) == []

        resumed = await client.delete(f"{b.url}/api/v1/pause", headers=auth)
        assert resumed.status_code == 200 and resumed.json()["paused"] is False
    assert reasons([await a.webhook(alert(target, "fp-resumed"))]) == ["allowed"]
    await wait_until(lambda: finished_restarts([a, b]), 60, "the restart to finish")
    assert pod_removals(control_plane, namespace) == [201]


async def test_after_a_storm_neither_replica_restarts_within_the_storm_cooldown(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    names = [exporter.put_pod(namespace, running_pod(control_plane, namespace, f"vllm-{i}"), "stuck") for i in range(3)]
    a, b = await replicas(max_unhealthy=1, storm_cooldown="8s", global_cooldown="1s")
    assert reasons([await a.webhook(alert(names[0], "fp-storm"))]) == ["fleet_gate"]
    await wait_until(lambda: asyncio.sleep(0, events(control_plane, namespace, "LLMVitalsFleetGate")), 30,
                     "the fleet_gate Event on the pod")

    for name in names[1:]:
        exporter.set_state(name, "idle")  # the storm is over; vllm-0 is still stuck
    await asyncio.sleep(0.5)  # the replicas reuse an exporter read for up to 0.2 s
    seen_at = shared_state(control_plane, namespace)["storm_seen_at"]
    attempts: list[tuple[float, str]] = []
    for i in range(40):
        replica = (a, b)[i % 2]
        now = time.time()
        word = reasons([await replica.webhook(alert(names[0], f"fp-after-storm-{i}"))])[0]
        attempts.append((round(now - seen_at, 1), word))
        if word == "allowed":
            break
        assert word == "storm_cooldown", attempts
        await asyncio.sleep(1.0)
    assert attempts[-1][1] == "allowed" and attempts[-1][0] >= 8.0 - 0.5, attempts
    assert sum(1 for _, w in attempts if w == "storm_cooldown") >= 2, attempts
    await wait_until(lambda: finished_restarts([a, b]), 60, "the restart to finish")
    assert pod_removals(control_plane, namespace) == [201]


def replica_set(control_plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    labels = {"app": name}
    return control_plane.request("POST", f"/apis/apps/v1/namespaces/{namespace}/replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "server", "image": "llm-vitals-test/none",
                                     "ports": [{"name": "http", "containerPort": 8000}]}]}}}})


def pods_of(control_plane: ControlPlane, namespace: str, app: str) -> list[dict[str, Any]]:
    return control_plane.request("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=app%3D{app}")["items"]


async def test_gpu_fault_cordons_taints_and_moves_the_pod_once_and_leaves_a_node_cordoned_by_others_alone(
        controller_manager: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    """With the controller-manager (deployment, replicaset, serviceaccount controllers) and two Node
    objects. There is no kube-scheduler: the replacement pod stays unbound (nodeName empty)."""
    cp = controller_manager
    node_a, node_b = f"gpu-a-{namespace}", f"gpu-b-{namespace}"
    fault = [{"type": "GpuMemWatch", "status": "True", "reason": "Xid79", "message": "GPU has fallen off the bus"}]
    cp.create_node(node_a, conditions=fault)
    cp.create_node(node_b)
    replica_set(cp, namespace, "vllm")
    (pod,) = await wait_until(lambda: asyncio.sleep(0, pods_of(cp, namespace, "vllm")), 60, "the ReplicaSet's pod")
    name = pod["metadata"]["name"]
    cp.bind_pod(namespace, name, node_a)
    pod = cp.play_kubelet(namespace, name)
    assert pod["spec"]["nodeName"] == node_a
    target = exporter.put_pod(namespace, pod, "stuck", gpu_fault=True, gpu_fault_detail="GpuMemWatch: Xid79: GPU has fallen off the bus")
    a, b = await replicas(gpu_fault_action="cordon_and_move", global_cooldown="1s", max_cordoned_nodes=2)

    answers = await asyncio.gather(*(r.webhook(alert(target, "fp-gpu")) for r in (a, b) * 5))
    assert sorted(set(reasons(answers))) == ["cordon_and_move", "duplicate"]
    assert reasons(answers).count("cordon_and_move") == 1
    rows = await wait_until(lambda: finished_restarts([a, b]), 60, "the move to finish")
    assert [row["result"] for row in rows] == ["ok"], rows

    node = cp.request("GET", f"/api/v1/nodes/{node_a}")
    assert node["spec"]["unschedulable"] is True
    assert {"key": GPU_TAINT_KEY, "value": "GpuMemWatch", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert node["metadata"]["annotations"][CORDONED_BY] in ("replica-a", "replica-b")
    gone = pod_or_none(cp, namespace, name)
    assert gone is None or gone["metadata"].get("deletionTimestamp")  # bound: Terminating, no kubelet to confirm
    assert pod_removals(cp, namespace, name) == [201]

    def replacement() -> list[dict[str, Any]]:
        return [p for p in pods_of(cp, namespace, "vllm") if p["metadata"]["name"] != name
                and not p["metadata"].get("deletionTimestamp")]

    (new,) = await wait_until(lambda: asyncio.sleep(0, replacement()), 60, "the ReplicaSet's replacement pod")
    assert not new["spec"].get("nodeName")  # no kube-scheduler here: it stays Pending, unbound
    assert [e["involvedObject"]["name"] for e in events(cp, "default", "LLMVitalsGpuMove")
            if e["involvedObject"]["name"] == node_a] == [node_a]
    assert [e["involvedObject"]["name"] for e in events(cp, namespace, "LLMVitalsGpuMove")] == [name]

    # The same node again: never twice.
    again = await b.webhook(alert(target, "fp-gpu-again"))
    assert reasons([again]) == ["gpu_fault"] and "already cordoned" in again.json()["decisions"][0]["detail"]

    # A node a human cordoned: the pod is moved, the node is left exactly as it was (no taint, no
    # mark), and nothing ever uncordons it.
    cp.request("PATCH", f"/api/v1/nodes/{node_b}", {"spec": {"unschedulable": True}},
               content_type="application/merge-patch+json")
    other = cp.create_pod(namespace, "pinned", labels={"app": "pinned"}, node=node_b)
    other = cp.play_kubelet(namespace, "pinned")
    target_b = exporter.put_pod(namespace, other, "stuck", gpu_fault=True, gpu_fault_detail="SysLogsXIDError: Xid 48")
    await asyncio.sleep(1.2)  # past the 1 s global cooldown
    assert reasons([await b.webhook(alert(target_b, "fp-gpu-b"))]) == ["cordon_and_move"]
    rows = await wait_until(lambda: finished_restarts([a, b]), 60, "the second move to finish")
    assert "cordoned by someone else: left alone" in next(r for r in rows if r["target"] == target_b)["detail"]
    node_b_now = cp.request("GET", f"/api/v1/nodes/{node_b}")
    assert node_b_now["spec"]["unschedulable"] is True
    # (node.kubernetes.io/not-ready is the API server's own, from TaintNodesByCondition: no kubelet.)
    assert [t for t in node_b_now["spec"].get("taints", []) if t["key"] == GPU_TAINT_KEY] == []
    assert CORDONED_BY not in (node_b_now["metadata"].get("annotations") or {})
    node_writes = [(e["objectRef"]["name"], e["verb"]) for e in cp.audit(resource="nodes", user=USER)
                   if e["objectRef"].get("name") in (node_a, node_b) and e["verb"] != "get"
                   and e["responseStatus"]["code"] == 200]
    assert node_writes == [(node_a, "patch")]  # one cordon of its own node; never a write to node B
    assert pod_removals(cp, namespace, "pinned") == [201]

    # Every right the shipped manifest grants was used here but listing and deleting pods (a group's
    # pods, pod_action: delete: test_workload_safety.py uses those), and no other was asked for. The
    # identity check reads the pod, and its ReplicaSet for the workload (here the bare ReplicaSet).
    assert rights_used(cp, (namespace, "default", None)) == {
        ("create", "leases"), ("get", "leases"), ("update", "leases"), ("create", "pods/eviction"),
        ("create", "events"), ("get", "nodes"), ("patch", "nodes"), ("get", "pods"), ("get", "replicasets")}


def pod_events(control_plane: ControlPlane, namespace: str, reason: str, pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The Events of `reason` on this very pod (its name and UID)."""
    meta = pod["metadata"]
    return [e for e in events(control_plane, namespace, reason)
            if (e["involvedObject"]["name"], e["involvedObject"].get("uid")) == (meta["name"], meta["uid"])]


def event_creates(control_plane: ControlPlane, namespace: str) -> list[int]:
    """The HTTP codes of the remediator's Event creates in `namespace`, sorted (the audit log)."""
    return sorted(e["responseStatus"]["code"]
                  for e in control_plane.audit(verb="create", resource="events", namespace=namespace, user=USER))


async def stopped(replicas: list[Replica]) -> None:
    """SIGTERM every replica: each waits for its background Event writes before it exits, so that
    what is on the API server afterwards is all they will ever write (no settling sleep)."""
    await asyncio.gather(*(r.stop() for r in replicas))


async def test_a_gpu_fault_is_refused_with_one_event_on_the_pod_however_often_the_alert_comes(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    node = f"gpu-{namespace}"
    pod = running_pod(control_plane, namespace, "vllm-0", node=node)
    fault = "GpuMemWatch: Xid79: GPU has fallen off the bus"
    target = exporter.put_pod(namespace, pod, "stuck", gpu_fault=True, gpu_fault_detail=fault)
    a, b = await replicas()  # gpu_fault_action left at its default: refuse
    payload = alert(target, "fp-gpu-refused")

    # Alertmanager's resends of one alert (repeat_interval, the HA pair), landing on either replica.
    answers = [await r.webhook(payload) for r in (a, b, a, b, a, b)]
    assert [x.status_code for x in answers] == [200] * 6
    assert set(reasons(answers)) == {"gpu_fault"}
    await stopped([a, b])

    assert pod_removals(control_plane, namespace) == []
    assert pod_or_none(control_plane, namespace, "vllm-0") is not None
    (event,) = pod_events(control_plane, namespace, "LLMVitalsGpuFault", pod)
    # One write per replica (each skips its own resends); the API server kept the first, refused the copy.
    assert event_creates(control_plane, namespace) == [201, 409]
    assert event["type"] == "Warning" and event["source"]["component"] == "llm-vitals-remediator"
    # What a human needs from `kubectl describe pod`: which alert, the fault, its node, what to do.
    message = event["message"]
    assert message.startswith("LLMServerStuck not acted on: gpu_fault: ") and "not help" in message, message
    assert fault in message and f"node {node}" in message and "cordon_and_move" in message, message


async def test_once_the_budget_is_spent_the_circuit_opens_and_the_pod_gets_an_event_instead_of_a_delete(
        control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn, replicas) -> None:
    """A pod that comes back under its own name (a StatefulSet's) and gets stuck again."""
    first = running_pod(control_plane, namespace, "vllm-0")
    target = exporter.put_pod(namespace, first, "stuck")
    a, b = await replicas(budget={"max_restarts": 1, "window": "1h"}, global_cooldown="0s")
    assert reasons([await a.webhook(alert(target, "fp-circuit"))]) == ["allowed"]
    assert [row["result"] for row in await wait_until(lambda: finished_restarts([a, b]), 60, "the restart")] == ["ok"]
    assert pod_removals(control_plane, namespace) == [201]

    again = running_pod(control_plane, namespace, "vllm-0")  # recreated: a new UID, stuck once more
    exporter.put_pod(namespace, again, "stuck", process_start_time=time.time() - 60)
    await asyncio.sleep(0.5)  # the replicas reuse an exporter read for up to 0.2 s (else: the old pod's UID)
    payload = alert(target, "fp-circuit", starts_at=time.time())  # the alert's next firing episode
    answers = [await r.webhook(payload) for r in (b, a, b, a)]
    assert [x.status_code for x in answers] == [200] * 4
    assert set(reasons(answers)) == {"circuit_open"}
    await stopped([a, b])

    assert pod_removals(control_plane, namespace) == [201]  # still only the first restart
    assert pod_or_none(control_plane, namespace, "vllm-0")["metadata"]["uid"] == again["metadata"]["uid"]
    (event,) = pod_events(control_plane, namespace, "LLMVitalsCircuitOpen", again)
    assert event_creates(control_plane, namespace) == [201, 201, 409]  # the restart's Event, this one, its copy
    assert event["type"] == "Warning"
    assert event["message"].startswith("LLMServerStuck not acted on: circuit_open: restart budget exhausted")
    assert "POST /api/v1/circuit/reset" in event["message"]
    assert len(pod_events(control_plane, namespace, "LLMVitalsRestart", first)) == 1
