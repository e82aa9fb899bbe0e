"""What the real-kubelet tier deploys differs from the chart's render only as workloads.CHANGES says.

Offline (Helm's own library in-process, no cluster): part of `make test`, so a change to the chart
that the tier would silently paper over fails here first.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from .workloads import (
    MODEL_CACHE,
    SERVER,
    SHIM_CONFIG,
    SHIM_PORT,
    Workload,
    find,
    fleet_exporter,
    journal_volumes,
    llama_server,
    remediator,
    render,
    server_workload,
    simulator,
)

IMAGE = "llm-vitals-test/llm-vitals:kubelet"
# What the drills copy: per-workload names, images, ports and the engine's process (CHANGES).
SERVER_CHANGED = ("image", "imagePullPolicy", "args", "command", "ports", "resources", "startupProbe", "readinessProbe",
                  "livenessProbe", "lifecycle", "env", "volumeMounts")


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return render()


def _without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys}


def test_the_render_is_what_1_20_takes_and_the_tier_deploys_all_of_it_but_the_model_cache(rendered):
    # No Prometheus Operator objects (no CRDs here), no policy/v1 PodDisruptionBudget (1.20 lacks it).
    assert {d["apiVersion"] for d in rendered} <= {"v1", "apps/v1", "rbac.authorization.k8s.io/v1"}
    deployed = {(d["kind"], d["metadata"]["name"]) for d in
                server_workload(rendered, Workload("vllm-x", 8000, 9500, simulator(8000)), IMAGE)
                + fleet_exporter(rendered, IMAGE, 9481) + remediator(rendered, IMAGE, "http://x:1")}
    deployed = {(kind, SERVER if name == "vllm-x" else SHIM_CONFIG if name == "vllm-x-shim" else name)
                for kind, name in deployed} | {("Service", SERVER)}  # conftest applies the Service as rendered
    assert {(d["kind"], d["metadata"]["name"]) for d in rendered} - deployed == {("PersistentVolumeClaim", MODEL_CACHE)}


def test_a_drill_workload_keeps_the_probes_the_hook_and_the_shim_as_shipped(rendered):
    w = Workload("vllm-hang", 8030, 9530, simulator(8030))
    config, deployment = server_workload(rendered, w, IMAGE)
    shipped = find(rendered, "Deployment", SERVER)
    pod, shipped_pod = deployment["spec"]["template"]["spec"], shipped["spec"]["template"]["spec"]
    server, shim = pod["containers"]
    shipped_server, shipped_shim = shipped_pod["containers"]
    assert _without(server, *SERVER_CHANGED) == _without(shipped_server, *SERVER_CHANGED)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        expected = copy.deepcopy(shipped_server[probe])
        expected["httpGet"]["port"] = w.shim_port
        assert server[probe] == expected, probe
    lifecycle = copy.deepcopy(shipped_server["lifecycle"])
    script = lifecycle["preStop"]["exec"]["command"]
    script[-1] = script[-1].replace(f":{SHIM_PORT}/", f":{w.shim_port}/")
    assert server["lifecycle"] == lifecycle
    assert server["env"] == shipped_server["env"] and server["volumeMounts"] == shipped_server["volumeMounts"]
    assert "resources" not in server
    assert _without(shim, "image", "imagePullPolicy", "ports") == _without(shipped_shim, "image", "imagePullPolicy", "ports")
    assert _without(pod, "containers", "hostNetwork", "volumes") == _without(shipped_pod, "containers", "volumes")
    assert pod["hostNetwork"] is True and deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == shipped["spec"]["strategy"]
    labels = shipped["spec"]["template"]["metadata"]["labels"] | {"workload": w.name}
    assert deployment["spec"]["template"]["metadata"]["labels"] == labels
    assert deployment["spec"]["selector"]["matchLabels"] == shipped["spec"]["selector"]["matchLabels"] | {"workload": w.name}
    # The volumes as rendered but the shim's own ConfigMap and the model cache an emptyDir (no provisioner).
    expected_volumes = copy.deepcopy(shipped_pod["volumes"])
    for volume in expected_volumes:
        if volume["name"] == "shim-config":
            volume["configMap"]["name"] = f"{w.name}-shim"
        if volume.get("persistentVolumeClaim", {}).get("claimName") == MODEL_CACHE:
            volume.pop("persistentVolumeClaim")
            volume["emptyDir"] = {}
    assert pod["volumes"] == expected_volumes
    settings = yaml.safe_load(config["data"]["exporter.yaml"])
    shipped_settings = yaml.safe_load(find(rendered, "ConfigMap", SHIM_CONFIG)["data"]["exporter.yaml"])
    assert settings["listen"] == "0.0.0.0:9530" and settings["targets"][0]["url"] == "http://127.0.0.1:8030"
    assert _without(settings, "listen", "targets", "backstop") == _without(shipped_settings, "listen", "targets", "backstop")
    assert settings["backstop"] == {**shipped_settings["backstop"], "after": "90s"}
    assert settings["targets"][0]["workload"] == "Deployment/llm/vllm-hang"
    assert _without(settings["targets"][0], "url", "stuck_after", "workload") == \
        _without(shipped_settings["targets"][0], "url", "stuck_after", "workload")


def test_a_workload_deployed_after_the_remediator_asks_it_and_may_have_replicas(rendered):
    w = Workload("vllm-storm", 8140, 9640, simulator(8140), replicas=2, remediator_url="http://10.213.0.2:9472")
    config, deployment = server_workload(rendered, w, IMAGE)
    settings = yaml.safe_load(config["data"]["exporter.yaml"])
    assert settings["remediator_url"] == "http://10.213.0.2:9472" and deployment["spec"]["replicas"] == 2
    assert settings["remediator_token_file"] == yaml.safe_load(
        find(rendered, "ConfigMap", SHIM_CONFIG)["data"]["exporter.yaml"])["remediator_token_file"]


def test_the_llama_server_workload_mounts_the_cached_build(rendered):
    engine = llama_server(8040, Path("/c/llamacpp/llama-server"), Path("/c/gguf/tiny.gguf"), Path("/usr/lib/libgomp.so.1"))
    config, deployment = server_workload(rendered, Workload("llama-hang", 8040, 9540, engine), IMAGE)
    pod = deployment["spec"]["template"]["spec"]
    server = pod["containers"][0]
    assert server["command"][0] == "/opt/llama/bin/llama-server" and "--metrics" in server["command"]
    assert {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v} == {"/c/llamacpp", "/c/gguf", "/usr/lib/libgomp.so.1"}
    assert yaml.safe_load(config["data"]["exporter.yaml"])["targets"][0]["engine"] == "llamacpp"


def test_the_exporter_and_remediator_keep_their_rbac_and_change_only_what_the_cluster_needs(rendered):
    for doc in fleet_exporter(rendered, IMAGE, 9481) + remediator(rendered, IMAGE, "http://10.213.0.1:9481"):
        shipped = find(rendered, doc["kind"], doc["metadata"]["name"])
        if doc["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "Service"):
            assert doc == shipped
    settings = yaml.safe_load(find(remediator(rendered, IMAGE, "http://x:1"), "ConfigMap", "llm-vitals-remediator")
                              ["data"]["remediator.yaml"])
    shipped = yaml.safe_load(find(rendered, "ConfigMap", "llm-vitals-remediator")["data"]["remediator.yaml"])
    changed = {k for k in shipped.keys() | settings.keys() if shipped.get(k) != settings.get(k)}
    assert changed == {"exporter_url", "global_cooldown", "gpu_fault_action", "max_unhealthy",
                       "storm_cooldown"}
    stateful = find(remediator(rendered, IMAGE, "http://x:1"), "StatefulSet", "llm-vitals-remediator")
    shipped_stateful = find(rendered, "StatefulSet", "llm-vitals-remediator")
    assert stateful["spec"]["replicas"] == 2 and stateful["spec"]["volumeClaimTemplates"] == \
        shipped_stateful["spec"]["volumeClaimTemplates"]
    pod, shipped_pod = stateful["spec"]["template"]["spec"], shipped_stateful["spec"]["template"]["spec"]
    assert _without(pod, "containers", "hostNetwork") == _without(shipped_pod, "containers")
    assert _without(pod["containers"][0], "image", "imagePullPolicy") == _without(shipped_pod["containers"][0], "image",
                                                                                   "imagePullPolicy")
    [pv] = journal_volumes([Path("/tmp/j0")])
    assert pv["spec"]["capacity"]["storage"] == "1Gi"
