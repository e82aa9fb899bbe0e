"""The real-Kubernetes tier: tests against a real kube-apiserver + etcd (tests/k8s/control_plane.py).

Collected only under LLM_VITALS_REAL_K8S=1, which `make test-k8s` (tools/real-k8s-test.sh) sets after
building the binaries: the main `make test` never starts an API server (it needs a 5-minute build
that `make test` does not do, and its outage and expiry drills take tens of seconds). Where the
binaries are missing the tier skips with one line; under LLM_VITALS_REQUIRE_REAL_K8S=1 (CI) that
is a failure.

Fixtures:
  control_plane   one etcd + kube-apiserver per test session (per xdist worker), stopped at the end
  namespace       a fresh namespace per test (never waited on to delete)
  controller_manager   kube-controller-manager started for this test only (deployment, replicaset,
                  serviceaccount controllers), stopped after it
  exporter        a replicas.ExporterStandIn on loopback, serving TargetView JSON for the remediator
  replicas        `await replicas(**config)` starts remediator replicas in this test's namespace,
                  stops them after it and fails it if the API server refused them anything
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from real_tier import RealTier

from .control_plane import ControlPlane, missing
from .replicas import ExporterStandIn, Replica, grant_remediator_rbac, refused_to_remediator, start_replicas

TIER = RealTier("Kubernetes", enable="LLM_VITALS_REAL_K8S", require="LLM_VITALS_REQUIRE_REAL_K8S")
# Not part of the normal suite: `make test-k8s` runs the tier on its own.
collect_ignore_glob = TIER.left_out("test_*.py")


def pytest_configure(config):
    TIER.stop_on_sigterm()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    why = missing()
    if why is not None:
        TIER.skip_or_fail(why)
    plane = ControlPlane(Path(tmp_path_factory.mktemp("k8s")))
    with plane:
        yield plane


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> str:
    prefix = request.node.name.removeprefix("test_").replace("_", "-").lower()[:30].strip("-")
    return control_plane.new_namespace(prefix or "t")


@pytest.fixture
def controller_manager(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    control_plane.start_controller_manager()
    try:
        yield control_plane
    finally:
        control_plane.stop_controller_manager()


@pytest.fixture
async def exporter() -> AsyncIterator[ExporterStandIn]:
    stand_in = await ExporterStandIn().start()
    yield stand_in
    await stand_in.stop()


@pytest.fixture
async def replicas(control_plane: ControlPlane, namespace: str, exporter: ExporterStandIn,
                   tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[list[Replica]]]]:
    """`await replicas(**config)` starts remediator replicas (default two) in this test's namespace."""
    began = time.time()  # the audit log holds the worker's whole session: only this test's requests count
    started: list[Replica] = []
    grant_remediator_rbac(control_plane, namespace)

    async def start(names: tuple[str, ...] = ("replica-a", "replica-b"), **over: Any) -> list[Replica]:
        new = await start_replicas(control_plane, namespace, exporter.url, tmp_path / "replicas", names, **over)
        started.extend(new)
        return new

    yield start
    for replica in started:
        await replica.stop()
        print(replica.tail(60))  # shown by pytest when the test failed
    # The shipped RBAC sufficed: the API server refused the remediator nothing in this test (except
    # while it was coming back from a stop: its RBAC refuses everyone until it has synced).
    assert refused_to_remediator(control_plane, namespace, began) == []
