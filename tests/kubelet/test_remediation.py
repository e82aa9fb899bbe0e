"""Drills 5 and 6: the whole chain (tests/kubelet/fleet.py), judged by the real cluster.

5. a stuck pod is deleted (name + UID), the ReplicaSet replaces it, the scheduler binds the new one
   and its kubelet starts it; the exporter follows the new pod to idle/busy; exactly one restart
   between the two replicas, an Event records it, and none by the kubelet: the shim heard the
   remediator's word (the whole chain is up), the deleted pod's server never restarted in place,
   and the journal names the remediator as the actor;
6. a GPU condition on the stuck pod's node: `gpu_fault_action: cordon_and_move` cordons and taints
   that node, and the pod comes back on the other node; nothing is ever uncordoned.
"""

from __future__ import annotations

import json
import time

from .fleet import REMEDIATION, Fleet, after_last_restart, deleted, hang_under_load, live, server_restarts, wait_serving
from .tier import Tier, restarts, since


def test_a_stuck_pod_is_deleted_once_replaced_and_followed_by_the_exporter(fleet: Fleet):
    tier, w = fleet.tier, fleet.workloads[REMEDIATION[0].name]
    [pod] = tier.history.live(w.name)
    wait_serving(fleet, pod.name)
    # Everything up: the shim has heard the remediator's word (`act`: not "not heard yet", not armed).
    tier.history.wait(lambda: live(tier, pod, w)[1] == {"mode": "act", "reason": ""}, 60,
                      f"{pod.name}'s shim to hear the remediator's word", 1)
    restarts_before = fleet.restarts_run()
    firing_at: list[float] = []
    backstops: list[tuple[float, dict]] = []  # what the shim's liveness reported while the restart ran

    def until_deleted() -> float:
        def seen() -> float | None:
            if not firing_at and fleet.firing("LLMServerStuck", pod=pod.name):
                firing_at.append(time.time())
            if (found := live(tier, pod, w)[1]) and (not backstops or backstops[-1][1] != found):
                backstops.append((time.time(), found))
            return deleted(tier, w.name, pod.name)
        return tier.history.wait(seen, 240, f"the remediator to delete {pod.name}", 0.5)

    wedged, deleted_at = hang_under_load(fleet, w, [pod], until_deleted)
    new = tier.wait_ready(w.name, 240, other_than=[pod.name])
    created = min(p.at for p in tier.history.of_workload(w.name) if p.name == new.name)
    bound = tier.first(w.name, new.name, lambda p: bool(p.node))
    followed = wait_serving(fleet, new.name)
    followed_at = time.time()
    # Both replicas got every alert; the Lease let exactly one act.
    tier.history.wait(lambda: fleet.restarts_run() - restarts_before >= 1, 30, "the restart counted")
    time.sleep(5)  # a second replica's restart would have been counted by now (its webhook came at once)
    restarts_run = fleet.restarts_run() - restarts_before
    events = tier.events(pod.name, "LLMVitalsRestart")
    actors = sorted({row.get("actor") or "-" for row in fleet.actions(w.name)})
    record = {
        "pod": pod.name, "node": pod.node, "replacement": new.name, "replacement_node": new.node,
        "wedge_to_firing_s": since(wedged, firing_at[0] if firing_at else None),
        "wedge_to_deleted_s": round(deleted_at - wedged, 1),
        "deleted_to_created_s": round(created - deleted_at, 1), "deleted_to_bound_s": since(deleted_at, bound),
        "deleted_to_ready_s": round(new.at - deleted_at, 1), "deleted_to_followed_s": round(followed_at - deleted_at, 1),
        "followed_state": followed["state"], "restarts_run": restarts_run, "restart_events": len(events),
        "event_messages": [e["message"][:200] for e in events], "restarts": restarts(new),
        "server_restarts_in_place": server_restarts(tier, w.name, pod.name), "journal_actors": actors,
        "shim_backstop": [(round(t - wedged, 1), b) for t, b in backstops],
        "endpoints": [(round(t - wedged, 1), where) for t, where in tier.history.endpoints_of(pod.name)],
        "headline": f"stuck pod deleted {deleted_at - wedged:.1f} s after the wedge, replacement Ready "
                    f"{new.at - deleted_at:.1f} s after the deletion on {new.node}, followed {followed['state']}; "
                    f"{restarts_run:g} restart, {len(events)} Event, none by the kubelet",
    }
    tier.report.drill("remediation", record)
    print(f"\nremediation: {record}")
    assert restarts_run == 1
    assert len(events) == 1 and events[0]["involvedObject"]["uid"] == pod.uid
    assert new.name != pod.name and followed["state"] in ("idle", "busy")
    assert restarts(new) == {"vllm": 0, "vitals-shim": 0}
    # One restart per hang: the kubelet never restarted the stuck server in place, and the journal
    # names no actor but the remediator.
    assert record["server_restarts_in_place"] == 0
    assert "kubelet" not in actors, actors
    tier.report.facts["last restart at"] = deleted_at


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
    tier, w = fleet.tier, fleet.workloads[REMEDIATION[1].name]
    [pod] = tier.history.live(w.name)
    faulty = pod.node
    [other] = [n["metadata"]["name"] for n in tier.get("/api/v1/nodes")["items"] if n["metadata"]["name"] != faulty]
    wait_serving(fleet, pod.name)
    after_last_restart(tier)  # drill 5's
    _set_gpu_condition(tier, faulty)
    flagged = tier.history.wait(lambda: (t := fleet.target(pod.name)) and t.get("gpu_fault") and t, 60,
                                f"the exporter to flag llm/{pod.name}'s GPU fault")

    def until_deleted() -> float:
        return tier.history.wait(lambda: deleted(tier, w.name, pod.name), 240, f"{pod.name} moved off {faulty}", 0.5)

    wedged, deleted_at = hang_under_load(fleet, w, [pod], until_deleted)
    new = tier.wait_ready(w.name, 240, other_than=[pod.name])
    node = tier.get(f"/api/v1/nodes/{faulty}")
    taints = [t for t in node["spec"].get("taints") or [] if t["key"] == "llm-vitals/gpu-fault"]
    other_node = tier.get(f"/api/v1/nodes/{other}")
    events = tier.events(pod.name) + tier.events(faulty)
    ours = sorted({f"{e['involvedObject']['kind']} {e['reason']}" for e in events if e["reason"].startswith("LLMVitals")})
    record = {
        "pod": pod.name, "faulty_node": faulty, "gpu_fault": flagged["gpu_fault"], "replacement": new.name,
        "replacement_node": new.node, "wedge_to_moved_s": round(deleted_at - wedged, 1),
        "deleted_to_ready_s": round(new.at - deleted_at, 1), "cordoned": bool(node["spec"].get("unschedulable")),
        "taints": taints, "other_node_cordoned": bool(other_node["spec"].get("unschedulable")), "events": ours,
        "headline": f"{faulty} cordoned and tainted {taints[0]['value'] if taints else '-'}, pod moved "
                    f"{deleted_at - wedged:.1f} s after the wedge, Ready on {new.node} {new.at - deleted_at:.1f} s later",
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
    tier.report.facts["last restart at"] = deleted_at



