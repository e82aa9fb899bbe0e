"""GPU faults from the node, on the real API server: a node condition or taint flags exactly that node's targets.

Two Node objects, targets on each (static targets given their `node`, and pods found by pod
discovery, which fills in the same field from the pod), a live exporter whose node watch uses the `llm-vitals-exporter` token with
exactly the ClusterRole of deploy/kubernetes/base/exporter.yaml. Conditions are written through
nodes/status as NVSentinel's health monitor writes them; taints through the Node's spec.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import yaml
from test_exporter_helpers import BUSY_PAGE, FakeVllm, make_settings, make_target, record, start_exporter, target_json, wait_for

from llm_vitals.exporter.keys import STORE

from .control_plane import ControlPlane


def busy_target(name: str, url: str, **overrides):
    """A target on the static busy page, kept `busy` (not `stuck`) however slow the box: readiness then depends on the GPU fault alone."""
    return make_target(name, url, stuck_after=600, **overrides)

REPO = Path(__file__).resolve().parents[2]
EXPORTER = "llm-vitals-exporter"
MEM_BAD = {"type": "GpuMemWatch", "status": "True", "reason": "GpuMemWatchIsNotHealthy",
           "message": "ErrorCode:DCGM_FR_VOLATILE_DBE_DETECTED GPU:0 Recommended Action=RESTART_VM;"}
MEM_OK = {"type": "GpuMemWatch", "status": "False", "reason": "GpuMemWatchIsHealthy", "message": "No Health Failures"}
READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}


def deployed_node_rules() -> list[dict[str, Any]]:
    """The exporter's ClusterRole rules as shipped, so this test runs with exactly what deploy/ grants."""
    for doc in yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "base" / "exporter.yaml").read_text()):
        if doc and doc["kind"] == "ClusterRole":
            return doc["rules"]
    raise AssertionError("no ClusterRole in deploy/kubernetes/base/exporter.yaml")


async def in_thread(function, *args, **kwargs):
    """The harness is synchronous: keep the exporter's loop (and its watch) running meanwhile."""
    return await asyncio.to_thread(function, *args, **kwargs)


async def fleet(control_plane: ControlPlane, aiohttp_server, aiohttp_client, user: str = EXPORTER):
    """Nodes a and b (fresh names), targets a1, a2 on a and b1 on b, and a live exporter watching as `user`."""
    suffix = secrets.token_hex(3)
    nodes = {"a": f"gpu-a-{suffix}", "b": f"gpu-b-{suffix}"}
    for name in nodes.values():
        await in_thread(control_plane.create_node, name, conditions=[READY, MEM_OK])
    server = await aiohttp_server(FakeVllm(BUSY_PAGE).app())
    url = str(server.make_url(""))
    targets = [busy_target(name, url, node=nodes[name[0]]) for name in ("a1", "a2", "b1")]
    settings = make_settings(targets, gpu_faults={"kubeconfig": str(control_plane.kubeconfig(user)),
                                                  "node_taints": ["nvidia.com/gpu-xid-error"]})
    client = await start_exporter(aiohttp_client, settings)
    records = {name: record(client, name) for name in ("a1", "a2", "b1")}
    return nodes, client, records


def flagged(records) -> set[str]:
    return {name for name, rec in records.items() if rec.gpu_fault}


