"""Pod discovery on the real API server: churn, a restarted API server, compaction, bad input, RBAC, shards.

The exporter under test is a live exporter app (its poll loops and discovery running) whose pod
watch reads the API server with the `llm-vitals-exporter` token, granted exactly the Role of
deploy/kubernetes/base/exporter.yaml in the test's namespace. Pods are real pod objects; the test plays
their kubelet (Running, `podIP: 127.0.0.1`) and their container port points at a FakeVllm on loopback.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from test_exporter_helpers import FakeVllm, make_settings, start_exporter, wait_for

from llm_vitals.exporter.discovery.targetset import shard_of
from llm_vitals.exporter.keys import STORE

from .control_plane import ControlPlane

REPO = Path(__file__).resolve().parents[2]
EXPORTER = "llm-vitals-exporter"
SELECTOR = "app=vllm"
POLL = 1.0  # seconds: "within one poll" below means within this


def deployed_pod_rules() -> list[dict[str, Any]]:
    """The exporter's namespaced Role rules as shipped, so these tests run with exactly what deploy/ grants."""
    for doc in yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "base" / "exporter.yaml").read_text()):
        if doc and doc["kind"] == "Role" and doc["metadata"]["name"] == "llm-vitals-exporter-pods":
            return doc["rules"]
    raise AssertionError("no Role llm-vitals-exporter-pods in deploy/kubernetes/base/exporter.yaml")


async def in_thread(function, *args, **kwargs):
    """The harness is synchronous: keep the exporter's loop (and its watch) running meanwhile."""
    return await asyncio.to_thread(function, *args, **kwargs)


def discovery(cp: ControlPlane, namespace: str, user: str = EXPORTER, **more: Any) -> dict[str, Any]:
    return {"kubernetes": {"namespaces": [namespace], "selector": SELECTOR, "port": "http",
                           "kubeconfig": str(cp.kubeconfig(user)),
                           "template": {"engine": "vllm", "stuck_after": 5, "startup_grace": 0}, **more}}


async def exporter(cp: ControlPlane, namespace: str, aiohttp_client, user: str = EXPORTER, **overrides: Any):
    settings = make_settings([], discovery=[discovery(cp, namespace, user)], poll_interval=POLL, **overrides)
    return await start_exporter(aiohttp_client, settings)


def running_pod(cp: ControlPlane, namespace: str, name: str, port: int, node: str | None = "node-1") -> dict[str, Any]:
    """A pod of the selector, bound to `node`, reported Running on 127.0.0.1 with `port` as its `http` port."""
    cp.create_pod(namespace, name, labels={"app": "vllm"}, node=node, port=port)
    return cp.play_kubelet(namespace, name)


def delete_pod(cp: ControlPlane, namespace: str, name: str) -> None:
    # Grace 0: gone from the API at once (with no kubelet a bound pod would otherwise stay Terminating).
    cp.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}?gracePeriodSeconds=0")


def names(client) -> set[str]:
    return set(client.app[STORE].records)


async def follows(client, expected: set[str], what: str, within: float = POLL, since: float | None = None) -> float:
    """Wait until the exporter's targets are `expected`, at most `within` seconds after the API writes
    returned (now); the time since `since` (before the writes began), for the record."""
    await wait_for(lambda: names(client) == expected, timeout=within, what=what)
    return time.monotonic() - (since if since is not None else time.monotonic())


async def metrics_names(client) -> set[str]:
    text = await (await client.get("/metrics")).text()
    return {line.split('target="', 1)[1].split('"', 1)[0] for line in text.splitlines() if 'target="' in line}


