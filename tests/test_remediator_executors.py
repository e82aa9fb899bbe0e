"""Executors against real things: real processes, a real HTTP server, and contract tests for the
Docker Engine API (over a unix socket) and the Kubernetes API (over HTTPS with a CA we generate).
The docker and kubernetes servers here are loopback stand-ins speaking the documented paths; the
docker executor also runs against a real Docker Engine in tests/real_docker/ (`make test-docker`)."""

from __future__ import annotations

import asyncio
import errno
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from llm_vitals.remediator.executors import (
    CommandExecutor,
    DockerExecutor,
    ExecResult,
    HttpExecutor,
    KubernetesExecutor,
    socket_hint,
)
from llm_vitals.remediator.settings import CommandTarget, DockerTarget, HttpTarget, KubernetesTarget

# -- command ----------------------------------------------------------------------------------


async def test_command_runs_argv_without_a_shell_and_keeps_output(tmp_path):
    marker = tmp_path / "ran"
    executor = CommandExecutor(CommandTarget(executor="command", argv=[
        sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write('x'); print('restarted', sys.argv[2])",
        str(marker), "$(echo not-expanded; touch /tmp/pwned)",
    ]))
    result = await executor.restart()
    assert result.result == "ok" and marker.exists()
    assert result.detail.strip() == "restarted $(echo not-expanded; touch /tmp/pwned)"


async def test_command_failure_keeps_the_exit_status_and_truncated_output():
    executor = CommandExecutor(CommandTarget(executor="command", output_limit=100, argv=[
        sys.executable, "-c", "import sys; sys.stdout.write('e' * 5000); sys.exit(3)"]))
    result = await executor.restart()
    assert result.result == "error"
    assert result.detail.startswith("exit status 3: " + "e" * 100 + "... [4900 more bytes]")


async def test_command_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    # The command starts a grandchild that would outlive a plain kill of the command.
    script = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(60)"
    )
    executor = CommandExecutor(
        CommandTarget(executor="command", timeout=1.0, argv=[sys.executable, "-c", script, str(pidfile)])
    )
    result = await executor.restart()
    assert result.result == "timeout" and "did not finish within 1s" in result.detail
    import psutil

    grandchild = int(pidfile.read_text())
    try:
        psutil.Process(grandchild).wait(timeout=5)
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


async def test_cancelled_command_is_killed_and_reaped(tmp_path):
    """A shutdown cancels a running restart: the command must not outlive it, not even as a zombie."""
    import psutil

    pidfile = tmp_path / "command.pid"
    script = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    executor = CommandExecutor(
        CommandTarget(executor="command", timeout=60.0, argv=[sys.executable, "-c", script, str(pidfile)])
    )
    task = asyncio.create_task(executor.restart())
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text()):
        assert time.monotonic() < deadline, "the command never started"
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not psutil.pid_exists(int(pidfile.read_text()))


async def test_command_missing_binary_is_an_error():
    result = await CommandExecutor(CommandTarget(executor="command", argv=["/nonexistent/restart-me"])).restart()
    assert result.result == "error" and "cannot start /nonexistent/restart-me" in result.detail


# -- http -------------------------------------------------------------------------------------


async def test_http_executor_posts_and_reads_the_status(aiohttp_server):
    seen = []

    async def restart(request: web.Request) -> web.Response:
        seen.append((request.method, request.path, await request.read()))
        status = 200 if len(seen) == 1 else 503
        return web.json_response({"restarting": status == 200}, status=status)

    app = web.Application()
    app.router.add_post("/admin/restart", restart)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as client:
        executor = HttpExecutor(HttpTarget(executor="http", url=str(server.make_url("/admin/restart"))), client)
        assert (await executor.restart()).result == "ok"
        second = await executor.restart()
    assert second.result == "error" and "HTTP 503" in second.detail
    assert seen[0] == ("POST", "/admin/restart", b"")


async def test_http_executor_timeout(aiohttp_server):
    import asyncio

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response()

    app = web.Application()
    app.router.add_post("/r", slow)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as client:
        result = await HttpExecutor(
            HttpTarget(executor="http", url=str(server.make_url("/r")), timeout=0.2), client
        ).restart()
    assert result.result == "timeout"


# -- docker over a unix socket ------------------------------------------------------------------


