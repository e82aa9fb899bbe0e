"""deploy/helm/llm-vitals/: the chart rendered offline by Helm's own library, strictly linted, and
every object it renders schema-valid, for the default values and with every toggle on.

Helm runs in-process through `helm-python-sdk` (Helm v4's Go SDK behind a C ABI, bundled in the
wheel: no `helm` binary, no cluster, no network). The built-in kinds are validated strictly against
the Kubernetes 1.29 and 1.33 schemas that `kubernetes-validate` ships. The Prometheus Operator's
ServiceMonitor and PrometheusRule are not in those schemas, and no CRD schema is vendored here, so
their structure is checked field by field below (and the rule's groups must be `alerts/`'s own).
The programs' configs the chart writes into its ConfigMaps are checked by the programs' own models.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import yaml
from conftest import REPO
from kube_schema import CRDS, VERSIONS, assert_schema_valid

from llm_vitals.exporter.settings import ExporterSettings
from llm_vitals.remediator.settings import Settings as RemediatorSettings

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (the test extra) renders the chart")

CHART = REPO / "deploy" / "helm" / "llm-vitals"
RELEASE, NAMESPACE = "llm-vitals", "llm"

EVERYTHING_ON = {
    "vllm": {"enabled": True},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "podDisruptionBudget": {"enabled": True},
    "networkPolicy": {"enabled": True, "from": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]},
    "additionalLabels": {"team": "inference"},
}
CLASSIC = {**EVERYTHING_ON, "shim": {"sidecar": "classic"}}
VALUE_SETS = {"defaults": {}, "everything-on": EVERYTHING_ON, "classic-sidecar": CLASSIC}


@contextmanager
def _chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(str(CHART)) as chart:
        yield chart


def render(values: dict, *, release: str = RELEASE, namespace: str = NAMESPACE) -> list[dict]:
    """Every object the chart renders for these values (NOTES.txt is not an object)."""
    with _chart() as chart:
        manifests = chart.render(values, name=release, namespace=namespace, is_install=True)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


RENDERED = {name: render(values) for name, values in VALUE_SETS.items()}


def _one(objects: list[dict], kind: str, name: str) -> dict:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _config(objects: list[dict], name: str, key: str) -> dict:
    return yaml.safe_load(_one(objects, "ConfigMap", name)["data"][key])


# ---- Helm itself: lint and the values schema -------------------------------------------------

@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=list(VALUE_SETS))
def test_helm_lint_strict_finds_nothing(values):
    report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE)
    # Severity 1 is information ("icon is recommended"); 2 and above fail a strict lint.
    findings = [m for m in report["messages"] if m["severity"] >= 2]
    assert not findings and not report["errors"], report


@pytest.mark.parametrize("values, where", [
    ({"vllm": {"enabld": True}}, "enabld"),
    ({"serviceMonitors": {"enabled": True}}, "serviceMonitors"),
    ({"remediator": {"replicas": "2"}}, "replicas"),
    ({"prometheusRule": {"enabled": "yes"}}, "enabled"),
    ({"shim": {"sidecar": "sidecar"}}, "sidecar"),
    ({"vllm": {"image": {"tag": "latest"}}}, "tag"),
    ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
])
def test_the_values_schema_refuses_unknown_keys_and_wrong_types(values, where):
    with _chart() as chart, pytest.raises(helm.HelmError) as caught:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert where in str(caught.value)


def test_the_schema_knows_every_default_value():
    """values.yaml and values.schema.json cannot drift: every key the defaults have is declared."""
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(values: dict, node: dict, path: str) -> None:
        assert node.get("type") == "object", path
        if node.get("additionalProperties") is not False:
            return  # a free-form map (labels, resources' quantities, the programs' own configs)
        for key, value in values.items():
            assert key in node["properties"], f"{path}.{key} is not in values.schema.json"
            if isinstance(value, dict):
                walk(value, node["properties"][key], f"{path}.{key}")

    walk(yaml.safe_load((CHART / "values.yaml").read_text()), schema, "values")


# ---- every object schema-valid ---------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("values_name", list(VALUE_SETS))
def test_every_rendered_object_is_schema_valid(values_name, version):
    assert assert_schema_valid(RENDERED[values_name], version) >= 14


def test_every_toggle_adds_its_objects():
    def kinds(objects: list[dict]) -> set[str]:
        return {o["kind"] for o in objects}

    defaults, on = kinds(RENDERED["defaults"]), kinds(RENDERED["everything-on"])
    assert not defaults & (CRDS | {"NetworkPolicy", "PersistentVolumeClaim"})
    assert on - defaults == CRDS | {"NetworkPolicy", "PersistentVolumeClaim"}
    assert "PodDisruptionBudget" in defaults  # the remediator's, on by default
    names = {(o["kind"], o["metadata"]["name"]) for o in RENDERED["everything-on"]}
    assert {("PodDisruptionBudget", "llm-vitals-vllm"), ("Deployment", "llm-vitals-vllm"),
            ("NetworkPolicy", "llm-vitals-exporter"), ("NetworkPolicy", "llm-vitals-remediator")} <= names
    off = render({"podDisruptionBudget": {"enabled": False}, "scrapeAnnotations": {"enabled": False}})
    assert "PodDisruptionBudget" not in kinds(off)
    assert not [o for o in off if o["kind"] == "Service" and o["metadata"].get("annotations")]


def test_additional_labels_reach_every_object():
    for doc in RENDERED["everything-on"]:
        assert doc["metadata"]["labels"]["team"] == "inference", f"{doc['kind']}/{doc['metadata']['name']}"
    for doc in RENDERED["everything-on"]:
        if doc["kind"] in CRDS:
            assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_create_namespace_renders_the_releases_namespace():
    """For a render applied without Helm (the kustomize variants); off by default (--create-namespace)."""
    assert not [o for o in RENDERED["defaults"] if o["kind"] == "Namespace"]
    [namespace] = [o for o in render({"createNamespace": True}, namespace="serving") if o["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == "serving"
    assert namespace["metadata"]["labels"]["app.kubernetes.io/part-of"] == "llm-vitals"


def test_a_release_of_another_name_names_its_objects_after_itself():
    objects = render({"vllm": {"enabled": True}}, release="prod", namespace="serving")
    remediator = RemediatorSettings.model_validate(_config(objects, "prod-llm-vitals-remediator", "remediator.yaml"))
    assert remediator.exporter_url == "http://prod-llm-vitals:9471"
    assert remediator.kubernetes is not None and remediator.kubernetes.lease is not None
    assert (remediator.kubernetes.lease.namespace, remediator.kubernetes.lease.name) == \
        ("serving", "prod-llm-vitals-remediator")
    role = _one(objects, "Role", "prod-llm-vitals-remediator")
    assert [r["resourceNames"] for r in role["rules"] if "resourceNames" in r] == [
        ["prod-llm-vitals-remediator", "prod-llm-vitals-remediator-epoch"]]  # the state, the epoch's marker
    [template] = remediator.target_templates
    assert template.match.namespace == "serving"
    exporter = ExporterSettings.model_validate(_config(objects, "prod-llm-vitals-exporter", "exporter.yaml"))
    assert exporter.discovery[0].kubernetes is not None
    assert exporter.discovery[0].kubernetes.namespaces == ["serving"]
    assert str(exporter.remediator_url).rstrip("/") == "http://prod-llm-vitals-remediator:9472"


# ---- the monitoring objects ------------------------------------------------------------------

def test_the_prometheusrule_is_the_rules_file_unchanged():
    rule = _one(RENDERED["everything-on"], "PrometheusRule", "llm-vitals")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    rules = yaml.safe_load((REPO / "alerts" / "llm-vitals.rules.yml").read_text())
    assert rule["spec"] == {"groups": rules["groups"]}


def test_the_charts_copy_of_the_rules_is_in_sync():
    """The chart reads files/llm-vitals.rules.yml (Helm cannot reach outside the chart); the generator
    writes it from alerts/, and this fails until it is run after a change to the rules."""
    copy = CHART / "files" / "llm-vitals.rules.yml"
    assert copy.read_text() == (REPO / "alerts" / "llm-vitals.rules.yml").read_text(), \
        "run: python deploy/kubernetes/make_from_chart.py"


def test_servicemonitors_select_their_services_and_name_the_job_the_rules_watch():
    objects = RENDERED["everything-on"]
    for monitor_name, service_name in [("llm-vitals", "llm-vitals"), ("llm-vitals-remediator", "llm-vitals-remediator")]:
        monitor = _one(objects, "ServiceMonitor", monitor_name)
        service = _one(objects, "Service", service_name)
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(monitor["spec"]) <= {"jobLabel", "selector", "endpoints"}
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["http"]
        assert "http" in {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert set(endpoint) <= {"port", "path", "interval"} and endpoint["path"] == "/metrics"
    exporter_monitor = _one(objects, "ServiceMonitor", "llm-vitals")
    # The rules' absent-alerts watch these jobs; the job is the Services' llm-vitals.io/job label,
    # so a release of any name keeps them.
    rules = (REPO / "alerts" / "llm-vitals.rules.yml").read_text()
    for release in [RELEASE, "prod"]:
        rendered = objects if release == RELEASE else render(EVERYTHING_ON, release=release)
        prefix = "llm-vitals" if release == RELEASE else "prod-llm-vitals"
        for monitor_name, job in [(prefix, "llm-vitals"), (f"{prefix}-remediator", "llm-vitals-remediator")]:
            monitor = _one(rendered, "ServiceMonitor", monitor_name)
            service = _one(rendered, "Service", monitor_name)
            assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == job
            assert f'up{{job="{job}"}}' in rules
    # Only the fleet exporter is scraped for verdicts: the vLLM pods' shims would duplicate every series.
    vllm_service = _one(objects, "Service", "llm-vitals-vllm")
    assert not exporter_monitor["spec"]["selector"]["matchLabels"].items() <= vllm_service["metadata"]["labels"].items()


def test_without_the_operator_the_services_carry_scrape_annotations():
    for name, port in [("llm-vitals", "9471"), ("llm-vitals-remediator", "9472")]:
        annotations = _one(RENDERED["defaults"], "Service", name)["metadata"]["annotations"]
        assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": port,
                               "prometheus.io/path": "/metrics"}


# ---- the exporter and the remediator -----------------------------------------------------------

def test_the_programs_accept_the_configs_the_chart_writes():
    for values_name, objects in RENDERED.items():
        exporter = ExporterSettings.model_validate(_config(objects, "llm-vitals-exporter", "exporter.yaml"))
        assert (exporter.host, exporter.port) == ("0.0.0.0", 9471), values_name
        remediator = RemediatorSettings.model_validate(
            _config(objects, "llm-vitals-remediator", "remediator.yaml"))
        assert remediator.exporter_url == "http://llm-vitals:9471"
        assert remediator.gpu_fault_action == "refuse"  # cordon_and_move is a choice a human makes


def test_config_values_win_over_the_charts_own_keys():
    objects = render({"remediator": {"config": {"dry_run": True, "global_cooldown": "30m"}},
                      "exporter": {"config": {"poll_interval": "2s"}}})
    remediator = _config(objects, "llm-vitals-remediator", "remediator.yaml")
    assert remediator["dry_run"] is True and remediator["global_cooldown"] == "30m"
    assert remediator["budget"] == {"max_restarts": 3, "window": "1h"}  # the rest of the defaults stay
    assert _config(objects, "llm-vitals-exporter", "exporter.yaml")["poll_interval"] == "2s"


def test_remediator_replicas_share_the_lease_their_role_names():
    objects = render({"remediator": {"replicas": 3}})
    stateful = _one(objects, "StatefulSet", "llm-vitals-remediator")
    assert stateful["spec"]["replicas"] == 3
    settings = RemediatorSettings.model_validate(_config(objects, "llm-vitals-remediator", "remediator.yaml"))
    assert settings.kubernetes is not None and settings.kubernetes.lease is not None
    role = _one(objects, "Role", "llm-vitals-remediator")
    assert [r.get("resourceNames") for r in role["rules"] if r["resources"] == ["leases"]] == \
        [[settings.kubernetes.lease.name, settings.kubernetes.lease.name + "-epoch"], None]  # and the epoch's marker
    [claim] = stateful["spec"]["volumeClaimTemplates"]
    pod = stateful["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert str(settings.state_path.parent) == mounts[claim["metadata"]["name"]]


def test_tolerations_and_node_selectors_reach_the_pods():
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
    selector = {"pool": "ops"}
    objects = render({"exporter": {"tolerations": [toleration], "nodeSelector": selector},
                      "remediator": {"tolerations": [toleration], "nodeSelector": selector}})
    for kind, name in [("Deployment", "llm-vitals-exporter"), ("StatefulSet", "llm-vitals-remediator")]:
        pod = _one(objects, kind, name)["spec"]["template"]["spec"]
        assert pod["tolerations"] == [toleration] and pod["nodeSelector"] == selector


def test_every_container_has_resources_and_runs_as_the_images_user():
    for values_name in ["everything-on", "classic-sidecar"]:
        for doc in RENDERED[values_name]:
            if doc["kind"] not in {"Deployment", "StatefulSet"}:
                continue
            pod = doc["spec"]["template"]["spec"]
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                assert container["resources"]["requests"], f"{doc['metadata']['name']}/{container['name']}"
                if container["image"].startswith("llm-vitals:"):
                    assert container["securityContext"]["runAsUser"] == 10001


# ---- the vLLM example: fit for a GPU node ------------------------------------------------------

def _vllm_pod(values_name: str = "everything-on") -> dict:
    return _one(RENDERED[values_name], "Deployment", "llm-vitals-vllm")["spec"]["template"]["spec"]


def _server(pod: dict) -> dict:
    [server] = [c for c in pod["containers"] if c["name"] == "vllm"]
    return server


def test_the_vllm_server_is_pinned_sized_and_tolerates_the_gpu_taint():
    pod = _vllm_pod()
    server = _server(pod)
    repository, _, tag = server["image"].partition(":")
    assert repository == "vllm/vllm-openai" and tag.startswith("v0.") and tag != "latest"
    requests = server["resources"]["requests"]
    assert requests["nvidia.com/gpu"] == server["resources"]["limits"]["nvidia.com/gpu"] == 1
    # vLLM's API server needs a core of its own beside the engine's threads.
    assert float(requests["cpu"]) >= 2 and requests["memory"].endswith("Gi")
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_the_model_cache_is_a_claim_and_the_hf_token_a_secret():
    pod = _vllm_pod()
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim_name = volumes["model-cache"]["persistentVolumeClaim"]["claimName"]
    claim = _one(RENDERED["everything-on"], "PersistentVolumeClaim", claim_name)
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    server = _server(pod)
    env = {e["name"]: e for e in server["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf-token"
    mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
    assert env["HF_HOME"]["value"].startswith(mounts["model-cache"] + "/")
    existing = render({"vllm": {"enabled": True, "modelCache": {"existingClaim": "weights"}}})
    assert not [o for o in existing if o["kind"] == "PersistentVolumeClaim"]
    pod = _one(existing, "Deployment", "llm-vitals-vllm")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["model-cache"]["persistentVolumeClaim"]["claimName"] == "weights"


@pytest.mark.parametrize("minutes", [20, 45])
def test_the_startup_budget_is_the_probes_and_the_shims(minutes):
    objects = render({"vllm": {"enabled": True, "startupBudgetMinutes": minutes}})
    pod = _one(objects, "Deployment", "llm-vitals-vllm")["spec"]["template"]["spec"]
    probe = _server(pod)["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == minutes * 60
    shim = ExporterSettings.model_validate(_config(objects, "llm-vitals-vllm-shim", "exporter.yaml"))
    assert shim.targets[0].startup_grace == minutes * 60


def test_the_exporter_discovers_the_example_pods():
    objects = RENDERED["everything-on"]
    deployment = _one(objects, "Deployment", "llm-vitals-vllm")
    exporter = ExporterSettings.model_validate(_config(objects, "llm-vitals-exporter", "exporter.yaml"))
    [source] = exporter.discovery
    pods = source.kubernetes
    assert pods is not None and pods.namespaces == [NAMESPACE]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for term in pods.selector.split(","):
        key, _, value = term.partition("=")
        assert labels[key] == value
    assert pods.port in {p["name"] for p in _server(deployment["spec"]["template"]["spec"])["ports"]}
    budget = _one(objects, "PodDisruptionBudget", "llm-vitals-vllm")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_native_sidecar_the_shim_starts_first_and_takes_the_probes():
    pod = _vllm_pod("everything-on")
    [shim] = pod["initContainers"]
    assert shim["restartPolicy"] == "Always" and "livenessProbe" not in shim
    server = _server(pod)
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"]:
        assert server[probe]["httpGet"]["port"] == 9471
        assert server[probe]["httpGet"]["path"].startswith("/probe/vllm/")
    assert "drain" in server["lifecycle"]["preStop"]["exec"]["command"][-1]


def test_classic_sidecar_the_shim_is_a_second_container_that_outlives_the_drain():
    pod = _vllm_pod("classic-sidecar")
    assert "initContainers" not in pod
    [shim] = [c for c in pod["containers"] if c["name"] == "vitals-shim"]
    assert "restartPolicy" not in shim and "startupProbe" not in shim
    assert "sleep(20)" in shim["lifecycle"]["preStop"]["exec"]["command"][-1]
    assert _server(pod)["livenessProbe"]["httpGet"]["port"] == 9471


def test_the_shims_ask_the_remediator_for_their_deployments_word_with_the_read_token():
    """One actor decides (issue 33): the shim's backstop section, its read token from the tokens
    Secret (as the remediator reads it), and the workload the fleet exporter names the pods by."""
    objects = RENDERED["everything-on"]
    shim_settings = ExporterSettings.model_validate(_config(objects, "llm-vitals-vllm-shim", "exporter.yaml"))
    assert shim_settings.backstop is not None and shim_settings.backstop.after == 600
    assert str(shim_settings.remediator_url).rstrip("/") == "http://llm-vitals-remediator:9472"
    assert str(shim_settings.remediator_token_file) == "/etc/llm-vitals/tokens/read-token"
    assert [t.effective_workload for t in shim_settings.targets] == [f"Deployment/{NAMESPACE}/llm-vitals-vllm"]
    pod = _vllm_pod("everything-on")
    [tokens] = [v for v in pod["volumes"] if v["name"] == "tokens"]
    assert {"key": "read-token", "path": "read-token"} in tokens["secret"]["items"]
    monitor = _one(objects, "PodMonitor", "llm-vitals-shims")
    assert monitor["spec"]["podMetricsEndpoints"][0]["metricRelabelings"][0]["regex"] == "llm_vitals_backstop_.*"
    # Without the remediator (or with the backstop off) the shim acts alone, as before, and mounts no read token.
    for values in ({**EVERYTHING_ON, "remediator": {"enabled": False}},
                   {**EVERYTHING_ON, "shim": {"backstop": {"enabled": False}}}):
        alone = render(values)
        settings = _config(alone, "llm-vitals-vllm-shim", "exporter.yaml")
        assert "backstop" not in settings and "remediator_url" not in settings
        assert not [o for o in alone if o["kind"] == "PodMonitor"]