async def test_targets_follow_pod_churn_within_one_poll_and_leave_no_series(control_plane, namespace, aiohttp_server,
                                                                            aiohttp_client) -> None:
    cp = control_plane
    await in_thread(cp.grant, namespace, EXPORTER, deployed_pod_rules(), name="llm-vitals-exporter-pods")
    port = (await aiohttp_server(FakeVllm().app())).port
    client = await exporter(cp, namespace, aiohttp_client)
    ns = namespace
    took = []

    since = time.monotonic()
    for pod in ("vllm-0", "vllm-1", "vllm-2"):
        await in_thread(running_pod, cp, ns, pod, port)
    took.append(await follows(client, {f"{ns}/vllm-0", f"{ns}/vllm-1", f"{ns}/vllm-2"}, "three pods", since=since))
    first = client.app[STORE].get(f"{ns}/vllm-0")
    view = (await (await client.get(f"/api/v1/targets/{ns}/vllm-0")).json())
    assert (view["namespace"], view["pod"], view["node"]) == (ns, "vllm-0", "node-1") and view["pod_uid"]
    assert view["state"] == "starting" or view["polls"] > 0
    await wait_for(lambda: first.verdict.state == "idle", timeout=5 * POLL, what="a first good read")
    info = [line for line in (await (await client.get("/metrics")).text()).splitlines()
            if line.startswith("llm_vitals_target_info") and 'pod="vllm-0"' in line]
    assert info and f'namespace="{ns}"' in info[0] and 'node="node-1"' in info[0]

    since = time.monotonic()
    await in_thread(delete_pod, cp, ns, "vllm-1")
    took.append(await follows(client, {f"{ns}/vllm-0", f"{ns}/vllm-2"}, "vllm-1 dropped", since=since))
    assert f"{ns}/vllm-1" not in await metrics_names(client)
    assert f"{ns}/vllm-1" not in [t["name"] for t in (await (await client.get("/api/v1/targets")).json())["targets"]]
    assert "vllm-1" not in await (await client.get("/")).text()

    since = time.monotonic()
    for pod in ("vllm-3", "vllm-4"):
        await in_thread(running_pod, cp, ns, pod, port)
    took.append(await follows(client, {f"{ns}/vllm-{i}" for i in (0, 2, 3, 4)}, "two more pods", since=since))

    # Recreated under the same name: a new UID, so a new target (fresh state), never the old one's.
    old_uid = client.app[STORE].get(f"{ns}/vllm-0").settings.pod_uid
    await in_thread(delete_pod, cp, ns, "vllm-0")
    await in_thread(running_pod, cp, ns, "vllm-0", port)
    await wait_for(lambda: (r := client.app[STORE].get(f"{ns}/vllm-0")) is not None and r.settings.pod_uid != old_uid,
                   timeout=POLL, what="vllm-0 recreated")
    assert client.app[STORE].get(f"{ns}/vllm-0") is not first
    assert await metrics_names(client) == {f"{ns}/vllm-{i}" for i in (0, 2, 3, 4)}
    # From before the first write of each step (the harness's writes included) to the targets following.
    print(f"churn followed in {', '.join(f'{t:.3f}' for t in took)} s")


async def test_a_pod_that_cannot_be_a_target_gets_a_clear_status(control_plane, namespace, aiohttp_server, aiohttp_client) -> None:
    cp, ns = control_plane, namespace
    await in_thread(cp.grant, ns, EXPORTER, deployed_pod_rules(), name="llm-vitals-exporter-pods")
    port = (await aiohttp_server(FakeVllm().app())).port
    client = await exporter(cp, ns, aiohttp_client)

    await in_thread(cp.create_pod, ns, "pending", labels={"app": "vllm"}, port=port)  # Pending forever: no kubelet
    await in_thread(cp.create_pod, ns, "grpc-only", labels={"app": "vllm"}, port=port, port_name="grpc")
    await in_thread(cp.play_kubelet, ns, "grpc-only")
    await in_thread(running_pod, cp, ns, "good", port)
    # Running, but no IP reported (a kubelet that has not set it yet).
    await in_thread(cp.create_pod, ns, "no-ip", labels={"app": "vllm"}, port=port)
    await in_thread(cp.request, "PATCH", f"/api/v1/namespaces/{ns}/pods/no-ip/status", {"status": {"phase": "Running"}},
                    content_type="application/merge-patch+json")

    async def source() -> dict[str, Any]:
        return (await (await client.get("/api/v1/discovery")).json())["sources"][0]

    await wait_for(lambda: names(client) == {f"{ns}/good"}, timeout=5, what="only the good pod")
    expected = {
        f"{ns}/pending": "not_running: phase Pending",
        f"{ns}/grpc-only": "no_port: no container port named 'http'",
        f"{ns}/no-ip": "no_ip: the pod has no IP yet",
    }
    # Wait for these very reasons, not for three entries: `no-ip` is first skipped as Pending (its
    # creation) and only then as having no IP (its status patch); a CI run read it in between.
    deadline = time.monotonic() + 5
    while (await source())["skipped"] != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    status = await source()
    assert status["up"] is True and status["targets"] == 1
    assert status["skipped"] == expected
    text = await (await client.get("/metrics")).text()
    for reason in ("not_running", "no_port", "no_ip"):
        assert f'llm_vitals_discovery_skipped_targets{{reason="{reason}",source="kubernetes[0]"}} 1.0' in text