@pytest.fixture
async def docker_engine():
    """A loopback Docker Engine API on a unix socket: `GET [/v1.43]/containers/{name}/json` and
    `POST [/v1.43]/containers/{name}/restart`, with the answers Engine 20.10 gave in the real tier."""
    calls = []
    states = {"vllm-c": "running", "broken": "running", "stopped": "exited", "paused": "paused"}

    async def inspect(request: web.Request) -> web.Response:
        calls.append((request.method, request.path))
        name = request.match_info["name"]
        if name not in states:
            return web.json_response({"message": f"No such container: {name}"}, status=404)
        status = states[name]
        return web.json_response({"Id": "0" * 64, "State": {"Status": status, "Running": status != "exited"}})

    async def restart(request: web.Request) -> web.Response:
        calls.append((request.path, dict(request.query)))
        name = request.match_info["name"]
        if name == "vllm-c":
            return web.Response(status=204)
        if name == "broken":
            return web.json_response({"message": "Cannot restart container broken: driver failed"}, status=500)
        return web.json_response({"message": f"No such container: {name}"}, status=404)

    app = web.Application()
    app.router.add_post("/containers/{name}/restart", restart)
    app.router.add_post("/v{version}/containers/{name}/restart", restart)
    app.router.add_get("/containers/{name}/json", inspect)
    app.router.add_get("/v{version}/containers/{name}/json", inspect)
    runner = web.AppRunner(app)
    await runner.setup()
    # A short directory: unix socket paths are limited to ~107 bytes.
    directory = tempfile.mkdtemp(prefix="lv-docker-")
    socket_path = Path(directory) / "docker.sock"
    await web.UnixSite(runner, str(socket_path)).start()
    yield socket_path, calls
    await runner.cleanup()
    shutil.rmtree(directory, ignore_errors=True)


async def test_docker_restarts_the_container_over_the_unix_socket(docker_engine):
    socket_path, calls = docker_engine
    unversioned = DockerExecutor(DockerTarget(executor="docker", container="vllm-c", socket_path=socket_path))
    pinned = DockerExecutor(DockerTarget(executor="docker", container="vllm-c", socket_path=socket_path,
                                         api_version="1.43", stop_timeout=10))
    assert (await unversioned.restart()).result == "ok"
    assert (await pinned.restart()).result == "ok"
    assert calls == [
        ("GET", "/containers/vllm-c/json"), ("/containers/vllm-c/restart", {"t": "30"}),
        ("GET", "/v1.43/containers/vllm-c/json"), ("/v1.43/containers/vllm-c/restart", {"t": "10"}),
    ]


async def test_docker_errors_carry_the_engine_message(docker_engine):
    socket_path, _ = docker_engine
    missing = await DockerExecutor(DockerTarget(executor="docker", container="gone", socket_path=socket_path)).restart()
    assert missing.result == "error" and "HTTP 404: No such container: gone" in missing.detail
    broken = await DockerExecutor(
        DockerTarget(executor="docker", container="broken", socket_path=socket_path)
    ).restart()
    assert broken.result == "error" and "driver failed" in broken.detail
    no_daemon = await DockerExecutor(
        DockerTarget(executor="docker", container="vllm-c", socket_path=socket_path.with_name("absent.sock"))
    ).restart()
    assert no_daemon.result == "error" and "absent.sock" in no_daemon.detail
    assert "the Docker daemon is not running, or the socket is not mounted" in no_daemon.detail


@pytest.mark.parametrize(("code", "says"), [
    (errno.EACCES, "may not use the socket"),
    (errno.ECONNREFUSED, "the Docker daemon is down"),
    (errno.ENOENT, "not running, or the socket is not mounted"),
    (errno.EIO, ""),
    (None, ""),
])
def test_docker_socket_errors_say_what_they_mean(code, says):
    hint = socket_hint(code)
    assert (says in hint) if says else hint == ""


async def test_docker_refuses_a_container_that_is_not_running(docker_engine):
    """The Engine's restart starts a stopped container; the executor must not ask it to."""
    socket_path, calls = docker_engine
    for name, status in [("stopped", "exited"), ("paused", "paused")]:
        result = await DockerExecutor(DockerTarget(executor="docker", container=name, socket_path=socket_path)).restart()
        assert result.result == "error" and f"container {name} is {status}, not running" in result.detail
        assert "nothing started" in result.detail
    assert calls == [("GET", "/containers/stopped/json"), ("GET", "/containers/paused/json")]  # never a restart


def test_docker_container_names_are_validated():
    with pytest.raises(ValueError, match="not a valid Docker container name"):
        DockerTarget(executor="docker", container="../../images/create")


# -- kubernetes over HTTPS ----------------------------------------------------------------------

SA_TOKEN = "k8s-sa-token-do-not-log"


