"""What the tier deploys: the Helm chart deploy/helm/llm-vitals/ as Helm's own library renders it
offline (helm-python-sdk, in-process, as tests/test_deploy_helm.py does) with VALUES, changed only
where this cluster, this machine or the drills' time budget need it. Every change is made here, in
pure functions over the rendered objects, and listed in CHANGES; tests/kubelet/test_workloads.py
checks that nothing else differs (the probes, their paths and periods, the preStop hook, the RBAC).

The cluster (Kubernetes 1.20.2) has no CNI, no kube-proxy, no cluster DNS, no GPU, no registry and no
storage provisioner, and its nodes are network namespaces: pods run on the host network of their
node, so two pods on one node need different ports, and a Service name resolves nowhere.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python  # the test extra's helm-python-sdk: Helm's Go SDK in-process, no binary, no cluster
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "llm-vitals"
RELEASE = "llm-vitals"
NAMESPACE = "llm"
# The chart's values for this cluster: the classic sidecar (native sidecars need 1.29), the vLLM
# example on (each drill workload is a copy of it), no Prometheus Operator objects (no CRDs here),
# and no PodDisruptionBudgets (the chart renders policy/v1, which 1.20 lacks: CHANGES).
VALUES: Mapping[str, Any] = {
    "shim": {"sidecar": "classic"},
    "vllm": {"enabled": True},
    "serviceMonitor": {"enabled": False},
    "prometheusRule": {"enabled": False},
    "podDisruptionBudget": {"enabled": False},
}
SERVER = f"{RELEASE}-vllm"  # the vLLM example's Deployment and Service
SHIM_CONFIG = f"{SERVER}-shim"
MODEL_CACHE = f"{SERVER}-model-cache"  # its PersistentVolumeClaim, not deployed (CHANGES)
SHIPPED_IMAGE = "llm-vitals:0.1.0"
SHIM_PORT = 9471  # the shipped shim port, which the server's probes and preStop hook name

STORM_COOLDOWN_S = 60.0  # the remediator's storm_cooldown here (CHANGES)
CHANGES = (
    "values: shim.sidecar classic (native sidecars need 1.29), vllm.enabled, serviceMonitor and prometheusRule "
    "off (no Prometheus Operator CRDs), podDisruptionBudget off (the chart renders policy/v1 PDBs; 1.20 has "
    "policy/v1beta1 only)",
    "the namespace `llm` created by the tier, as `helm install --create-namespace` would (the chart renders none)",
    "images: the project image built here (imagePullPolicy: Never) for llm-vitals and for the server, "
    "which runs the simulator or the llama.cpp tier's llama-server instead of vLLM (no GPU, no download)",
    "hostNetwork: true (no CNI: a pod has its node's network, the node a namespace of its own)",
    "ports: each workload its own server and shim port (pods on one node share its ports); the probes, "
    "the preStop drain URL and the shim's listen/url follow",
    f"one Deployment per drill, each a copy of the `{SERVER}` Deployment with replicas 1 (2 for the fleet-gate "
    f"drill) and a `workload` label added to its selector, and its own copy of the `{SHIM_CONFIG}` ConfigMap, "
    "whose target's `workload` names that Deployment",
    "no resources on the server container: vLLM's requests (4 CPU, 32 Gi, 1 GPU) and limits (64 Gi, 1 GPU) "
    "fit no node here (2 cores, no GPU); the shim's stay as shipped",
    f"the model cache an emptyDir instead of the `{MODEL_CACHE}` PersistentVolumeClaim (no provisioner; "
    "the simulator and llama-server download nothing), which is not deployed",
    "timings: stuck_after 15 s in the shims and 10 s in the fleet exporter (shipped 120 s); the remediator's "
    "global_cooldown 30 s (shipped 15 min); the probes' periods and thresholds stay as shipped",
    "the remediator's exporter_url names the fleet exporter's pod address (no cluster DNS), "
    "gpu_fault_action is cordon_and_move (shipped: refuse) for the GPU-fault drill, and max_unhealthy is 1 "
    "(shipped 40%): the tier's fleet is a dozen one-replica drills, and two hung at once must be a storm; "
    f"storm_cooldown {STORM_COOLDOWN_S:g} s (shipped 10 min): the storm drill ends its storm by freeing one of "
    "its two hung servers and shows the remediator restarting the other once the cooldown has passed",
    "the shims' backstop.after is 90 s (shipped 10 min); the shims deployed after the remediator (the remediation "
    "and two-actor drills) ask a remediator replica's pod address (no cluster DNS); the probe drills' shims, "
    "deployed before it, keep the shipped Service name, which resolves nowhere here: never heard, their backstop "
    "acts alone, as those drills need",
)
BACKSTOP_AFTER = 90.0  # the shims' backstop.after here (CHANGES)
SHIM_STUCK_AFTER = 15.0  # the shims' stuck_after here (CHANGES): their liveness budget is twice it


def render(values: Mapping[str, Any] = VALUES) -> list[dict[str, Any]]:
    """Every object the chart renders for `values`, release `llm-vitals` in `llm` (NOTES.txt is not one)."""
    with helm_python.Chart.load(str(CHART)) as chart:
        manifests = chart.render(copy.deepcopy(dict(values)), name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [doc for path, text in sorted(manifests.items()) if not path.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


def namespace() -> dict[str, Any]:
    """The namespace the chart is installed into (CHANGES: the chart renders none)."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def find(docs: Sequence[Mapping[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return copy.deepcopy(dict(found[0]))