async def test_without_the_pod_rights_the_403_is_a_clear_error_and_nothing_crashes(control_plane, namespace, aiohttp_server,
                                                                                    aiohttp_client, caplog) -> None:
    cp, ns = control_plane, namespace
    port = (await aiohttp_server(FakeVllm().app())).port
    await in_thread(running_pod, cp, ns, "vllm-0", port)
    # The remediator's user holds no list right on pods here: the exporter run with it sees the real 403.
    client = await exporter(cp, ns, aiohttp_client, user="llm-vitals-remediator")

    async def source() -> dict[str, Any]:
        return (await (await client.get("/api/v1/discovery")).json())["sources"][0]

    # Both rights are missing: the pods' and the ReplicaSets' (each pod's workload) 403s, each named.
    deadline = time.monotonic() + 10
    while "listing replicasets" not in ((await source())["error"] or "") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    status = await source()
    assert status["up"] is False
    assert status["error"] == (f"HTTP 403 listing pods in namespace {ns}: the exporter needs list and watch on pods there "
                               "(a Role and RoleBinding, deploy/kubernetes/base/exporter.yaml); "
                               f"HTTP 403 listing replicasets in namespace {ns}: the exporter needs list and watch on "
                               "replicasets (apps) there to name a pod's Deployment (a Role and RoleBinding, "
                               "deploy/kubernetes/base/exporter.yaml); meanwhile a pod whose ReplicaSet is not known has that "
                               "ReplicaSet as its workload")
    assert "llm_vitals_discovery_up{source=\"kubernetes[0]\"} 0.0" in await (await client.get("/metrics")).text()
    assert (await client.get("/healthz")).status == 200 and names(client) == set()
    # Granted later, it recovers by itself (the retry backs off to at most 30 s; the first retries are quick).
    await in_thread(cp.grant, ns, "llm-vitals-remediator", deployed_pod_rules(), name="late-pods")
    await wait_for(lambda: names(client) == {f"{ns}/vllm-0"}, timeout=15, what="the pod once the right is granted")


def etcd_bump_and_compact(cp: ControlPlane) -> int:
    """Write a key of our own a few times, then compact etcd up to its revision (its v3 JSON gateway); that revision."""
    with httpx.Client(timeout=10) as etcd:
        key = base64.b64encode(f"/llm-vitals-test/{secrets.token_hex(4)}".encode()).decode()
        for i in range(3):
            answer = etcd.post(f"{cp.etcd_url}/v3/kv/put", json={"key": key, "value": base64.b64encode(str(i).encode()).decode()})
            assert answer.status_code == 200, answer.text
        revision = int(answer.json()["header"]["revision"])
        answer = etcd.post(f"{cp.etcd_url}/v3/kv/compaction", json={"revision": revision, "physical": True})
        assert answer.status_code == 200, answer.text
    return revision