async def test_a_node_condition_flags_that_nodes_targets_only_and_clears_with_it(control_plane, aiohttp_server, aiohttp_client) -> None:
    await in_thread(control_plane.grant, None, EXPORTER, deployed_node_rules(), name="llm-vitals-exporter-nodes")
    nodes, client, records = await fleet(control_plane, aiohttp_server, aiohttp_client)
    await wait_for(lambda: all(r.verdict.state == "busy" and not r.gpu_fault_errors for r in records.values()),
                   what="every target busy, the nodes listed")
    assert flagged(records) == set()

    await in_thread(control_plane.set_node_conditions, nodes["a"], [READY, MEM_BAD])
    await wait_for(lambda: flagged(records) == {"a1", "a2"}, what="a1 and a2 flagged")
    view = await target_json(client, "a1")
    assert view["gpu_fault"] is True and view["ready"] is False and view["gpu_fault_source"] == "node"
    assert view["gpu_fault_detail"].startswith(f"GpuMemWatchIsNotHealthy: node {nodes['a']} condition GpuMemWatch=True: "
                                               "ErrorCode:DCGM_FR_VOLATILE_DBE_DETECTED")
    assert (await target_json(client, "b1"))["gpu_fault"] is False
    metrics = await (await client.get("/metrics")).text()
    assert 'llm_vitals_gpu_fault{target="a1"} 1.0' in metrics and 'llm_vitals_gpu_fault{target="b1"} 0.0' in metrics
    assert (await client.get("/probe/a2/ready")).status == 503 and (await client.get("/probe/b1/ready")).status == 200
    assert "GpuMemWatchIsNotHealthy" in await (await client.get("/")).text()

    await in_thread(control_plane.set_node_conditions, nodes["a"], [READY, MEM_OK])
    await wait_for(lambda: flagged(records) == set(), what="the fault cleared with the condition")
    assert (await client.get("/probe/a1/ready")).status == 200


async def test_a_taint_flags_that_nodes_targets_only_and_clears_with_it(control_plane, aiohttp_server, aiohttp_client) -> None:
    await in_thread(control_plane.grant, None, EXPORTER, deployed_node_rules(), name="llm-vitals-exporter-nodes")
    nodes, client, records = await fleet(control_plane, aiohttp_server, aiohttp_client)
    await wait_for(lambda: all(not r.gpu_fault_errors for r in records.values()) and all(r.polls for r in records.values()),
                   what="the nodes listed")

    def taint(node: str, taints: list[dict[str, str]]) -> None:
        control_plane.request("PATCH", f"/api/v1/nodes/{node}", {"spec": {"taints": taints}},
                              content_type="application/merge-patch+json")

    await in_thread(taint, nodes["b"], [{"key": "nvidia.com/gpu-xid-error", "value": "79", "effect": "NoSchedule"}])
    await wait_for(lambda: flagged(records) == {"b1"}, what="b1 flagged")
    assert (await target_json(client, "b1"))["gpu_fault_detail"] == (
        f"nvidia.com/gpu-xid-error: node {nodes['b']} is tainted nvidia.com/gpu-xid-error=79:NoSchedule")
    await in_thread(taint, nodes["b"], [{"key": "other.example/maintenance", "effect": "NoSchedule"}])  # not a GPU taint
    await wait_for(lambda: flagged(records) == set(), what="the fault cleared with the taint")


async def test_without_the_node_rights_the_403_is_kept_and_nothing_is_flagged(control_plane, aiohttp_server, aiohttp_client) -> None:
    # The remediator's user holds no list right on nodes: the exporter run with it sees the real 403.
    nodes, client, records = await fleet(control_plane, aiohttp_server, aiohttp_client, user="llm-vitals-remediator")
    await wait_for(lambda: all(r.verdict.state == "busy" and "403" in r.gpu_fault_errors.get("node", "")
                               for r in records.values()), what="busy, the 403 kept")
    await in_thread(control_plane.set_node_conditions, nodes["a"], [READY, MEM_BAD])
    polls = records["a1"].polls
    await wait_for(lambda: records["a1"].polls >= polls + 3, what="three more polls")
    view = await target_json(client, "a1")
    assert view["gpu_fault"] is False and view["ready"] is True
    assert view["gpu_fault_errors"]["node"].startswith("HTTP 403 Forbidden listing nodes: the exporter needs a ClusterRole "
                                                       "with list and watch on nodes")


