"""A Deployment of 4 vLLM pods watched pod by pod, then scaled to 3: the README's Kubernetes listing.

    Deployment llm-vitals-vllm (deploy/kubernetes/native/vllm.yaml, the chart's render; 4 replicas)
        -> kube-controller-manager: ReplicaSet, 4 pods
        -> this test, as scheduler and kubelet: pods/binding to two Node objects, pods/status Running
           with the pod IPs 127.0.0.2-5 (all of 127/8 is on `lo`)
    llm-vitals-sim, one process per pod IP, on the pod's `http` port: busy, idle, stuck, idle
    llm-vitals-exporter (the CLI) -- list+watch app.kubernetes.io/name=vllm (the shipped selector),
        its own token, the manifest's Role -->
        GET /api/v1/targets: each pod a target `<namespace>/<pod>` with its node and state

The listing, as `jq -r '.targets[] | [.name, .node, .state] | @tsv'` prints it, before and after
the scale, is written to .cache/k8s-deployment-listing.txt (the README quotes a run of it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import yaml
from e2e_chain import Load, _cli, _start_cli
from stack import ManagedProcess
from waits import wait_until

from llm_vitals.demo.ports import free_port

from .control_plane import REPO, ControlPlane

EXPORTER = "llm-vitals-exporter"
MANIFESTS = REPO / "deploy" / "kubernetes"  # the chart's render: base/ and the variants' vllm.yaml
DEPLOYMENT = "llm-vitals-vllm"
LISTING = REPO / ".cache" / "k8s-deployment-listing.txt"
POD_IPS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
STATES = ("busy", "idle", "stuck", "idle")  # of the pod given POD_IPS[i] (pods sorted by name)
POLL = 0.5  # the exporter's poll_interval, seconds
STUCK_AFTER = 3.0


def manifest(name: str, kind: str, object_name: str) -> dict[str, Any]:
    """One object of a shipped manifest, as written there."""
    return next(d for d in yaml.safe_load_all((MANIFESTS / name).read_text())
                if d and d["kind"] == kind and d["metadata"]["name"] == object_name)


def shipped_selector() -> str:
    """The label selector the shipped fleet exporter finds the vLLM pods by."""
    config = manifest("base/exporter.yaml", "ConfigMap", "llm-vitals-exporter")["data"]["exporter.yaml"]
    return yaml.safe_load(config)["discovery"][0]["kubernetes"]["selector"]


def shipped_deployment(port: int) -> dict[str, Any]:
    """deploy/kubernetes/native/vllm.yaml's Deployment, changed only where this API server, this machine
    or this test needs it."""
    deployment = manifest("native/vllm.yaml", "Deployment", DEPLOYMENT)
    deployment["spec"]["replicas"] = len(POD_IPS)  # the chart ships 2; the listing shows 4
    spec = deployment["spec"]["template"]["spec"]
    # The shim is a native sidecar (an init container with restartPolicy Always, Kubernetes >= 1.29).
    # kube-apiserver 1.20 refuses a probe on an init container (422 "must not be set for init
    # containers") and drops the restartPolicy it does not know. No kubelet runs it here anyway.
    for container in spec["initContainers"]:
        container.pop("startupProbe")
    # Every pod IP here is on this one host: the `http` port (8000 as shipped) is one found free on
    # all four pod IPs, so that parallel runs and anything else listening on 8000 cannot collide.
    (server,) = spec["containers"]
    (http_port,) = [p for p in server["ports"] if p["name"] == "http"]
    http_port["containerPort"] = port
    return deployment


async def start_backends(run_dir: Path, http: httpx.AsyncClient,
                         ips: Sequence[str] = POD_IPS) -> tuple[list[ManagedProcess], int]:
    """One `llm-vitals-sim` per pod IP, all on one port (the pods' `http` containerPort); retried
    on another port when one of the addresses already has it."""
    for attempt in range(1, 4):
        port = free_port(ips[0])
        processes = [ManagedProcess(f"sim-{ip}", [
            _cli("llm-vitals-sim"), "--host", ip, "--port", str(port), "--backends", "1", "--no-control",
            "--max-num-seqs", "2", "--tokens-per-second", "50", "--log-level", "warning",
        ], run_dir / f"sim-{ip}.log", f"http://{ip}:{port}/admin/state") for ip in ips]
        started = await asyncio.gather(*(p.start(http) for p in processes), return_exceptions=True)
        failed = [r for r in started if isinstance(r, BaseException)]
        if not failed:
            return processes, port
        for process in processes:
            await process.stop()
        if attempt == 3 or not any(p.address_in_use() for p in processes):
            raise failed[0]
    raise AssertionError("unreachable")


# The servers polled here may not answer yet: an HTTP error is "not yet".
until = partial(wait_until, interval=0.1, retry_on=(httpx.HTTPError,))


async def running(http: httpx.AsyncClient, url: str) -> bool:
    """True once the simulated server at `url` has requests running."""
    return (await http.get(f"{url}/admin/state")).json()["running"] > 0


async def test_a_deployment_is_watched_pod_by_pod_and_a_scaled_away_pod_leaves_the_targets(
        controller_manager: ControlPlane, tmp_path: Path) -> None:
    cp = controller_manager
    # Named `llm-xxxxxx` rather than by the `namespace` fixture: it shows in every target name of the listing.
    ns = cp.new_namespace("llm")
    suffix = ns.rsplit("-", 1)[1]
    nodes = [f"gpu-node-1-{suffix}", f"gpu-node-2-{suffix}"]  # cluster-wide names: unique per run
    http = httpx.AsyncClient(trust_env=False, timeout=10)
    processes: list[ManagedProcess] = []
    loads: list[Load] = []
    # The exporter's rights as shipped: the pods Role, and the nodes ClusterRole (its GPU-fault node watch).
    cp.grant(ns, EXPORTER, manifest("base/exporter.yaml", "Role", "llm-vitals-exporter-pods")["rules"],
             name="llm-vitals-exporter-pods")
    cp.grant(None, EXPORTER, manifest("base/exporter.yaml", "ClusterRole", "llm-vitals-exporter-nodes-llm")["rules"],
             name="llm-vitals-exporter-nodes")
    selector = shipped_selector()
    started = time.monotonic()
    try:
        backends, port = await start_backends(tmp_path, http)
        processes += backends
        exporter, exporter_url = await _start_cli("exporter", tmp_path, http, lambda listen: {
            "listen": f"127.0.0.1:{listen}", "poll_interval": POLL, "log_level": "info",
            "discovery": [{"kubernetes": {
                "namespaces": [ns], "selector": selector, "port": "http", "kubeconfig": str(cp.kubeconfig(EXPORTER)),
                "template": {"engine": "vllm", "stuck_after": STUCK_AFTER, "startup_grace": 30}}}],
        })
        processes.append(exporter)

        for node in nodes:
            cp.create_node(node)
        cp.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", shipped_deployment(port))

        def pods() -> list[dict[str, Any]]:
            return cp.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={quote(selector)}")["items"]

        made = await until(lambda: asyncio.sleep(0, len(p := pods()) == 4 and p), 60, "the ReplicaSet's 4 pods")
        names = sorted(p["metadata"]["name"] for p in made)
        for i, (pod, ip) in enumerate(zip(names, POD_IPS, strict=True)):
            cp.bind_pod(ns, pod, nodes[i // 2])
            cp.play_kubelet(ns, pod, ip=ip)
        expected = {f"{ns}/{pod}": (nodes[i // 2], state) for i, (pod, state) in enumerate(zip(names, STATES, strict=True))}

        # Load on the busy and the stuck pod's servers; the stuck one hangs once its requests run.
        busy, stuck = (f"http://{POD_IPS[STATES.index(s)]}:{port}" for s in ("busy", "stuck"))
        loads = [await Load(url, workers=2, max_tokens=200).start() for url in (busy, stuck)]
        await until(lambda: running(http, stuck), 30, "requests running on the stuck pod's server")
        (await http.post(f"{stuck}/admin/fault", json={"fault": "hang"})).raise_for_status()

        async def listing() -> list[tuple[str, str, str]]:
            answer = (await http.get(f"{exporter_url}/api/v1/targets")).json()
            return [(t["name"], t["node"], t["state"]) for t in answer["targets"]]

        async def shows(wanted: dict[str, tuple[str, str]]) -> list[tuple[str, str, str]] | None:
            rows = await listing()
            return rows if {name: (node, state) for name, node, state in rows} == wanted else None

        before = await until(lambda: shows(expected), 30, f"the 4 pods as targets: {expected}")

        # Scale to 3: the controller-manager deletes one pod, gracefully (60 s as shipped); with no
        # kubelet to confirm it the pod stays Terminating. A pod with a deletionTimestamp is no target
        # (llm_vitals/exporter/discovery/kubernetes.py: its server is going away on purpose).
        patched = time.monotonic()
        cp.request("PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/{DEPLOYMENT}", {"spec": {"replicas": 3}},
                   content_type="application/merge-patch+json")
        (gone,) = await until(lambda: asyncio.sleep(0, [p["metadata"]["name"] for p in pods()
                                                          if p["metadata"].get("deletionTimestamp")]),
                              30, "the ReplicaSet deleting one pod")
        seen_deleting = time.monotonic()
        # Within a poll or two of the deletion (the watch delivers it at once; the test sees it late).
        remaining = {name: view for name, view in expected.items() if name != f"{ns}/{gone}"}
        after = await until(lambda: shows(remaining), 4 * POLL, f"{ns}/{gone} leaving the targets")
        left = time.monotonic()
        status = (await http.get(f"{exporter_url}/api/v1/discovery")).json()["sources"][0]
        assert status["skipped"] == {f"{ns}/{gone}": "terminating: the pod is being deleted"}
        assert len(pods()) == 4  # still there, Terminating: only its target went

        LISTING.parent.mkdir(exist_ok=True)
        LISTING.write_text(
            f"# tests/k8s/test_deployment_pod_by_pod.py: Deployment {DEPLOYMENT} in {ns}, 4 replicas\n"
            + "".join("\t".join(row) + "\n" for row in before)
            + f"# after PATCH spec.replicas=3 ({gone} deleted, Terminating)\n"
            + "".join("\t".join(row) + "\n" for row in after))
        print(LISTING.read_text())
        print(f"scaled to 3: a pod deleting {seen_deleting - patched:.2f} s and its target gone "
              f"{left - patched:.2f} s after the PATCH; {time.monotonic() - started:.1f} s in all")
    finally:
        for load in loads:
            await load.stop()
        for process in reversed(processes):
            await process.stop()
            print(process.log_tail(15))
        await http.aclose()

