"""Exec-plugin kubeconfigs (as EKS, GKE and AKS use) against the real API server.

The plugin is a real process (tests/k8s/exec_credential.py) printing an ExecCredential
(client.authentication.k8s.io/v1beta1) whose bearer token is one the API server's token file
accepts; the kubeconfig names no token at all. The exporter's pod discovery and a real
`llm-vitals-remediator` process (the Lease, the pod eviction with its UID, the Event) both work
through it, and the API server's audit log shows them as the plugin's user.
"""

from __future__ import annotations

import json
from pathlib import Path

from test_exporter_helpers import FakeVllm, make_settings, start_exporter, wait_for
from waits import wait_until

from llm_vitals.exporter.keys import STORE
from llm_vitals.remediator.store.lease import STATE_ANNOTATION

from .control_plane import ControlPlane
from .exec_credential import exec_kubeconfig, runs
from .replicas import USER, ExporterStandIn, alert, events, grant_remediator_rbac, lease, pod_evictions, start_replicas
from .test_pod_discovery import EXPORTER, deployed_pod_rules, in_thread, running_pod


def plugin_kubeconfig(cp: ControlPlane, user: str, directory: Path) -> tuple[Path, Path]:
    """A kubeconfig for `user` whose token only the exec plugin knows; (its path, the plugin's runs log)."""
    token = directory / f"{user}.token"
    token.write_text(cp.token(user))
    token.chmod(0o600)
    log = directory / f"{user}.runs"
    path = exec_kubeconfig(directory / f"kubeconfig-exec-{user}", cp.url, token, log, ca_file=cp.ca_file)
    assert "token" not in json.loads(path.read_text())["users"][0]["user"]
    return path, log


async def test_pod_discovery_through_an_exec_plugin(control_plane, namespace, aiohttp_server, aiohttp_client,
                                                     tmp_path) -> None:
    cp, ns = control_plane, namespace
    await in_thread(cp.grant, ns, EXPORTER, deployed_pod_rules(), name="llm-vitals-exporter-pods")
    kubeconfig, log = plugin_kubeconfig(cp, EXPORTER, tmp_path)
    port = (await aiohttp_server(FakeVllm().app())).port
    await in_thread(running_pod, cp, ns, "vllm-0", port)
    settings = make_settings([], poll_interval=1.0, discovery=[{"kubernetes": {
        "namespaces": [ns], "selector": "app=vllm", "port": "http", "kubeconfig": str(kubeconfig),
        "template": {"engine": "vllm", "startup_grace": 0}}}])
    client = await start_exporter(aiohttp_client, settings)
    await wait_for(lambda: set(client.app[STORE].records) == {f"{ns}/vllm-0"}, timeout=15, what="the pod as a target")
    await in_thread(running_pod, cp, ns, "vllm-1", port)  # and the watch that follows the list works too
    await wait_for(lambda: set(client.app[STORE].records) == {f"{ns}/vllm-0", f"{ns}/vllm-1"}, timeout=5,
                   what="the second pod")
    status = (await (await client.get("/api/v1/discovery")).json())["sources"][0]
    assert status["up"] is True and status["error"] is None
    # One run per client (pod discovery's, and the node watch's, which uses discovery's kubeconfig): a
    # credential with no expiry is kept until a 401.
    assert runs(log) == 2
    # The plugin's user, as the API server authenticated it; one list, and vllm-1 came by the watch.
    mine = [e for e in cp.audit(resource="pods", namespace=ns) if e["user"]["username"] != "admin"]
    assert [(e["verb"], e["user"]["username"]) for e in mine] == [("list", EXPORTER)]


async def test_the_remediator_restarts_a_pod_through_an_exec_plugin(control_plane, namespace, tmp_path) -> None:
    cp, ns = control_plane, namespace
    await in_thread(grant_remediator_rbac, cp, ns)
    kubeconfig, log = plugin_kubeconfig(cp, USER, tmp_path)
    pod = await in_thread(running_pod, cp, ns, "vllm-0", 8000)
    exporter = await ExporterStandIn().start()
    [replica] = await start_replicas(cp, ns, exporter.url, tmp_path / "replica", ("replica-exec",), kubeconfig=kubeconfig)
    try:
        target = exporter.put_pod(ns, pod, "stuck")
        answer = await replica.webhook(alert(target, "fp-exec"))
        assert answer.status_code == 200 and answer.json()["decisions"][0]["reason"] == "allowed", answer.text
        rows = await wait_until(lambda: _finished(replica), 60, "the restart to finish")
    finally:
        await replica.stop()
        await exporter.stop()
        print(replica.tail(40))
    assert [(row["target"], row["result"]) for row in rows] == [(target, "ok")]
    assert pod_evictions(cp, ns) == [201]  # pod_action: evict, the default
    eviction = cp.audit(verb="create", resource="pods", namespace=ns, user=USER)[0]
    assert (eviction["objectRef"]["name"], eviction["objectRef"]["subresource"]) == ("vllm-0", "eviction")
    state = json.loads(lease(cp, ns)["metadata"]["annotations"][STATE_ANNOTATION])
    # Counted against the workload the remediator read from the API server itself (through the
    # plugin too): a pod with no owner is its own workload, Pod/<ns>/<name>.
    assert state["last_restart_started"] is not None and list(state["restart_times"]) == [f"Pod/{ns}/vllm-0"]
    assert [e["objectRef"]["name"] for e in cp.audit(verb="get", resource="pods", namespace=ns, user=USER)] == ["vllm-0"]
    assert [(e["involvedObject"]["name"], e["involvedObject"]["uid"]) for e in events(cp, ns, "LLMVitalsRestart")] == [
        ("vllm-0", pod["metadata"]["uid"])]
    lease_writers = {e["user"]["username"] for e in cp.audit(resource="leases", namespace=ns) if e["verb"] != "get"}
    assert lease_writers == {USER}
    assert runs(log) >= 1


async def _finished(replica) -> list:
    rows = await replica.restarts()
    return [] if not rows or any(row["result"] == "pending" for row in rows) else rows