async def test_a_restarted_api_server_loses_no_target_and_a_compacted_watch_relists(control_plane, namespace, aiohttp_server,
                                                                                    aiohttp_client) -> None:
    cp, ns = control_plane, namespace
    await in_thread(cp.grant, ns, EXPORTER, deployed_pod_rules(), name="llm-vitals-exporter-pods")
    port = (await aiohttp_server(FakeVllm().app())).port
    for pod in ("vllm-0", "vllm-1"):
        await in_thread(running_pod, cp, ns, pod, port)
    client = await exporter(cp, ns, aiohttp_client)
    both = {f"{ns}/vllm-0", f"{ns}/vllm-1"}
    await follows(client, both, "two pods", within=10)
    records = dict(client.app[STORE].records)
    await wait_for(lambda: all(r.verdict.state == "idle" for r in records.values()), timeout=10, what="idle")

    # An outage: nothing is lost, nothing duplicated, verdicts go on.
    cp.stop_apiserver()
    polls = {name: r.polls for name, r in records.items()}
    await wait_for(lambda: all(r.polls >= polls[n] + 2 for n, r in records.items()), timeout=10, what="polls go on")
    assert names(client) == both and all(client.app[STORE].get(n) is records[n] for n in both)
    # Meanwhile etcd moves on and is compacted: the exporter's resourceVersion is now too old, and
    # its watch must end in 410 Gone and a relist.
    await in_thread(etcd_bump_and_compact, cp)
    # In this thread, not in_thread: the harness gives its processes PR_SET_PDEATHSIG, which fires when
    # the *thread* that started them ends (to_thread's workers end with the test's loop). It blocks
    # the loop for the start (seconds): the exporter just waits, as in any outage.
    cp.start_apiserver()
    await in_thread(running_pod, cp, ns, "vllm-2", port)
    await follows(client, {*both, f"{ns}/vllm-2"}, "the pod created after the outage", within=35)
    assert all(client.app[STORE].get(n) is records[n] for n in both)  # the same targets, state kept
    assert all(r.verdict.state == "idle" for r in records.values())
    status = (await (await client.get("/api/v1/discovery")).json())["sources"][0]
    assert status["up"] is True and status["error"] is None
    assert status["relists"] >= 1


async def test_two_shards_split_the_pods_while_they_churn(control_plane, namespace, aiohttp_server, aiohttp_client) -> None:
    cp, ns = control_plane, namespace
    await in_thread(cp.grant, ns, EXPORTER, deployed_pod_rules(), name="llm-vitals-exporter-pods")
    port = (await aiohttp_server(FakeVllm().app())).port
    shards = [await exporter(cp, ns, aiohttp_client, shard={"index": i, "count": 2}) for i in range(2)]

    def split_is(expected: set[str]) -> bool:
        a, b = names(shards[0]), names(shards[1])
        return not (a & b) and a | b == expected

    alive: set[str] = set()
    for step in range(12):
        name = f"vllm-{step}"
        await in_thread(running_pod, cp, ns, name, port)
        alive.add(f"{ns}/{name}")
        if step % 3 == 2:  # churn: every third step one of the older pods goes
            gone = sorted(alive)[0]
            await in_thread(delete_pod, cp, ns, gone.split("/", 1)[1])
            alive.discard(gone)
        # At no moment is a pod watched by both shards.
        assert not (names(shards[0]) & names(shards[1]))
    # Which shard 8 names fall in depends on the random namespace: about 1 run in 128 puts all in one.
    # A pod named for the empty shard makes "both shards hold some" certain, not lucky.
    for empty in {0, 1} - {shard_of(n, 2) for n in alive}:
        extra = next(f"extra-{i}" for i in itertools.count() if shard_of(f"{ns}/extra-{i}", 2) == empty)
        await in_thread(running_pod, cp, ns, extra, port)
        alive.add(f"{ns}/{extra}")
    await wait_for(lambda: split_is(alive), timeout=POLL, what="the two shards hold every pod exactly once")
    assert names(shards[0]) and names(shards[1])
