"""Drills 5 and 6: the whole chain, judged by the real cluster.

Prometheus and Alertmanager (Debian's, on this machine's loopback, outside the cluster) scrape the
fleet exporter, which discovers the pods through the API server with its own ServiceAccount and the
shipped RBAC; the remediator runs in the cluster as its StatefulSet of 2 (its in-cluster service
account, its shared Lease, a journal each on a PersistentVolume). Alertmanager delivers every alert
to both replicas, as an HA pair of receivers does.

5. a stuck pod is deleted (name + UID), the ReplicaSet replaces it, the scheduler binds the new one
   and its kubelet starts it; the exporter follows the new pod to idle/busy; exactly one restart
   between the two replicas, and an Event records it;
6. a GPU condition on the stuck pod's node: `gpu_fault_action: cordon_and_move` cordons and taints
   that node, and the pod comes back on the other node; nothing is ever uncordoned.

The monitoring stack reaches into the cluster through forwarders (tests/kubelet/nsfwd.py): host
127.0.0.1 ports whose connections start in the cluster's namespace.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import aiohttp
import httpx
import pytest
from stack import RULES_FILE, RealStack, alertmanager_config, write_rules_with_short_for

from llm_vitals.demo.load import Load

from .tier import Tier, restarts, since
from .workloads import NAMESPACE, Workload, fleet_exporter, journal_volumes, remediator, simulator

FLEET = [Workload(f"vllm-{x}", port, port + 1500, simulator(port), labels={"fleet": "yes"})
         for x, port in (("a", 8110), ("b", 8120), ("c", 8130))]
EXPORTER_PORT = 9481  # the fleet exporter's (shipped: 9471, which the shims use)
REMEDIATOR_PORT = 9472
COOLDOWN_S = 30.0  # workloads.remediator's global_cooldown
T = TypeVar("T")


class LoopThread:
    """An event loop in a thread of its own, for the monitoring stack's async API from sync drills."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="stack-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class Fleet:
    def __init__(self, tier: Tier, exporter_url: str, remediator_urls: list[str], stack: RealStack, loop: LoopThread):
        self.tier, self.exporter_url, self.remediator_urls, self.stack, self.loop = tier, exporter_url, remediator_urls, stack, loop

    def targets(self) -> dict[str, dict[str, Any]]:
        answer = httpx.get(f"{self.exporter_url}/api/v1/targets", timeout=5, trust_env=False)
        return {t["name"]: t for t in answer.json()["targets"]}

    def target(self, pod: str) -> dict[str, Any] | None:
        try:
            return self.targets().get(f"{NAMESPACE}/{pod}")
        except (httpx.HTTPError, ValueError):
            return None

    def restarts_run(self) -> float:
        return sum(self.tier.metric(url, "llm_vitals_remediator_restarts_total") for url in self.remediator_urls)

    def firing(self, pod: str) -> bool:
        alerts = self.loop.run(self.stack.prometheus_alerts("firing"))
        return any(a["labels"].get("target") == f"{NAMESPACE}/{pod}" and a["labels"].get("alertname") == "LLMServerStuck"
                   for a in alerts)


@pytest.fixture(scope="module")
def fleet(tier: Tier) -> Iterator[Fleet]:
    began = time.time()
    for w in FLEET:
        tier.deploy(w)
    tier.apply(fleet_exporter(tier.rendered, tier.image, EXPORTER_PORT))
    exporter_pod = tier.wait_ready("llm-vitals-exporter", 240)
    journals = [tier.cluster.run / f"journal-{i}" for i in range(2)]
    for d in journals:
        d.mkdir()
        os.chown(d, 10001, 10001)  # the image's uid; a provisioned volume would get it from fsGroup
    tier.apply(journal_volumes(journals))
    # No cluster DNS here: the remediator is told the exporter's pod address instead of its Service name.
    tier.apply(remediator(tier.rendered, tier.image, f"http://{exporter_pod.node}:{EXPORTER_PORT}"))
    replicas = tier.history.wait(lambda: (r := [p for p in tier.history.live("llm-vitals-remediator") if p.ready])
                                 and len(r) == 2 and r, 240, "both remediator replicas Ready")
    for w in FLEET:
        tier.wait_ready(w.name, 240)
    exporter_url = tier.url(exporter_pod.node, EXPORTER_PORT)
    remediator_urls = [tier.url(p.node, REMEDIATOR_PORT) for p in replicas]
    run = tier.cluster.run / "monitoring"
    run.mkdir()
    rules = write_rules_with_short_for(RULES_FILE, run / "rules.yml", seconds=2)
    am = alertmanager_config(f"{remediator_urls[0]}/webhook", tier.webhook_token, run, repeat_interval="10s")
    [receiver] = [r for r in am["receivers"] if r["name"] == "llm-vitals-remediator"]
    first = receiver["webhook_configs"][0]
    receiver["webhook_configs"] = [{**first, "url": f"{url}/webhook"} for url in remediator_urls]
    loop = LoopThread()
    stack = RealStack(run, scrape_targets={"llm-vitals": [exporter_url.removeprefix("http://")]},
                      rule_files=[rules], alertmanager_config=am)
    loop.run(stack.__aenter__())
    fleet = Fleet(tier, exporter_url, remediator_urls, stack, loop)
    tier.report.facts["fleet ready s"] = round(time.time() - began, 1)
    tier.report.facts["fleet"] = {"exporter": exporter_pod.node, "remediators": [p.node for p in replicas]}
    try:
        yield fleet
    finally:
        loop.run(stack.close())
        loop.close()