def make_self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, made with the openssl CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("SKIPPED: openssl not found; apt-get install openssl")
    cert, key = directory / "ca.crt", directory / "tls.key"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=kubernetes",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=30,
    )
    return cert, key


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    return make_self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture
async def kube_api(aiohttp_server, tls_files, tmp_path):
    """A loopback Kubernetes API: list pods by label selector, delete a pod, bearer token required."""
    cert, key = tls_files
    state = {"pods": {"llm": {"vllm-d-0": {"app": "vllm", "shard": "d"}, "vllm-e-0": {"app": "vllm", "shard": "e"},
                              "vllm-e-1": {"app": "vllm", "shard": "e"}}}, "calls": [], "deletes": [],
             "evictions": [], "blocked": set(), "gone": set()}

    def matches(labels: dict, selector: str) -> bool:
        return all(labels.get(k) == v for k, v in (term.split("=", 1) for term in selector.split(",")))

    async def list_pods(request: web.Request) -> web.Response:
        state["calls"].append(("GET", request.path, request.query.get("labelSelector")))
        if request.headers.get("Authorization") != f"Bearer {SA_TOKEN}":
            return web.json_response({"kind": "Status", "message": "Unauthorized", "code": 401}, status=401)
        pods = state["pods"].get(request.match_info["ns"], {})
        items = [{"metadata": {"name": n, "namespace": request.match_info["ns"], "labels": lab, "uid": f"uid-{n}"}}
                 for n, lab in pods.items() if matches(lab, request.query["labelSelector"])]
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "items": items})

    async def delete_pod(request: web.Request) -> web.Response:
        state["calls"].append(("DELETE", request.path, None))
        state["deletes"].append(await request.json())
        if request.headers.get("Authorization") != f"Bearer {SA_TOKEN}":
            return web.json_response({"kind": "Status", "message": "Unauthorized", "code": 401}, status=401)
        pods = state["pods"].get(request.match_info["ns"], {})
        if request.match_info["name"] not in pods:
            return web.json_response({"kind": "Status", "message": "not found", "code": 404}, status=404)
        pods.pop(request.match_info["name"])
        return web.json_response({"kind": "Pod", "metadata": {"name": request.match_info["name"]}})

    async def resources(request: web.Request) -> web.Response:
        state["calls"].append(("GET", request.path, None))
        return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "pods", "namespaced": True, "kind": "Pod", "verbs": ["delete", "get", "list"]},
            {"name": "pods/eviction", "namespaced": True, "group": "policy", "version": "v1", "kind": "Eviction",
             "verbs": ["create"]}]})

    async def evict_pod(request: web.Request) -> web.Response:
        """As kube-apiserver answers (captured from 1.20.2 in the k8s tier): 201, 429 with the budget in its causes."""
        state["calls"].append(("POST", request.path, None))
        state["evictions"].append(await request.json())
        name = request.match_info["name"]
        if name in state["gone"]:  # deleted by someone else since it was listed
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                      "message": f'pods "{name}" not found', "code": 404}, status=404)
        if name in state["blocked"]:
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                      "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                                      "reason": "TooManyRequests", "code": 429, "details": {"causes": [
                                          {"reason": "DisruptionBudget", "message": "The disruption budget vllm needs"
                                                                                    " 1 healthy pods and has 1 currently"}]}},
                                     status=429)
        state["pods"].get(request.match_info["ns"], {}).pop(name, None)
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}, status=201)

    app = web.Application()
    app.router.add_get("/api/v1/", resources)
    app.router.add_get("/api/v1/namespaces/{ns}/pods", list_pods)
    app.router.add_delete("/api/v1/namespaces/{ns}/pods/{name}", delete_pod)
    app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/eviction", evict_pod)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = await aiohttp_server(app, ssl=context)
    token = tmp_path / "token"
    token.write_text(SA_TOKEN + "\n")
    state["config"] = dict(executor="kubernetes", namespace="llm", api_url=f"https://127.0.0.1:{server.port}",
                           token_path=token, ca_path=cert)
    return state


async def test_kubernetes_evicts_the_matching_pod_by_uid_in_the_served_version(kube_api):
    result = await KubernetesExecutor(KubernetesTarget(**kube_api["config"], pod_selector="app=vllm,shard=d")).restart()
    assert result == ExecResult("ok", "evicted pod(s) vllm-d-0 in llm")
    assert kube_api["calls"] == [
        ("GET", "/api/v1/namespaces/llm/pods", "app=vllm,shard=d"),
        ("GET", "/api/v1/", None),  # which eviction version the server serves
        ("POST", "/api/v1/namespaces/llm/pods/vllm-d-0/eviction", None),
    ]
    assert kube_api["evictions"] == [{
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "vllm-d-0", "namespace": "llm"},
        "deleteOptions": {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "uid-vllm-d-0"}}}]
    assert kube_api["deletes"] == [] and "vllm-d-0" not in kube_api["pods"]["llm"]