async def test_the_watch_survives_an_api_server_restart(control_plane, aiohttp_server, aiohttp_client) -> None:
    await in_thread(control_plane.grant, None, EXPORTER, deployed_node_rules(), name="llm-vitals-exporter-nodes")
    nodes, _, records = await fleet(control_plane, aiohttp_server, aiohttp_client)
    await wait_for(lambda: all(not r.gpu_fault_errors and r.polls for r in records.values()), what="the nodes listed")
    await in_thread(control_plane.set_node_conditions, nodes["a"], [READY, MEM_BAD])
    await wait_for(lambda: flagged(records) == {"a1", "a2"}, what="a1 and a2 flagged")

    # Stopped and started from this (the main) thread, never through in_thread: the harness starts
    # its servers with PR_SET_PDEATHSIG, which fires when the *thread* that started one ends, and
    # to_thread's worker ends with the test's loop, taking the restarted API server with it.
    control_plane.stop_apiserver()
    try:
        await wait_for(lambda: "cannot be reached" in records["a1"].gpu_fault_errors.get("node", ""), timeout=60,
                       what="the outage shown")
        assert flagged(records) == {"a1", "a2"}  # what was last seen of the node stays
    finally:
        control_plane.start_apiserver()  # blocks the loop for the start (seconds): the exporter waits, as in any outage
    await wait_for(lambda: not records["a1"].gpu_fault_errors, timeout=60, what="the watch back")
    await in_thread(control_plane.set_node_conditions, nodes["a"], [READY, MEM_OK])
    await wait_for(lambda: flagged(records) == set(), what="cleared after the restart")


async def test_discovered_pods_on_a_faulty_node_are_flagged_a_new_one_there_too(control_plane, namespace, aiohttp_server,
                                                                                 aiohttp_client) -> None:
    """Pod discovery fills in each target's node from its pod: the same rule, on `<namespace>/<pod>` targets."""
    from .test_pod_discovery import deployed_pod_rules, discovery, running_pod

    cp, ns = control_plane, namespace
    await in_thread(cp.grant, None, EXPORTER, deployed_node_rules(), name="llm-vitals-exporter-nodes")
    await in_thread(cp.grant, ns, EXPORTER, deployed_pod_rules(), name="llm-vitals-exporter-pods")
    suffix = secrets.token_hex(3)
    node_a, node_b = f"gpu-a-{suffix}", f"gpu-b-{suffix}"
    for name in (node_a, node_b):
        await in_thread(cp.create_node, name, conditions=[READY, MEM_OK])
    port = (await aiohttp_server(FakeVllm(BUSY_PAGE).app())).port
    for pod, node in (("vllm-a0", node_a), ("vllm-a1", node_a), ("vllm-b0", node_b)):
        await in_thread(running_pod, cp, ns, pod, port, node=node)
    source = discovery(cp, ns)
    source["kubernetes"]["template"]["stuck_after"] = 600  # the static busy page stays busy
    client = await start_exporter(aiohttp_client, make_settings([], discovery=[source], poll_interval=0.5))
    store = client.app[STORE]

    def faulty() -> set[str]:
        return {rec.name for rec in store if rec.gpu_fault}

    await wait_for(lambda: len(store.records) == 3 and all(rec.polls and not rec.gpu_fault_errors for rec in store),
                   what="three discovered targets, their nodes known")
    assert {rec.name: rec.settings.node for rec in store} == {f"{ns}/vllm-a0": node_a, f"{ns}/vllm-a1": node_a,
                                                              f"{ns}/vllm-b0": node_b}
    await in_thread(cp.set_node_conditions, node_a, [READY, MEM_BAD])
    await wait_for(lambda: faulty() == {f"{ns}/vllm-a0", f"{ns}/vllm-a1"}, what="node a's pods flagged")
    view = await (await client.get(f"/api/v1/targets/{ns}/vllm-a0")).json()
    assert view["gpu_fault_detail"].startswith("GpuMemWatchIsNotHealthy: ") and view["node"] == node_a

    # A pod scheduled onto the faulty node later is flagged from its first polls: the cache is applied each poll.
    await in_thread(running_pod, cp, ns, "vllm-a2", port, node=node_a)
    await wait_for(lambda: faulty() == {f"{ns}/vllm-a0", f"{ns}/vllm-a1", f"{ns}/vllm-a2"}, what="the new pod flagged")

    await in_thread(cp.set_node_conditions, node_a, [READY, MEM_OK])
    await wait_for(lambda: faulty() == set(), what="all cleared with the condition")


