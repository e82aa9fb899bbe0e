"""The harness itself on the real API server: version, RBAC, the kubelet stand-in, conflicts, audit, outage."""

from __future__ import annotations

import ssl

import httpx
import pytest

from .control_plane import VERSION, ControlPlane


def test_api_server_is_the_built_version_and_reads_need_a_token(control_plane: ControlPlane) -> None:
    assert control_plane.request("GET", "/version")["gitVersion"] == f"v{VERSION}"
    tls = ssl.create_default_context(cafile=str(control_plane.ca_file))
    with httpx.Client(base_url=control_plane.url, verify=tls, trust_env=False) as anonymous:
        assert anonymous.get("/api/v1/namespaces/default/pods").status_code in (401, 403)


def test_rbac_refuses_until_granted_and_the_audit_log_shows_each_write(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.create_pod(namespace, "p1", labels={"app": "x"})
    user = "llm-vitals-remediator"
    with control_plane.client(user) as client:
        assert client.delete(f"/api/v1/namespaces/{namespace}/pods/p1").status_code == 403
    control_plane.grant(namespace, user, [{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}])
    with control_plane.client(user) as client:
        assert client.delete(f"/api/v1/namespaces/{namespace}/pods/p1").status_code == 200
        assert client.get(f"/api/v1/namespaces/{namespace}/pods").status_code == 403  # delete only, no list
    codes = [e["responseStatus"]["code"] for e in control_plane.audit(verb="delete", resource="pods",
                                                                      namespace=namespace, user=user)]
    assert codes == [403, 200]


def test_play_kubelet_reports_the_pod_running_and_ready_with_its_ip(control_plane: ControlPlane, namespace: str) -> None:
    created = control_plane.create_pod(namespace, "vllm-0", labels={"app": "vllm"}, port=8123)
    assert created["status"]["phase"] == "Pending"
    control_plane.play_kubelet(namespace, "vllm-0", ip="127.0.0.1")
    pods = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=app%3Dvllm")["items"]
    assert [(p["metadata"]["name"], p["status"]["phase"], p["status"]["podIP"]) for p in pods] == [
        ("vllm-0", "Running", "127.0.0.1")]
    ready = {c["type"]: c["status"] for c in pods[0]["status"]["conditions"]}
    assert ready["Ready"] == "True"


def test_a_stale_resource_version_is_a_409_conflict(control_plane: ControlPlane, namespace: str) -> None:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    lease = control_plane.request("POST", path, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                                 "metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})
    first = dict(lease, spec={"holderIdentity": "b"})
    control_plane.request("PUT", f"{path}/l", first)
    stale = dict(lease, spec={"holderIdentity": "c"})  # still carries the first resourceVersion
    with pytest.raises(Exception, match="HTTP 409"):
        control_plane.request("PUT", f"{path}/l", stale)


def test_nodes_carry_the_conditions_a_test_sets(control_plane: ControlPlane) -> None:
    name = f"node-{control_plane.new_namespace('n').rsplit('-', 1)[1]}"
    control_plane.create_node(name, conditions=[{"type": "GpuMemWatch", "status": "True", "reason": "Xid79",
                                                 "message": "GPU has fallen off the bus"}])
    node = control_plane.request("GET", f"/api/v1/nodes/{name}")
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]} == {"GpuMemWatch": "True"}