@dataclass(frozen=True)
class Engine:
    """The server container's process: the simulator (vLLM's page) or a real llama-server."""

    kind: str  # "vllm" (the simulator) or "llamacpp"
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[tuple[str, str, str], ...] = ()  # (host path, container path, hostPath type)


def simulator(port: int, *, load_seconds: float = 0, max_num_seqs: int = 4) -> Engine:
    """llm-vitals-sim as one vLLM server on `port` (all addresses: the tests reach it at the node's).

    `load_seconds`: nothing listens for that long first, as while a real server loads its weights
    (vLLM opens its port only once the engine is up)."""
    sim = f"exec llm-vitals-sim --host 0.0.0.0 --port {port} --no-control --max-num-seqs {max_num_seqs} --model tiny"
    command = ("sh", "-c", f"sleep {load_seconds:g}; {sim}") if load_seconds else tuple(sim.removeprefix("exec ").split())
    return Engine("vllm", command)


def llama_server(port: int, binary: Path, model: Path, libgomp: Path) -> Engine:
    """The llama.cpp tier's llama-server and tiny GGUF, mounted from its cache (hostPath); its engine loop
    on the main thread, the container's PID 1, so the freeze drill stops exactly that thread."""
    return Engine(
        "llamacpp",
        ("/opt/llama/bin/llama-server", "-m", f"/opt/llama/model/{model.name}", "--host", "0.0.0.0", "--port", str(port),
         "--metrics", "-np", "2", "-c", "16384", "-t", "1", "-b", "256", "--threads-http", "16", "-a", "tiny-llama"),
        env=(("LD_LIBRARY_PATH", "/opt/llama/lib"),),
        mounts=((str(binary.parent), "/opt/llama/bin", "Directory"), (str(model.parent), "/opt/llama/model", "Directory"),
                # The build links OpenMP's runtime, which the image's minimal Debian does not carry.
                (str(libgomp), "/opt/llama/lib/libgomp.so.1", "File")),
    )


@dataclass(frozen=True)
class Workload:
    name: str
    server_port: int
    shim_port: int
    engine: Engine
    stuck_after: str = f"{SHIM_STUCK_AFTER:g}s"
    labels: Mapping[str, str] = field(default_factory=dict)
    replicas: int = 1
    remediator_url: str | None = None  # where its shim asks its backstop's word; None: as shipped