def _wait_serving(fleet: Fleet, pod: str, timeout: float = 120) -> dict[str, Any]:
    return fleet.tier.history.wait(lambda: (t := fleet.target(pod)) and t["state"] in ("idle", "busy") and t,
                                   timeout, f"the exporter to judge llm/{pod} idle or busy")


def _hang_under_load(fleet: Fleet, w: Workload, pod: str, pod_node: str, until) -> tuple[float, Any]:
    """Load the pod's server, hang its engine once the exporter reads it busy (a hang stops admitting
    requests too: work must be in flight first); run `until()` with the load on."""
    server = fleet.tier.url(pod_node, w.server_port)

    async def body() -> tuple[float, Any]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            load = Load(session, server, workers=6, max_tokens=1500)
            load.start()
            try:
                await asyncio.to_thread(fleet.tier.history.wait, lambda: (t := fleet.target(pod)) and t["state"] == "busy",
                                        60, f"the exporter to read llm/{pod} busy", 0.5)
                async with session.post(f"{server}/admin/fault", json={"fault": "hang"}) as answer:
                    assert answer.status == 200, await answer.text()
                wedged = time.time()
                return wedged, await asyncio.to_thread(until)
            finally:
                await load.stop()

    return asyncio.run(body())


def _deleted(tier: Tier, workload: str, pod: str) -> float | None:
    return next((p.at for p in tier.history.of_workload(workload) if p.name == pod and (p.deleting or p.event == "DELETED")),
                None)


def test_a_stuck_pod_is_deleted_once_replaced_and_followed_by_the_exporter(fleet: Fleet):
    tier, w = fleet.tier, FLEET[0]
    [pod] = tier.history.live(w.name)
    _wait_serving(fleet, pod.name)
    restarts_before = fleet.restarts_run()
    firing_at: list[float] = []

    def until_deleted() -> float:
        def seen() -> float | None:
            if not firing_at and fleet.firing(pod.name):
                firing_at.append(time.time())
            return _deleted(tier, w.name, pod.name)
        return tier.history.wait(seen, 240, f"the remediator to delete {pod.name}", 0.5)

    wedged, deleted = _hang_under_load(fleet, w, pod.name, pod.node, until_deleted)
    new = tier.wait_ready(w.name, 240, other_than=[pod.name])
    created = min(p.at for p in tier.history.of_workload(w.name) if p.name == new.name)
    bound = tier.first(w.name, new.name, lambda p: bool(p.node))
    followed = _wait_serving(fleet, new.name)
    followed_at = time.time()
    # Both replicas got every alert; the Lease let exactly one act.
    tier.history.wait(lambda: fleet.restarts_run() - restarts_before >= 1, 30, "the restart counted")
    time.sleep(5)  # a second replica's restart would have been counted by now (its webhook came at once)
    restarts_run = fleet.restarts_run() - restarts_before
    events = tier.events(pod.name, "LLMVitalsRestart")
    record = {
        "pod": pod.name, "node": pod.node, "replacement": new.name, "replacement_node": new.node,
        "wedge_to_firing_s": since(wedged, firing_at[0] if firing_at else None),
        "wedge_to_deleted_s": round(deleted - wedged, 1),
        "deleted_to_created_s": round(created - deleted, 1), "deleted_to_bound_s": since(deleted, bound),
        "deleted_to_ready_s": round(new.at - deleted, 1), "deleted_to_followed_s": round(followed_at - deleted, 1),
        "followed_state": followed["state"], "restarts_run": restarts_run, "restart_events": len(events),
        "event_messages": [e["message"][:200] for e in events], "restarts": restarts(new),
        "endpoints": [(round(t - wedged, 1), where) for t, where in tier.history.endpoints_of(pod.name)],
        "headline": f"stuck pod deleted {deleted - wedged:.1f} s after the wedge, replacement Ready "
                    f"{new.at - deleted:.1f} s after the deletion on {new.node}, followed {followed['state']}; "
                    f"{restarts_run:g} restart, {len(events)} Event",
    }
    tier.report.drill("remediation", record)
    print(f"\nremediation: {record}")
    assert restarts_run == 1
    assert len(events) == 1 and events[0]["involvedObject"]["uid"] == pod.uid
    assert new.name != pod.name and followed["state"] in ("idle", "busy")
    assert restarts(new) == {"vllm": 0, "vitals-shim": 0}
    tier.report.facts["last restart at"] = deleted


