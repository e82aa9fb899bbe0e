"""The pod actions (pods.py) against a loopback HTTPS stand-in of the API server: evictions by UID,
a PodDisruptionBudget's 429, a group restarted whole, a cordon that fails, and Events that fail or
hang without changing any outcome.

The stand-in answers as kube-apiserver 1.20.2 did in the k8s tier (the same statuses and Status
bodies); the real API server runs these paths in tests/k8s/test_workload_safety.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from fake_http import app_of
from test_remediator_executors import SA_TOKEN, tls_files  # noqa: F401

import llm_vitals.remediator.pods as pods
from llm_vitals.config import KubeAccess
from llm_vitals.kube.client import KubeClient
from llm_vitals.remediator.gate import Group
from llm_vitals.remediator.pods import CordonAndMoveExecutor, GroupExecutor, PodExecutor, PodRef, PodRemover

GROUP_LABELS = {"leaderworkerset.sigs.k8s.io/name": "big", "leaderworkerset.sigs.k8s.io/group-index": "0"}


def status(code: int, message: str, reason: str, causes: list[dict[str, str]] | None = None) -> web.Response:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                            "reason": reason, "code": code}
    if causes:
        body["details"] = {"causes": causes}
    return web.json_response(body, status=code)


class ApiServer:
    """Pods (with labels and UIDs), evictions, deletes, Events and nodes; every request recorded."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.blocked: set[str] = set()  # pods a PodDisruptionBudget protects
        self.throttled: set[str] = set()  # pods whose eviction API Priority and Fairness answers 429
        self.calls: list[tuple[str, str]] = []
        self.event_delay = 0.0
        self.event_status = 201
        self.events: list[dict[str, Any]] = []
        self.nodes: dict[str, dict[str, Any]] = {}
        self.replica_sets: dict[str, dict[str, Any]] = {}
        self.reads_fail = 0  # answer this status to pod and ReplicaSet reads (0: answer them)

    def add_pod(self, name: str, labels: dict[str, str] | None = None, node: str = "n1", ip: str = "10.0.0.1",
                owners: list[dict[str, Any]] | None = None) -> PodRef:
        metadata: dict[str, Any] = {"name": name, "namespace": "llm", "uid": f"uid-{name}", "labels": labels or {}}
        if owners is not None:
            metadata["ownerReferences"] = owners
        self.pods[name] = {"metadata": metadata, "spec": {"nodeName": node},
                           "status": {"podIP": ip, "podIPs": [{"ip": ip}]}}
        return PodRef("llm", name, f"uid-{name}", node)

    def app(self) -> web.Application:
        return app_of(
            ("GET", "/api/v1/", self.resources),
            ("GET", "/api/v1/namespaces/{ns}/pods", self.list_pods),
            ("POST", "/api/v1/namespaces/{ns}/pods/{name}/eviction", self.evict),
            ("DELETE", "/api/v1/namespaces/{ns}/pods/{name}", self.delete),
            ("POST", "/api/v1/namespaces/{ns}/events", self.event),
            ("GET", "/api/v1/namespaces/{ns}/pods/{name}", self.get_pod),
            ("GET", "/apis/apps/v1/namespaces/{ns}/replicasets/{name}", self.get_replica_set),
            ("GET", "/api/v1/nodes/{name}", self.get_node),
            ("PATCH", "/api/v1/nodes/{name}", self.patch_node),
        )

    async def resources(self, request: web.Request) -> web.Response:
        self.calls.append(("GET", request.path))
        return web.json_response({"kind": "APIResourceList", "resources": [
            {"name": "pods/eviction", "group": "policy", "version": "v1beta1", "kind": "Eviction", "verbs": ["create"]}]})

    async def list_pods(self, request: web.Request) -> web.Response:
        self.calls.append(("LIST", request.query.get("labelSelector", "")))
        wanted = dict(term.split("=", 1) for term in request.query["labelSelector"].split(","))
        items = [p for p in self.pods.values() if all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())]
        return web.json_response({"kind": "PodList", "items": items})

    def _precondition(self, name: str, uid: str | None) -> web.Response | None:
        if name not in self.pods:
            return status(404, f'pods "{name}" not found', "NotFound")
        if uid != self.pods[name]["metadata"]["uid"]:
            return status(409, "the UID in the precondition does not match", "Conflict")
        return None

    async def evict(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await request.json()
        self.calls.append(("EVICT", name))
        assert body["apiVersion"] == "policy/v1beta1" and body["kind"] == "Eviction"
        refused = self._precondition(name, body["deleteOptions"]["preconditions"]["uid"])
        if refused is not None:
            return refused
        if name in self.throttled:  # as APF answers: TooManyRequests, no causes, a Retry-After
            response = status(429, "Too many requests, please try again later (the eviction may violate the"
                                   " pod's disruption budget, or not).", "TooManyRequests")
            response.headers["Retry-After"] = "1"
            return response
        if name in self.blocked:
            return status(429, "Cannot evict pod as it would violate the pod's disruption budget.", "TooManyRequests",
                          [{"reason": "DisruptionBudget", "message": "The disruption budget vllm needs 2 healthy pods"
                                                                    " and has 2 currently"}])
        del self.pods[name]
        return web.json_response({"kind": "Status", "status": "Success", "code": 201}, status=201)

    async def delete(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await request.json()
        self.calls.append(("DELETE", name))
        refused = self._precondition(name, body["preconditions"]["uid"])
        if refused is not None:
            return refused
        del self.pods[name]
        return web.json_response({"kind": "Pod", "metadata": {"name": name}})

    async def event(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("EVENT", body["reason"]))
        await asyncio.sleep(self.event_delay)
        if self.event_status != 201:
            return status(self.event_status, "etcdserver: request timed out", "InternalError")
        self.events.append(body)
        return web.json_response(body, status=201)

    async def get_pod(self, request: web.Request) -> web.Response:
        return self._read("GET_POD", self.pods, request.match_info["name"], "pods")

    async def get_replica_set(self, request: web.Request) -> web.Response:
        return self._read("GET_RS", self.replica_sets, request.match_info["name"], "replicasets.apps")

    def _read(self, call: str, objects: dict[str, dict[str, Any]], name: str, resource: str) -> web.Response:
        self.calls.append((call, name))
        if self.reads_fail:
            return status(self.reads_fail, "forbidden", "Forbidden")
        if name not in objects:
            return status(404, f'{resource} "{name}" not found', "NotFound")
        return web.json_response(objects[name])

    async def get_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.calls.append(("GET_NODE", name))
        if name not in self.nodes:
            return status(404, f'nodes "{name}" not found', "NotFound")
        return web.json_response(self.nodes[name])

    async def patch_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.calls.append(("PATCH_NODE", name))
        patch = await request.json()
        self.nodes[name]["spec"].update(patch["spec"])
        return web.json_response(self.nodes[name])


@pytest.fixture
async def api(aiohttp_server, tls_files, tmp_path):  # noqa: F811
    import ssl

    cert, key = tls_files
    server = ApiServer()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    running = await aiohttp_server(server.app(), ssl=context)
    token = tmp_path / "token"
    token.write_text(SA_TOKEN)
    kube = KubeClient(KubeAccess(api_url=f"https://127.0.0.1:{running.port}", token_path=token, ca_path=cert, timeout=5))
    yield server, kube
    await kube.close()


async def evict_vllm_0(api, refused_by: str | None = None):
    """The API server and the eviction of its pod vllm-0, which the server's `refused_by` set holds."""
    server, kube = api
    pod = server.add_pod("vllm-0")
    if refused_by:
        getattr(server, refused_by).add("vllm-0")
    return server, await PodExecutor(PodRemover(kube, "evict"), pod, "replica-a", "restarted", 5).restart()


async def test_a_pod_is_evicted_by_uid_in_the_version_the_server_serves_and_gets_its_event(api):
    server, result = await evict_vllm_0(api)
    assert (result.result, result.refused, result.detail) == ("ok", None, "evicted pod llm/vllm-0 (uid uid-vllm-0)")
    assert server.calls == [("GET", "/api/v1/"), ("EVICT", "vllm-0"), ("EVENT", "LLMVitalsRestart")]


async def test_a_disruption_budget_refuses_the_eviction_deletes_nothing_and_says_which_budget(api):
    server, result = await evict_vllm_0(api, "blocked")
    assert (result.result, result.refused) == ("error", "disruption_budget")
    assert "The disruption budget vllm needs 2 healthy pods and has 2 currently" in result.detail
    assert "vllm-0" in server.pods and ("EVENT", "LLMVitalsRestart") not in server.calls


@pytest.mark.parametrize("action", ["evict", "delete"])
async def test_a_pod_recreated_under_its_name_or_gone_is_not_touched(api, action):
    server, kube = api
    server.add_pod("vllm-0")
    stale = PodRef("llm", "vllm-0", "uid-of-the-old-pod", "n1")
    result = await PodExecutor(PodRemover(kube, action), stale, "replica-a", "restarted", 5).restart()
    assert result.result == "error" and "another UID" in result.detail and "vllm-0" in server.pods
    gone = await PodExecutor(PodRemover(kube, action), PodRef("llm", "vllm-9", "u9"), "r", "m", 5).restart()
    assert gone.result == "error" and "gone already" in gone.detail


async def test_a_pod_without_a_uid_is_never_acted_on_by_name(api):
    server, kube = api
    server.add_pod("vllm-0")
    for action in ("evict", "delete"):
        result = await PodExecutor(PodRemover(kube, action), PodRef("llm", "vllm-0", None), "r", "m", 5).restart()
        assert result.result == "error" and "no UID" in result.detail
    assert server.calls == [] and "vllm-0" in server.pods


@pytest.mark.parametrize("delay, code", [(3.0, 201), (0.0, 500)], ids=["event hangs", "event fails"])
async def test_an_event_that_hangs_or_fails_never_changes_the_restart_outcome(api, monkeypatch, delay, code):
    """The eviction is done; its Event has its own limit, apart from the restart's (before, one
    shared timeout journaled a completed restart as `timeout`)."""
    server, kube = api
    monkeypatch.setattr(pods, "EVENT_TIMEOUT_SECONDS", 0.3)
    server.event_delay, server.event_status = delay, code
    pod = server.add_pod("vllm-0")
    result = await PodExecutor(PodRemover(kube, "evict"), pod, "replica-a", "restarted", timeout=1.0).restart()
    assert result.result == "ok" and result.detail.endswith("; its Event was not recorded")
    assert "vllm-0" not in server.pods


async def test_a_group_is_restarted_whole_each_pod_by_uid(api):
    server, kube = api
    leader = server.add_pod("big-0", GROUP_LABELS)
    server.add_pod("big-0-1", GROUP_LABELS)
    server.add_pod("big-0-2", GROUP_LABELS)
    server.add_pod("big-1", {**GROUP_LABELS, "leaderworkerset.sigs.k8s.io/group-index": "1"})  # another group
    server.add_pod("other")
    result = await GroupExecutor(PodRemover(kube, "evict"), Group("llm", "big", "0"), leader, "r", "m", 5).restart()
    assert result.result == "ok", result
    assert set(server.pods) == {"big-1", "other"}
    assert [c for c in server.calls if c[0] in ("LIST", "EVICT")] == [
        ("LIST", "leaderworkerset.sigs.k8s.io/name=big,leaderworkerset.sigs.k8s.io/group-index=0"),
        ("EVICT", "big-0"), ("EVICT", "big-0-1"), ("EVICT", "big-0-2")]
    assert [e["involvedObject"]["uid"] for e in server.events] == ["uid-big-0", "uid-big-0-1", "uid-big-0-2"]


async def test_a_group_whose_pod_was_recreated_or_whose_first_eviction_is_refused_is_left_alone(api):
    server, kube = api
    leader = server.add_pod("big-0", GROUP_LABELS)
    server.add_pod("big-0-1", GROUP_LABELS)
    group = Group("llm", "big", "0")
    stale = PodRef("llm", "big-0", "uid-before", "n1")
    result = await GroupExecutor(PodRemover(kube, "evict"), group, stale, "r", "m", 5).restart()
    assert result.result == "error" and "no longer in group big/0" in result.detail and len(server.pods) == 2
    server.blocked.add("big-0")
    refused = await GroupExecutor(PodRemover(kube, "evict"), group, leader, "r", "m", 5).restart()
    assert refused.refused == "disruption_budget" and len(server.pods) == 2
    server.blocked = {"big-0-1"}  # a later pod refused: what was done is said, and it is no refusal
    partial = await GroupExecutor(PodRemover(kube, "evict"), group, leader, "r", "m", 5).restart()
    assert (partial.result, partial.refused) == ("error", None) and "evicted pod llm/big-0" in partial.detail


async def test_a_cordon_that_fails_names_no_node_and_moves_nothing(api):
    server, kube = api
    pod = server.add_pod("vllm-0", node="gone-node")
    result = await CordonAndMoveExecutor(PodRemover(kube, "evict"), pod, "r", "GPU fault (Xid79)", 5,
                                         "Xid79").restart()
    assert result.result == "error" and result.cordoned is None
    assert "not cordoned, nothing moved" in result.detail and "vllm-0" in server.pods
    server.nodes["n2"] = {"metadata": {"name": "n2", "resourceVersion": "5", "annotations": {}}, "spec": {}}
    moved = await CordonAndMoveExecutor(PodRemover(kube, "evict"), server.add_pod("vllm-1", node="n2"), "r",
                                        "GPU fault (Xid79)", 5, "Xid79").restart()
    assert (moved.result, moved.cordoned) == ("ok", "n2") and server.nodes["n2"]["spec"]["unschedulable"] is True
    assert "vllm-1" not in server.pods


async def test_a_throttled_api_server_is_api_throttled_never_a_disruption_budget(api):
    """APF's 429 names no budget (its message even mentions one here: the message is never read)."""
    server, result = await evict_vllm_0(api, "throttled")
    assert (result.result, result.refused) == ("error", "api_throttled")
    assert "vllm-0" in server.pods and not server.events
    leader = server.add_pod("big-0", GROUP_LABELS)
    server.throttled.add("big-0")
    group = await GroupExecutor(PodRemover(api[1], "evict"), Group("llm", "big", "0"), leader, "r", "m", 5).restart()
    assert group.refused == "api_throttled" and "big-0" in server.pods