def server_workload(rendered: Sequence[Mapping[str, Any]], w: Workload, image: str) -> list[dict[str, Any]]:
    """The chart's vLLM Deployment (classic sidecar) and its shim ConfigMap, copied for one workload (CHANGES)."""
    deployment = find(rendered, "Deployment", SERVER)
    config = find(rendered, "ConfigMap", SHIM_CONFIG)
    deployment["metadata"]["name"] = w.name
    config["metadata"]["name"] = f"{w.name}-shim"
    spec = deployment["spec"]
    spec["replicas"] = w.replicas
    labels = {"workload": w.name, **w.labels}
    spec["selector"]["matchLabels"].update(labels)
    spec["template"]["metadata"]["labels"].update(labels)
    pod = spec["template"]["spec"]
    pod["hostNetwork"] = True
    for volume in pod["volumes"]:
        if volume.get("configMap", {}).get("name") == SHIM_CONFIG:
            volume["configMap"]["name"] = config["metadata"]["name"]
        if volume.get("persistentVolumeClaim", {}).get("claimName") == MODEL_CACHE:
            del volume["persistentVolumeClaim"]
            volume["emptyDir"] = {}
    server, shim = pod["containers"]
    assert (server["name"], shim["name"]) == ("vllm", "vitals-shim"), [c["name"] for c in pod["containers"]]
    server["image"] = image
    server["imagePullPolicy"] = "Never"
    server.pop("args", None)
    server["command"] = list(w.engine.command)
    server["ports"] = [{"name": "http", "containerPort": w.server_port}]
    server["env"] = server.get("env", []) + [{"name": k, "value": v} for k, v in w.engine.env]
    del server["resources"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"]["port"] == SHIM_PORT
        server[probe]["httpGet"]["port"] = w.shim_port
    script = server["lifecycle"]["preStop"]["exec"]["command"]
    assert f":{SHIM_PORT}/" in script[-1]
    script[-1] = script[-1].replace(f":{SHIM_PORT}/", f":{w.shim_port}/")
    for i, (host, inside, kind) in enumerate(w.engine.mounts):
        pod["volumes"].append({"name": f"engine-{i}", "hostPath": {"path": host, "type": kind}})
        server["volumeMounts"].append({"name": f"engine-{i}", "mountPath": inside, "readOnly": True})
    assert shim["image"] == SHIPPED_IMAGE, shim["image"]
    shim["image"] = image
    shim["imagePullPolicy"] = "Never"
    shim["ports"] = [{"name": "vitals", "containerPort": w.shim_port}]
    shim_config = yaml.safe_load(config["data"]["exporter.yaml"])
    shim_config["listen"] = f"0.0.0.0:{w.shim_port}"
    [target] = shim_config["targets"]
    target["url"] = f"http://127.0.0.1:{w.server_port}"
    target["engine"] = w.engine.kind
    target["stuck_after"] = w.stuck_after
    target["workload"] = f"Deployment/{NAMESPACE}/{w.name}"
    shim_config["backstop"]["after"] = f"{BACKSTOP_AFTER:g}s"
    if w.remediator_url is not None:
        shim_config["remediator_url"] = w.remediator_url
    config["data"]["exporter.yaml"] = yaml.safe_dump(shim_config, sort_keys=False)
    return [config, deployment]


def _as_rendered(rendered: Sequence[Mapping[str, Any]], account: str, role: str, cluster_role: str,
                 service: str) -> list[dict[str, Any]]:
    """A component's ServiceAccount, RBAC and Service, exactly as the chart renders them."""
    return [find(rendered, kind, name) for kind, name in (
        ("ServiceAccount", account), ("Role", role), ("RoleBinding", role), ("ClusterRole", cluster_role),
        ("ClusterRoleBinding", cluster_role), ("Service", service))]


def _here(owner: dict[str, Any], image: str) -> dict[str, Any]:
    """The owner's one container, run on its node's network with the image built here (CHANGES)."""
    pod = owner["spec"]["template"]["spec"]
    pod["hostNetwork"] = True
    [container] = pod["containers"]
    container["image"] = image
    container["imagePullPolicy"] = "Never"
    return container


def fleet_exporter(rendered: Sequence[Mapping[str, Any]], image: str, port: int) -> list[dict[str, Any]]:
    """The fleet exporter with its ServiceAccount and RBAC as the chart renders them (CHANGES)."""
    docs = _as_rendered(rendered, "llm-vitals-exporter", "llm-vitals-exporter-pods",
                        f"llm-vitals-exporter-nodes-{NAMESPACE}", "llm-vitals")
    config = find(rendered, "ConfigMap", "llm-vitals-exporter")
    settings = yaml.safe_load(config["data"]["exporter.yaml"])
    settings["listen"] = f"0.0.0.0:{port}"
    settings["discovery"][0]["kubernetes"]["template"]["stuck_after"] = "10s"
    config["data"]["exporter.yaml"] = yaml.safe_dump(settings, sort_keys=False)
    deployment = find(rendered, "Deployment", "llm-vitals-exporter")
    _here(deployment, image)["ports"] = [{"name": "http", "containerPort": port}]
    return [*docs, config, deployment]


def remediator(rendered: Sequence[Mapping[str, Any]], image: str, exporter_url: str) -> list[dict[str, Any]]:
    """The remediator's StatefulSet of 2 with its RBAC as the chart renders them (CHANGES)."""
    docs = _as_rendered(rendered, "llm-vitals-remediator", "llm-vitals-remediator",
                        f"llm-vitals-remediator-{NAMESPACE}", "llm-vitals-remediator")
    config = find(rendered, "ConfigMap", "llm-vitals-remediator")
    settings = yaml.safe_load(config["data"]["remediator.yaml"])
    settings["exporter_url"] = exporter_url
    settings["global_cooldown"] = "30s"
    settings["gpu_fault_action"] = "cordon_and_move"
    settings["max_unhealthy"] = 1
    settings["storm_cooldown"] = f"{STORM_COOLDOWN_S:g}s"
    config["data"]["remediator.yaml"] = yaml.safe_dump(settings, sort_keys=False)
    stateful = find(rendered, "StatefulSet", "llm-vitals-remediator")
    _here(stateful, image)
    return [*docs, config, stateful]


def journal_volumes(directories: Sequence[Path]) -> list[dict[str, Any]]:
    """One hostPath PersistentVolume per remediator replica's journal claim (no provisioner here);
    the directories belong to the image's uid 10001, as fsGroup would make a provisioned volume."""
    return [{"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"journal-{i}"},
             "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                      "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(d), "type": "Directory"}}}
            for i, d in enumerate(directories)]


def tokens_secret(webhook: str, drain: str, read: str | None = None) -> dict[str, Any]:
    """The Secret the README has users create (`kubectl create secret generic llm-vitals-tokens`).

    `read-token`: the remediator's read token, which the shims ask their backstop's word with (the
    chart mounts it in both); no drill reads it yet, so a fresh one unless given."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "llm-vitals-tokens", "namespace": NAMESPACE},
            "stringData": {"webhook-token": webhook, "drain-token": drain,
                           "read-token": read if read is not None else secrets.token_hex(16)}}


def as_yaml(docs: Sequence[Mapping[str, Any]]) -> str:
    return yaml.safe_dump_all([{**d, "metadata": {"namespace": NAMESPACE, **d["metadata"]}}
                               if d["kind"] not in CLUSTER_KINDS else d for d in docs], sort_keys=False)


CLUSTER_KINDS = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "Node"}
