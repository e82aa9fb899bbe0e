"""The project's image on every node, by the Docker tier's path: the Dockerfile built on the Debian
base made locally with debootstrap (tools/real-docker-setup.sh), from a wheelhouse built on the
host, with `--network none`; then copied to the other nodes' daemons (`docker save | docker load`).

Nothing is pulled: every pod names its image with `imagePullPolicy: Never`. The wheelhouse is the
Docker tier's (tests/wheelhouse.py), from the same cache of the dependencies' wheels.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from wheelhouse import fill_wheelhouse

from .cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "llm-vitals-test/debian-local:bookworm"
IMAGE = "llm-vitals-test/llm-vitals:kubelet"


def build_image(cluster: Cluster, base_tar: Path, workdir: Path) -> tuple[str, dict[str, float]]:
    """Build IMAGE on node 1 and load it into every other node; (IMAGE, seconds per step)."""
    spent: dict[str, float] = {}
    t0 = time.monotonic()
    with open(base_tar, "rb") as stream:
        cluster.docker(1, "import", "-", BASE_IMAGE, stdin=stream)
    spent["import base"] = time.monotonic() - t0
    t0 = time.monotonic()
    context = workdir / "build-context"
    fill_wheelhouse(context, workdir)
    spent["wheels"] = time.monotonic() - t0
    t0 = time.monotonic()
    cluster.docker(1, "build", "--network", "none", "--force-rm", "-q",
                   "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "--build-arg", "WHEELHOUSE=wheelhouse",
                   "-f", str(REPO / "Dockerfile"), "-t", IMAGE, str(context), timeout=900)
    spent["docker build"] = time.monotonic() - t0
    shutil.rmtree(context, ignore_errors=True)
    t0 = time.monotonic()
    for n in range(2, cluster.nodes + 1):
        save = subprocess.Popen(cluster.docker_argv(1, "save", IMAGE), stdout=subprocess.PIPE)
        cluster.docker(n, "load", "-q", stdin=save.stdout, timeout=600)
        assert save.wait(timeout=60) == 0
    spent["load on the other nodes"] = time.monotonic() - t0
    return IMAGE, {k: round(v, 1) for k, v in spent.items()}