def _set_gpu_condition(tier: Tier, node: str) -> None:
    """What NVSentinel's DCGM monitor writes on a node whose GPU fails (a strategic merge on nodes/status,
    so the kubelet's own conditions stay)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {"type": "GpuMemWatch", "status": "True", "reason": "GpuMemWatchIsNotHealthy",
                 "message": "ErrorCode:DCGM_FR_VOLATILE_DBE_DETECTED (written by the kubelet tier)",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}
    with tier.cluster.client() as client:
        answer = client.patch(f"/api/v1/nodes/{node}/status", content=json.dumps({"status": {"conditions": [condition]}}),
                              headers={"Content-Type": "application/strategic-merge-patch+json"})
    assert answer.status_code == 200, answer.text


def test_a_gpu_fault_cordons_and_taints_the_node_and_the_pod_runs_on_the_other(fleet: Fleet):
    tier, w = fleet.tier, FLEET[1]
    [pod] = tier.history.live(w.name)
    faulty = pod.node
    [other] = [n["metadata"]["name"] for n in tier.get("/api/v1/nodes")["items"] if n["metadata"]["name"] != faulty]
    _wait_serving(fleet, pod.name)
    # One restart or move at a time: the global cooldown after drill 5's restart must be over.
    if (last := tier.report.facts.get("last restart at")) is not None:
        time.sleep(max(0.0, last + COOLDOWN_S + 1 - time.time()))
    _set_gpu_condition(tier, faulty)
    flagged = tier.history.wait(lambda: (t := fleet.target(pod.name)) and t.get("gpu_fault") and t, 60,
                                f"the exporter to flag llm/{pod.name}'s GPU fault")

    def until_deleted() -> float:
        return tier.history.wait(lambda: _deleted(tier, w.name, pod.name), 240, f"{pod.name} moved off {faulty}", 0.5)

    wedged, deleted = _hang_under_load(fleet, w, pod.name, pod.node, until_deleted)
    new = tier.wait_ready(w.name, 240, other_than=[pod.name])
    node = tier.get(f"/api/v1/nodes/{faulty}")
    taints = [t for t in node["spec"].get("taints") or [] if t["key"] == "llm-vitals/gpu-fault"]
    other_node = tier.get(f"/api/v1/nodes/{other}")
    events = tier.events(pod.name) + tier.events(faulty)
    ours = sorted({f"{e['involvedObject']['kind']} {e['reason']}" for e in events if e["reason"].startswith("LLMVitals")})
    record = {
        "pod": pod.name, "faulty_node": faulty, "gpu_fault": flagged["gpu_fault"], "replacement": new.name,
        "replacement_node": new.node, "wedge_to_moved_s": round(deleted - wedged, 1),
        "deleted_to_ready_s": round(new.at - deleted, 1), "cordoned": bool(node["spec"].get("unschedulable")),
        "taints": taints, "other_node_cordoned": bool(other_node["spec"].get("unschedulable")), "events": ours,
        "headline": f"{faulty} cordoned and tainted {taints[0]['value'] if taints else '-'}, pod moved "
                    f"{deleted - wedged:.1f} s after the wedge, Ready on {new.node} {new.at - deleted:.1f} s later",
    }
    tier.report.drill("gpu-fault", record)
    print(f"\ngpu-fault: {record}")
    assert record["cordoned"] and len(taints) == 1 and taints[0]["effect"] == "NoSchedule"
    assert new.node == other != faulty
    assert not record["other_node_cordoned"]
    assert any(e.startswith("Node LLMVitals") for e in ours) and any(e.startswith("Pod LLMVitals") for e in ours), ours
    # Nothing uncordons it: still cordoned after the pod came back elsewhere.
    time.sleep(5)
    assert tier.get(f"/api/v1/nodes/{faulty}")["spec"].get("unschedulable") is True