async def test_kubernetes_eviction_refused_by_a_disruption_budget_deletes_nothing(kube_api):
    kube_api["blocked"].add("vllm-d-0")
    result = await KubernetesExecutor(KubernetesTarget(**kube_api["config"], pod_selector="app=vllm,shard=d")).restart()
    assert result.refused == "disruption_budget" and result.result == "error"
    assert "disruption budget vllm needs 1 healthy pods" in result.detail and "nothing deleted" in result.detail
    assert "vllm-d-0" in kube_api["pods"]["llm"] and kube_api["deletes"] == []
    # The second pod of two refused: the first was evicted, so it is no refusal but an error saying so.
    kube_api["blocked"] = {"vllm-e-1"}
    both = KubernetesTarget(**kube_api["config"], pod_selector="app=vllm,shard=e", max_pods=2)
    partial = await KubernetesExecutor(both).restart()
    assert partial.refused is None and partial.result == "error" and "(evicted before: vllm-e-0)" in partial.detail


async def test_kubernetes_passes_over_a_pod_gone_since_it_was_listed_as_a_group_restart_does(kube_api):
    """One eviction path (kube/evictions.py PodRemover.remove_each): a pod gone meanwhile is what was wanted,
    and a budget's refusal after it still refuses the restart, since nothing was evicted."""
    both = KubernetesTarget(**kube_api["config"], pod_selector="app=vllm,shard=e", max_pods=2)
    kube_api["gone"], kube_api["blocked"] = {"vllm-e-0"}, {"vllm-e-1"}
    refused = await KubernetesExecutor(both).restart()
    assert refused.result == "error" and refused.refused == "disruption_budget"
    assert "evicted before" not in refused.detail
    kube_api["blocked"] = set()
    assert await KubernetesExecutor(both).restart() == ExecResult("ok", "evicted pod(s) vllm-e-0, vllm-e-1 in llm")


async def test_kubernetes_deletes_the_matching_pod_with_token_and_ca(kube_api):
    target = KubernetesTarget(**kube_api["config"], pod_selector="app=vllm,shard=d")
    result = await KubernetesExecutor(target, pod_action="delete").restart()
    assert result.result == "ok" and "vllm-d-0" in result.detail
    assert kube_api["calls"] == [
        ("GET", "/api/v1/namespaces/llm/pods", "app=vllm,shard=d"),
        ("DELETE", "/api/v1/namespaces/llm/pods/vllm-d-0", None),
    ]
    assert "vllm-d-0" not in kube_api["pods"]["llm"]
    # Only the pod that was listed: a pod recreated under its name since is not deleted.
    assert kube_api["deletes"] == [{"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "uid-vllm-d-0"}}]


async def test_kubernetes_refuses_a_selector_matching_more_than_max_pods(kube_api):
    result = await KubernetesExecutor(KubernetesTarget(**kube_api["config"], pod_selector="app=vllm,shard=e")).restart()
    assert result.result == "error" and "2 pods match" in result.detail and "nothing deleted" in result.detail
    assert [c[0] for c in kube_api["calls"]] == ["GET"]
    both = KubernetesTarget(**kube_api["config"], pod_selector="app=vllm,shard=e", max_pods=2)
    assert (await KubernetesExecutor(both, pod_action="delete").restart()).result == "ok"
    assert kube_api["pods"]["llm"].keys() == {"vllm-d-0"}


async def test_kubernetes_no_match_and_bad_token_are_errors_without_the_token(kube_api, tmp_path):
    none = await KubernetesExecutor(KubernetesTarget(**kube_api["config"], pod_selector="app=nothing")).restart()
    assert none.result == "error" and "no pod in llm matches" in none.detail
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token")
    config = {**kube_api["config"], "token_path": wrong}
    denied = await KubernetesExecutor(KubernetesTarget(**config, pod_selector="app=vllm,shard=d")).restart()
    assert denied.result == "error" and "HTTP 401: Unauthorized" in denied.detail
    assert SA_TOKEN not in none.detail + denied.detail and "not-the-token" not in denied.detail


async def test_kubernetes_verifies_the_api_server_against_the_ca(kube_api, tmp_path):
    (tmp_path / "other").mkdir()
    other_ca, _ = make_self_signed(tmp_path / "other")  # a CA that did not sign the server's cert
    config = {**kube_api["config"], "ca_path": other_ca}
    result = await KubernetesExecutor(KubernetesTarget(**config, pod_selector="app=vllm,shard=d")).restart()
    assert result.result == "error" and "CERTIFICATE_VERIFY_FAILED" in result.detail
    assert kube_api["calls"] == []  # the request never reached the handler
    missing = await KubernetesExecutor(KubernetesTarget(**{**kube_api["config"], "token_path": tmp_path / "nope"},
                                                        pod_selector="app=vllm")).restart()
    assert missing.result == "error" and "cannot read the service account token" in missing.detail
