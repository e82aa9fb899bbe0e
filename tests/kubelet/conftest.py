"""The real-kubelet tier: the probes, the drain and the remediation judged by real kubelets.

Collected only under LLM_VITALS_REAL_KUBELET=1, which `make test-kubelet` (tools/real-kubelet-test.sh)
sets after building what it needs: the main `pytest -n 2` run of tests/ never starts a cluster. Where a
part is missing the tier skips with one line; under LLM_VITALS_REQUIRE_REAL_KUBELET=1 (CI) that is a
failure.

One cluster for the whole run (tests/kubelet/cluster.py: two nodes, each a network namespace of its
own), the project's image on both nodes, and one watch of the namespace's pods and Endpoints. The
drills of test_probes.py run side by side on it; test_remediation.py's follow. At the end the cluster
is stopped by PID and the teardown asserts that nothing of it is left on the machine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from real_tier import RealTier

from . import fleet as chain
from .cluster import Binaries, Cluster
from .history import History
from .image import build_image
from .tier import OUT, Report, Tier
from .workloads import CHANGES, NAMESPACE, SERVER, find, namespace, render, tokens_secret

TIER = RealTier("kubelet", enable="LLM_VITALS_REAL_KUBELET", require="LLM_VITALS_REQUIRE_REAL_KUBELET")
# Not part of the normal suite: `make test-kubelet` runs the tier on its own.
collect_ignore = TIER.left_out("test_probes.py", "test_remediation.py", "test_two_actors.py")
RUN_DIR_ENV = "LLM_VITALS_KUBELET_RUN"  # tools/real-kubelet-test.sh makes it and stops whatever is left in it

REPORT = Report(OUT / "report.json")


def pytest_configure(config):
    TIER.stop_on_sigterm()


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    kube_bin, base_tar = (_env_path(n) for n in ("LLM_VITALS_KUBE_BIN", "LLM_VITALS_KUBELET_BASE_TAR"))
    if kube_bin is None or base_tar is None:
        TIER.skip_or_fail("the build's paths are not set (LLM_VITALS_KUBE_BIN, ...); run `make test-kubelet`")
    binaries = Binaries(kube_bin)
    if why := binaries.missing():
        TIER.skip_or_fail(why)
    if os.geteuid() != 0:
        TIER.skip_or_fail("needs root (network namespaces, dockerd, the kubelet's mounts and cgroups)")
    parent = _env_path(RUN_DIR_ENV)
    run = Path(tempfile.mkdtemp(prefix="c.", dir=parent or "/tmp"))  # short: unix socket paths
    began = time.monotonic()
    cluster = Cluster(run, binaries).start()
    REPORT.facts["cluster start s"] = round(time.monotonic() - began, 1)
    REPORT.facts["cluster timings"] = cluster.timings
    try:
        yield cluster
    finally:
        left = cluster.stop()
        REPORT.facts["stop s"] = cluster.timings.get("stop")
        REPORT.facts["left over"] = left
        REPORT.facts["stop notes"] = cluster.stop_notes
        REPORT.write()
        assert left == [], f"the cluster left these behind: {left}"


@pytest.fixture(scope="session")
def tier(cluster: Cluster) -> Iterator[Tier]:
    base_tar = _env_path("LLM_VITALS_KUBELET_BASE_TAR")
    assert base_tar is not None
    work = cluster.run / "image"
    work.mkdir()
    image, spent = build_image(cluster, base_tar, work)
    shutil.rmtree(work, ignore_errors=True)
    REPORT.facts["image"] = spent
    rendered = render()
    REPORT.facts["deployed"] = "deploy/helm/llm-vitals/ as Helm renders it (helm-python-sdk), with these changes only: " + \
        "; ".join(CHANGES)
    history = History(cluster.client, NAMESPACE, SERVER).start()
    tier = Tier(cluster, image, rendered, history, REPORT)
    tier.apply([namespace()])
    tier.apply([tokens_secret(tier.webhook_token, tier.drain_token), find(rendered, "Service", SERVER)])
    try:
        yield tier
    finally:
        history.close()
        REPORT.write()


@pytest.fixture(scope="session")
def fleet(tier: Tier) -> Iterator[chain.Fleet]:
    """The whole chain (tests/kubelet/fleet.py), for the remediation and the two actors' drills."""
    started = chain.start(tier)
    try:
        yield started
    finally:
        chain.stop(started)


def pytest_terminal_summary(terminalreporter):
    if not REPORT.drills and not REPORT.facts:
        return
    terminalreporter.section("real-kubelet drills")
    for key in ("cluster start s", "cluster timings", "image", "probe drills s", "fleet ready s", "stop s", "stop notes",
                "left over"):
        if key in REPORT.facts:
            terminalreporter.write_line(f"{key}: {REPORT.facts[key]}")
    for name, record in REPORT.drills.items():
        headline = record.get("headline", "")
        terminalreporter.write_line(f"{name}: {headline}")
    terminalreporter.write_line(f"report: {REPORT.path}")
