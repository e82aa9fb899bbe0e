"""The Helm chart and the kustomize variants install the same llm-vitals: a drift test.

deploy/helm/llm-vitals/ and deploy/kubernetes/{native,classic}/ are written apart (the variants
are what the real-kubelet tier deploys, so they are not generated from the chart). What must not
drift between them is compared here, the chart rendered as release `llm-vitals` in namespace `llm`
with the example vLLM on, beside `kubectl kustomize` of each variant:

- the rights: every Role's and ClusterRole's rules;
- the containers: the exporter's, the remediator's, the shim's and the server's command, args,
  ports and probes (the chart's larger default model takes longer to start: its startupProbe
  may allow more failures);
- the configs the exporter, the remediator and the shim read, but for what the chart names after
  its release (the pod selector) and the startup grace of its larger default model.

Names differ by design (the chart prefixes its release, and suffixes cluster-scoped names with the
namespace); objects are matched by the name left once those are taken off.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import test_deploy_kubernetes as variants
import yaml

chart = pytest.importorskip("test_deploy_helm", reason="helm-python-sdk (the test extra) renders the chart")

RELEASE, NAMESPACE = "llm-vitals", "llm"
SIDECAR = {"native": {}, "classic": {"shim": {"sidecar": "classic"}}}
CONFIGS = {"llm-vitals-exporter": "exporter.yaml", "llm-vitals-remediator": "remediator.yaml", "vllm-shim": "exporter.yaml"}
WORKLOADS = [("Deployment", "llm-vitals-exporter"), ("StatefulSet", "llm-vitals-remediator"), ("Deployment", "vllm")]


def component(doc: dict[str, Any]) -> tuple[str, str]:
    """(kind, name) with the chart's release prefix and namespace suffix taken off."""
    name = doc["metadata"]["name"]
    if name.startswith(f"{RELEASE}-vllm") or name.startswith(f"{RELEASE}-{RELEASE}"):
        name = name.removeprefix(f"{RELEASE}-")
    return doc["kind"], name.removesuffix(f"-{NAMESPACE}")


def by_component(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {component(d): d for d in docs}


@pytest.fixture(scope="module", params=list(SIDECAR))
def pair(request) -> tuple[dict, dict]:
    """(the chart's objects, the variant's objects), each by component."""
    values = {"vllm": {"enabled": True}, **SIDECAR[request.param]}
    return (by_component(chart.render(values, release=RELEASE, namespace=NAMESPACE)),
            by_component(variants.render(request.param)))


def test_objects_are_matched_by_component(pair) -> None:
    from_chart, from_variant = pair
    # The chart's own extras (a model cache, the remediator's PDB) and the variant's (its Namespace,
    # the Prometheus Operator's objects, which the chart makes only when asked) aside, the same objects.
    shared = set(from_chart) & set(from_variant)
    assert {("Deployment", "vllm"), ("StatefulSet", "llm-vitals-remediator"), ("ClusterRole", "llm-vitals-remediator"),
            ("Role", "llm-vitals-exporter-pods"), ("ConfigMap", "vllm-shim")} <= shared, sorted(shared)


def test_the_chart_and_the_variants_grant_the_same_rights(pair) -> None:
    from_chart, from_variant = pair
    roles = [key for key in from_variant if key[0] in ("Role", "ClusterRole")]
    assert len(roles) >= 4
    for key in roles:
        assert from_chart[key]["rules"] == from_variant[key]["rules"], key


def _pod(docs: dict, kind: str, name: str) -> dict[str, Any]:
    return docs[(kind, name)]["spec"]["template"]["spec"]


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in [*pod.get("initContainers", []), *pod["containers"]]}


@pytest.mark.parametrize(("kind", "name"), WORKLOADS)
def test_the_chart_and_the_variants_run_the_same_containers(pair, kind, name) -> None:
    from_chart, from_variant = pair
    ours, theirs = _containers(_pod(from_chart, kind, name)), _containers(_pod(from_variant, kind, name))
    assert set(ours) == set(theirs)
    for container, wanted in theirs.items():
        got = ours[container]
        for key in ("command", "ports", "livenessProbe", "readinessProbe", "restartPolicy", "lifecycle"):
            assert got.get(key) == wanted.get(key), (name, container, key)
        if container == "vllm":  # the chart's default model is larger than the variants' example
            assert got["args"][2:] == wanted["args"][2:] and got["args"][0] == wanted["args"][0] == "--model"
        else:
            assert got.get("args") == wanted.get("args"), (name, container)
        startup = {k: v for k, v in (got.get("startupProbe") or {}).items() if k != "failureThreshold"}
        assert startup == {k: v for k, v in (wanted.get("startupProbe") or {}).items() if k != "failureThreshold"}


def _config(docs: dict, name: str) -> dict[str, Any]:
    config = copy.deepcopy(yaml.safe_load(docs[("ConfigMap", name)]["data"][CONFIGS[name]]))
    for target in [*config.get("targets", []),
                   *(d["kubernetes"]["template"] for d in config.get("discovery", []) if "kubernetes" in d)]:
        target.pop("startup_grace")  # the chart's default model loads longer
        target.pop("workload", None)  # the Deployment it names: the chart's carries the release's prefix
    for source in config.get("discovery", []):
        source.get("kubernetes", {}).pop("selector")  # the chart's pods carry its own labels
    return config


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_chart_and_the_variants_configure_the_same_vitals(pair, name) -> None:
    from_chart, from_variant = pair
    # The read token included: the status page and the shim read the remediator with it in both.
    assert _config(from_chart, name) == _config(from_variant, name)