async def test_a_reload_starts_the_watch_gives_it_the_new_rules_and_stops_it(control_plane, aiohttp_server, aiohttp_client,
                                                                            tmp_path) -> None:
    """Issue 23, part 6: a reload's GPU rules reach the target at its next poll, and node events never
    flip its fault off (the watch only fills the cache; the poll is the one writer of a target's node
    fault); the watch starts and stops with the config."""
    from llm_vitals.exporter.keys import NODE_WATCH
    from llm_vitals.exporter.settings import load_settings

    await in_thread(control_plane.grant, None, EXPORTER, deployed_node_rules(), name="llm-vitals-exporter-nodes")
    node = f"gpu-r-{secrets.token_hex(3)}"
    await in_thread(control_plane.create_node, node, conditions=[READY, MEM_BAD])
    server = await aiohttp_server(FakeVllm(BUSY_PAGE).app())
    url = str(server.make_url(""))
    config = tmp_path / "exporter.yaml"

    def write(node_of_target: str | None, conditions: list[str]) -> None:
        target = busy_target("r1", url, **({"node": node_of_target} if node_of_target else {}))
        config.write_text(yaml.safe_dump({
            "listen": "127.0.0.1:0", "poll_interval": 0.2, "targets": [target],
            "gpu_faults": {"kubeconfig": str(control_plane.kubeconfig(EXPORTER)), "node_conditions": conditions}}))

    async def reload() -> None:
        answer = await client.post("/-/reload")
        assert answer.status == 200, await answer.text()

    write(None, ["SomethingElse"])
    client = await start_exporter(aiohttp_client, load_settings(config, environ={}), config_path=config)
    runner = client.app[NODE_WATCH]
    await wait_for(lambda: record(client, "r1").polls, what="r1 polled")
    assert not runner.running  # no target names a node

    write(node, ["SomethingElse"])  # GpuMemWatch=True on the node, but not a listed condition
    await reload()
    rec = record(client, "r1")
    assert runner.running
    await wait_for(lambda: rec.polls >= 3 and not rec.gpu_fault_errors, what="the node listed")
    assert rec.gpu_fault is None

    write(node, ["GpuMemWatch"])
    polled = rec.polls
    await reload()
    # The source has the new rules at once; the record takes them at the first poll begun after the
    # reload (GPU faults in one home: the poller's aggregate is the one writer).
    await wait_for(lambda: rec.gpu_fault is not None, what="the fault at the next poll")
    assert rec.gpu_fault is not None and rec.gpu_fault.startswith("GpuMemWatchIsNotHealthy")
    assert rec.polls <= polled + 2, (polled, rec.polls)
    # Node events (each one applied by the watch) and polls, interleaved: the fault never flips off.
    seen: list[bool] = []

    async def sample() -> None:
        while True:
            seen.append(rec.gpu_fault is not None)
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample())
    try:
        for beat in range(5):
            await in_thread(control_plane.set_node_conditions, node,
                            [{**READY, "message": f"kubelet is posting ready status ({beat})"}, MEM_BAD])
            await asyncio.sleep(0.3)
    finally:
        sampler.cancel()
    assert seen and all(seen), f"the fault flipped off in {seen.count(False)} of {len(seen)} samples"

    write(None, ["GpuMemWatch"])  # no target names a node any more
    await reload()
    assert not runner.running
    await wait_for(lambda: record(client, "r1").polls >= 2, what="the new r1 polled")
    assert record(client, "r1").gpu_fault is None and "node" not in record(client, "r1").gpu_fault_errors
