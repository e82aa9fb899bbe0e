"""Kubernetes objects checked strictly against the API's own OpenAPI schemas (kubernetes-validate):
one check for the deploy tests (the kustomize variants and the Helm chart)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kubernetes_validate
import pytest

# Native sidecars (initContainers with restartPolicy: Always) need 1.29; check a recent one too.
VERSIONS = ["1.29.0", "1.33.0"]
# The Prometheus Operator's kinds: kubernetes-validate has no schema for them.
CRDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def assert_schema_valid(docs: Iterable[dict[str, Any]], version: str, where: str = "") -> int:
    """Fail at the first object (CRDs aside) that `version`'s schema refuses, misspelt fields included; how many were checked."""
    checked = 0
    for doc in docs:
        if doc["kind"] in CRDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where}{doc['kind']}/{doc['metadata']['name']}: {exc.message} at "
                        f"{'.'.join(str(p) for p in exc.path)}")
        checked += 1
    return checked
