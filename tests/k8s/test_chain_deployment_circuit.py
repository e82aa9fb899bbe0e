"""A Deployment whose new pods keep hanging, on real parts from the API server to the remediator: its
circuit opens for the Deployment after max_restarts evictions across pod names, and the reset naming
the Deployment closes it.

    Deployment vllm (2 replicas) -> kube-controller-manager: its ReplicaSet, 2 pods, a new pod for
        each one evicted (the evicted pod stays Terminating: no kubelet confirms it)
    this test, as scheduler and kubelet: pods/binding to a Node, pods/status Running with a pod IP:
        the first pod and every replacement on HUNG_IP, where llm-vitals-sim is hung with requests in
        flight (a model that hangs every time); the other pod on IDLE_IP, an idle llm-vitals-sim
    llm-vitals-exporter (the CLI) -- list+watch pods and ReplicaSets with its own token and the rights
        of deploy/kubernetes/base/exporter.yaml --> each pod a target, workload Deployment/<ns>/vllm
    real Prometheus (the shipped rules, `for:` 1 s) -> real Alertmanager (alerts/alertmanager.yml,
        re-sending a firing alert every 2 s) -> llm-vitals-remediator: one replica in Lease mode (its
        state in the Lease, the RBAC of deploy/kubernetes/base/remediator.yaml) -> POST pods/{name}/eviction

With max_restarts 2: the first pod and its replacement are evicted; the replacement's replacement
is refused `circuit_open` for the Deployment at each of Alertmanager's re-sends; the reset naming
the Deployment closes the circuit and the next re-send evicts it. The exporter's target_info names
the Deployment for every pod it watched.

The same case with two remediator replicas splitting the evictions between them, the exporter's
answers from a stand-in: test_workload_safety.py.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from e2e_chain import Load, _start_cli
from prometheus_client.parser import text_string_to_metric_families
from stack import RULES_FILE, ManagedProcess, RealStack, alertmanager_config, write_rules_with_short_for
from waits import wait_until

from .control_plane import ControlPlane
from .replicas import (
    AUTH,
    TOKEN,
    Replica,
    grant_remediator_rbac,
    pod_evictions,
    pod_removals,
    start_replicas,
    stop_chain,
)
from .test_deployment_pod_by_pod import EXPORTER, manifest, running, start_backends
from .test_pod_workload import create_deployment
from .test_workload_safety import shared_state

# Pod IPs of their own (all of 127/8 is on `lo`): test_deployment_pod_by_pod.py, perhaps running on the
# other worker, has 127.0.0.2-5.
HUNG_IP, IDLE_IP = "127.0.0.6", "127.0.0.7"
MAX_RESTARTS = 2

# The servers and the API server polled here may not answer yet: an HTTP error is "not yet".
until = partial(wait_until, interval=0.2, retry_on=(httpx.HTTPError,))


def live_pods(cp: ControlPlane, ns: str) -> list[str]:
    """The names of the Deployment's pods not being deleted, sorted."""
    items = cp.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3Dvllm")["items"]
    return sorted(p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp"))


def pods_made(cp: ControlPlane, ns: str, known: tuple[str, ...], count: int) -> list[str] | None:
    """`count` live pods of the Deployment that are not in `known`, once there are as many."""
    new = [pod for pod in live_pods(cp, ns) if pod not in known]
    return new if len(new) == count else None


def being_deleted(cp: ControlPlane, ns: str, pod: str) -> bool:
    return bool(cp.request("GET", f"/api/v1/namespaces/{ns}/pods/{pod}")["metadata"].get("deletionTimestamp"))


async def evicted(cp: ControlPlane, ns: str, pod: str, timeout: float) -> list[int]:
    """Once the pod is being deleted: the codes of the remediator's evictions of it (the audit log,
    read only then: it is the whole tier's, and its record may come a moment after the change)."""
    await until(lambda: asyncio.to_thread(being_deleted, cp, ns, pod), timeout, f"{pod} being deleted")
    return await until(lambda: asyncio.to_thread(pod_evictions, cp, ns, pod), 10, f"{pod}'s eviction in the audit log")


def run_pod(cp: ControlPlane, ns: str, pod: str, node: str, ip: str) -> None:
    """The scheduler's part and the kubelet's: bind the pod to `node`, report it Running on `ip`."""
    cp.bind_pod(ns, pod, node)
    cp.play_kubelet(ns, pod, ip=ip)


async def target_info(http: httpx.AsyncClient, exporter_url: str) -> dict[str, dict[str, str]]:
    """pod -> the labels of its `llm_vitals_target_info` sample on the exporter's /metrics."""
    text = (await http.get(f"{exporter_url}/metrics")).text
    return {sample.labels["pod"]: sample.labels for family in text_string_to_metric_families(text)
            if family.name == "llm_vitals_target_info" for sample in family.samples}


async def test_a_deployment_whose_new_pods_keep_hanging_opens_its_circuit_for_the_deployment_and_the_reset_closes_it(
        controller_manager: ControlPlane, namespace: str, tmp_path: Path) -> None:
    cp, ns = controller_manager, namespace
    began = time.monotonic()
    workload = f"Deployment/{ns}/vllm"
    node = f"node-{ns}"
    http = httpx.AsyncClient(trust_env=False, timeout=10)
    processes: list[ManagedProcess] = []
    load: Load | None = None
    replica: Replica | None = None
    # The exporter's rights as shipped: the pods and ReplicaSets Role, and the nodes ClusterRole (its node watch).
    cp.grant(ns, EXPORTER, manifest("base/exporter.yaml", "Role", "llm-vitals-exporter-pods")["rules"],
             name="llm-vitals-exporter-pods")
    cp.grant(None, EXPORTER, manifest("base/exporter.yaml", "ClusterRole", "llm-vitals-exporter-nodes-llm")["rules"],
             name="llm-vitals-exporter-nodes")
    grant_remediator_rbac(cp, ns)
    cp.create_node(node)
    try:
        backends, port = await start_backends(tmp_path, http, (HUNG_IP, IDLE_IP))
        processes += backends
        hung_url = f"http://{HUNG_IP}:{port}"
        load = await Load(hung_url, workers=2, max_tokens=200).start()
        await until(lambda: running(http, hung_url), 30, "requests running on the server that hangs")
        (await http.post(f"{hung_url}/admin/fault", json={"fault": "hang"})).raise_for_status()

        exporter, exporter_url = await _start_cli("exporter", tmp_path, http, lambda listen: {
            "listen": f"127.0.0.1:{listen}", "poll_interval": 0.5, "metrics_timeout": 10, "log_level": "info",
            "discovery": [{"kubernetes": {
                "namespaces": [ns], "selector": "app=vllm", "port": "http", "kubeconfig": str(cp.kubeconfig(EXPORTER)),
                "template": {"engine": "vllm", "stuck_after": 3, "startup_grace": 30,
                             "canary": {"interval": 3, "timeout": 5}}}}],
        })
        processes.append(exporter)
        (replica,) = await start_replicas(cp, ns, exporter_url, tmp_path / "replicas", names=("replica-a",),
                                          budget={"max_restarts": MAX_RESTARTS, "window": "1h",
                                                  "backoff": {"initial": "0s"}},
                                          global_cooldown="0s", max_unhealthy=1)
        rules = write_rules_with_short_for(RULES_FILE, tmp_path / "rules.yml", seconds=1)
        am = alertmanager_config(f"{replica.url}/webhook", TOKEN, tmp_path, repeat_interval="2s")
        async with RealStack(tmp_path / "stack", scrape_targets={"llm-vitals": [exporter_url.removeprefix("http://")]},
                             rule_files=[rules], alertmanager_config=am) as stack:
            started = time.monotonic()
            create_deployment(cp, ns, "vllm", 2, port)
            first, other = await until(lambda: asyncio.to_thread(pods_made, cp, ns, (), 2), 60, "the ReplicaSet's 2 pods")
            run_pod(cp, ns, first, node, HUNG_IP)
            run_pod(cp, ns, other, node, IDLE_IP)
            watched: dict[str, dict[str, str]] = {}  # pod -> its target_info labels, as the exporter had them
            stuck, hung_pods = first, [first]

            async def watched_now(pod: str) -> bool:
                watched.update(await target_info(http, exporter_url))
                return pod in watched

            # Each hung pod is evicted (Alertmanager's webhook, the remediator's gate), and the
            # ReplicaSet's pod in its place hangs too.
            for _ in range(MAX_RESTARTS):
                await until(partial(watched_now, stuck), 30, f"{stuck} a target of the exporter")
                assert await evicted(cp, ns, stuck, 60) == [201]
                (stuck,) = await until(partial(asyncio.to_thread, pods_made, cp, ns, (*hung_pods, other), 1),
                                       30, "the ReplicaSet's pod in place of the evicted one")
                hung_pods.append(stuck)
                run_pod(cp, ns, stuck, node, HUNG_IP)
            evicted_at = time.monotonic()

            # The third hung pod: refused for the Deployment, again at Alertmanager's re-send.
            target = f"{ns}/{stuck}"
            await until(partial(watched_now, stuck), 30, f"{stuck} a target of the exporter")

            async def refusals() -> list[dict[str, Any]]:
                return [r for r in await replica.actions() if r["target"] == target and r["reason"] == "circuit_open"]

            refused = await until(lambda: _at_least(2, refusals), 60, f"{target} refused twice")
            refused_at = time.monotonic()
            assert all(r["workload"] == workload and workload in r["detail"] for r in refused), refused
            assert not await asyncio.to_thread(being_deleted, cp, ns, stuck)
            assert pod_removals(cp, ns) == [201] * MAX_RESTARTS  # evictions only, none since
            assert workload in shared_state(cp, ns)["open_circuits"]
            metrics = await replica.text("/metrics")
            assert f'llm_vitals_remediator_circuit_open{{workload="{workload}"}} 1.0' in metrics
            firing = await stack.prometheus_alerts("firing")
            assert any(a["labels"]["alertname"] == "LLMServerStuck" and a["labels"]["target"] == target
                       for a in firing), firing

            # The reset names the Deployment; Alertmanager's next re-send of the same alert evicts the pod.
            reset = await http.post(f"{replica.url}/api/v1/circuit/reset", json={"workload": workload}, headers=AUTH)
            assert reset.status_code == 200 and reset.json() == {"reset": [workload], "were_open": [workload]}
            assert workload not in shared_state(cp, ns)["open_circuits"]
            assert await evicted(cp, ns, stuck, 30) == [201]
            reset_evicted_at = time.monotonic()
            assert pod_removals(cp, ns) == [201] * (MAX_RESTARTS + 1)
            rows = await until(lambda: _finished(replica, len(hung_pods)), 30, "the restart after the reset to finish")
            assert [(r["target"], r["workload"], r["result"]) for r in rows] == [
                (f"{ns}/{pod}", workload, "ok") for pod in hung_pods]

        # Every pod the exporter watched (the hung ones and the other) was the Deployment in its target_info.
        assert {pod: (labels["namespace"], labels["workload"]) for pod, labels in watched.items()} == {
            pod: (ns, workload) for pod in (*hung_pods, other)}
        assert pod_removals(cp, ns, other) == []
        print(f"pods {hung_pods} evicted in turn, {other} left alone; {MAX_RESTARTS} evictions "
              f"{evicted_at - started:.1f} s after the Deployment was made, the circuit_open refusals "
              f"{refused_at - evicted_at:.1f} s later, the eviction after the reset "
              f"{reset_evicted_at - refused_at:.1f} s after that; {time.monotonic() - began:.1f} s in all")
    finally:
        await stop_chain(load, [replica] if replica is not None else [], processes, http)


async def _at_least(count: int, rows) -> list[dict[str, Any]] | None:
    found = await rows()
    return found if len(found) >= count else None


async def _finished(replica: Replica, count: int) -> list[dict[str, Any]] | None:
    """The replica's restart rows once there are `count` and none is pending."""
    rows = await replica.restarts()
    return rows if len(rows) == count and all(row["result"] != "pending" for row in rows) else None
