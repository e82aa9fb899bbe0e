"""Writes the kustomize variants of `deploy/kubernetes/` from the Helm chart: the chart is the one source.

`kubectl apply -k deploy/kubernetes/native/` (Kubernetes 1.29 and later) and `.../classic/` (older
clusters) apply what `helm template llm-vitals deploy/helm/llm-vitals -n llm` renders with the
values of `VARIANTS` below: the example vLLM Deployment on, the Prometheus Operator's objects on
(labelled `release: prometheus`), the release's Namespace, and the shim a native or a classic sidecar.

- `base/`: every template but the vLLM example, one file per template (`exporter.yaml` is
  templates/exporter.yaml rendered). Both variants render these the same; the script checks it.
- `native/`, `classic/`: the vLLM example (`vllm.yaml`) as each variant renders it, and a
  kustomization over `../base`.
- `deploy/helm/llm-vitals/files/llm-vitals.rules.yml`: a byte-for-byte copy of
  `alerts/llm-vitals.rules.yml`, which the chart's PrometheusRule reads with `.Files.Get` (Helm cannot
  read a file outside the chart, and a packaged chart must carry it). Written first, so the render
  carries the rules as they are.

Helm keeps the templates' comments; values.yaml documents the rest. Run this after editing the chart
or the rules (it needs helm-python-sdk, the test extra: `make install`):

    python deploy/kubernetes/make_from_chart.py          # rewrite the files
    python deploy/kubernetes/make_from_chart.py --check  # exit 1 if one is out of date

`tests/test_deploy_kubernetes.py` fails while the committed files and a fresh render differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHART = REPO / "deploy" / "helm" / "llm-vitals"
RULES = REPO / "alerts" / "llm-vitals.rules.yml"
CHART_RULES = CHART / "files" / "llm-vitals.rules.yml"
RELEASE, NAMESPACE = "llm-vitals", "llm"
VARIANT_TEMPLATE = "vllm.yaml"  # the one template the two variants render differently

COMMON: dict[str, Any] = {
    "createNamespace": True,
    "vllm": {"enabled": True},
    # kube-prometheus-stack selects these by its `release` label by default: set it to your Helm
    # release's name in an overlay (or relax the selector).
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
    # Scraped through the ServiceMonitors: annotations too would have a second job scrape them.
    "scrapeAnnotations": {"enabled": False},
}
VARIANTS: dict[str, dict[str, Any]] = {
    "native": {**COMMON, "shim": {"sidecar": "native"}},
    "classic": {**COMMON, "shim": {"sidecar": "classic"}},
}

HEADER = """\
# Generated from deploy/helm/llm-vitals by deploy/kubernetes/make_from_chart.py; do not edit.
# Change the chart (or the script's values) and run the script again.
"""

BEFORE_APPLYING = """\
# Before applying:
#   1. build and push the image (Dockerfile at the repo root; `make image`) and name it under
#      `images:` below (or in an overlay of your own with this folder as its resource);
#   2. create the tokens (never committed):
#        kubectl create namespace llm
#        kubectl -n llm create secret generic llm-vitals-tokens \\
#          --from-literal=webhook-token="$(openssl rand -hex 32)" \\
#          --from-literal=drain-token="$(openssl rand -hex 32)" \\
#          --from-literal=read-token="$(openssl rand -hex 32)"
#      (read-token: the remediator's read-only token; the vLLM pods' shims read their workload's
#      word with it: docs/remediator.md, "Two actors");
#   3. the ServiceMonitors, the PodMonitor and the PrometheusRule (base/servicemonitor.yaml,
#      base/prometheusrule.yaml) need the Prometheus Operator (kube-prometheus-stack): without it,
#      take the two files out of base/kustomization.yaml's resources and load
#      alerts/llm-vitals.rules.yml into your Prometheus; with it, label them for its selectors.
#
# The namespace (llm), the release name (llm-vitals) and the model are written into the objects and
# their configs: for others, render the chart yourself (docs/deploy.md), e.g.
#   helm template NAME deploy/helm/llm-vitals -n NAMESPACE --set vllm.enabled=true | kubectl apply -f -
"""

ABOUT = {
    "native": """\
# llm-vitals on Kubernetes 1.29 and later:  kubectl apply -k deploy/kubernetes/native/
#
# The chart's render with shim.sidecar=native: each vLLM pod's probe shim is a native sidecar, an
# initContainer with `restartPolicy: Always`. It starts before the server and stops after it, so it
# is still there to answer the server's preStop drain.
""",
    "classic": """\
# llm-vitals on Kubernetes before 1.29 (no native sidecars):  kubectl apply -k deploy/kubernetes/classic/
#
# The chart's render with shim.sidecar=classic: each vLLM pod's probe shim is an ordinary second
# container beside the server, without the native sidecar's startupProbe (ordinary containers do not
# wait for each other's start, so it would gate nothing, and on 1.18-1.21 a container with a
# startupProbe and no readinessProbe makes the pod Ready 30-70 s late: kubernetes#95140), and with a
# preStop hook that only waits, so it outlives the server's preStop drain and answers it.
""",
}

BASE_ABOUT = """\
# The objects the two variants (../native/, ../classic/) share: the chart's render but for the vLLM
# example, which each variant renders with its own sidecar.
"""


def render(values: dict[str, Any]) -> dict[str, str]:
    """The chart's render for these values: {template file name: its text}, empty templates left out."""
    import helm_python as helm  # the test extra; imported here so that `--help` needs nothing

    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    texts = {}
    for path, text in manifests.items():
        name = Path(path).name
        if name.endswith(".yaml") and text.strip():
            texts[name] = text.strip("\n") + "\n"
    return texts


def _kustomization(about: str, body: str) -> str:
    return HEADER + about + "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" + body


def _resources(names: list[str]) -> str:
    return "resources:\n" + "".join(f"  - {name}\n" for name in names)


def generate() -> dict[Path, str]:
    """Every file this script writes, with its text (the rules' copy in the chart first)."""
    rendered = {variant: render(values) for variant, values in VARIANTS.items()}
    native, classic = rendered["native"], rendered["classic"]
    shared = sorted(set(native) - {VARIANT_TEMPLATE})
    differ = [name for name in sorted(set(native) | set(classic)) if name != VARIANT_TEMPLATE
              and native.get(name) != classic.get(name)]
    if differ or VARIANT_TEMPLATE not in native:
        raise ValueError(f"the variants must differ in {VARIANT_TEMPLATE} alone; they differ in {differ}")
    files = {HERE / "base" / name: HEADER + native[name] for name in shared}
    files[HERE / "base" / "kustomization.yaml"] = _kustomization(BASE_ABOUT, _resources(shared))
    for variant, texts in rendered.items():
        files[HERE / variant / VARIANT_TEMPLATE] = HEADER + texts[VARIANT_TEMPLATE]
        files[HERE / variant / "kustomization.yaml"] = _kustomization(
            ABOUT[variant] + "#\n" + BEFORE_APPLYING,
            f"namespace: {NAMESPACE}\n" + _resources(["../base", VARIANT_TEMPLATE])
            + "images:\n  - name: llm-vitals\n    newName: llm-vitals  # e.g. registry.example.com/llm-vitals\n"
            + '    newTag: "0.1.0"\n')
    return files


def stale_files() -> list[Path]:
    """Generated files in the variants' folders that this script no longer writes."""
    wanted = set(generate())
    return sorted(p for folder in ("base", *VARIANTS) for p in (HERE / folder).glob("*.yaml") if p not in wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is out of date")
    args = parser.parse_args(argv)
    rules = RULES.read_text()
    if args.check:
        out_of_date = [] if CHART_RULES.exists() and CHART_RULES.read_text() == rules else [CHART_RULES]
        out_of_date += [path for path, text in generate().items() if not path.exists() or path.read_text() != text]
        out_of_date += stale_files()
        for path in out_of_date:
            print(f"{path.relative_to(REPO)} is out of date: run {Path(__file__).relative_to(REPO)}", file=sys.stderr)
        return 1 if out_of_date else 0
    CHART_RULES.write_text(rules)
    for path in stale_files():
        path.unlink()
        print(f"removed {path.relative_to(REPO)}")
    for path, text in generate().items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
