"""The project's image on every node, by the Docker tier's path: the Dockerfile built on the Debian
base made locally with debootstrap (tools/real-docker-setup.sh), from a wheelhouse built on the
host, with `--network none`; then copied to the other nodes' daemons (`docker save | docker load`).

Nothing is pulled: every pod names its image with `imagePullPolicy: Never`. The dependencies' wheels
are cached outside the clone under the same key as the Docker tier's (tools/cache-path.sh
docker-wheels KEY), so the two tiers share one download.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from .cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "llm-vitals-test/debian-local:bookworm"
IMAGE = "llm-vitals-test/llm-vitals:kubelet"


def dependency_wheels() -> Path:
    """Every dependency's wheel, built once per dependency list and Python version (the Docker tier's cache)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    key = hashlib.sha256(json.dumps([project["dependencies"], sys.version_info[:2]]).encode()).hexdigest()[:12]
    cache = Path(subprocess.run(["bash", str(REPO / "tools" / "cache-path.sh"), "docker-wheels", key],
                                capture_output=True, text=True, check=True).stdout.strip())
    if (cache / ".complete").is_file():
        return cache
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(cache), str(REPO)],
                            capture_output=True, text=True, timeout=900, cwd=cache)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for own in cache.glob("llm_vitals-*.whl"):
        own.unlink()  # the project's own wheel is built fresh every run
    (cache / ".complete").write_text(" ".join(project["dependencies"]) + "\n")
    return cache


def build_image(cluster: Cluster, base_tar: Path, workdir: Path) -> tuple[str, dict[str, float]]:
    """Build IMAGE on node 1 and load it into every other node; (IMAGE, seconds per step)."""
    spent: dict[str, float] = {}
    t0 = time.monotonic()
    with open(base_tar, "rb") as stream:
        cluster.docker(1, "import", "-", BASE_IMAGE, stdin=stream)
    spent["import base"] = time.monotonic() - t0
    t0 = time.monotonic()
    context = workdir / "build-context"
    house = context / "wheelhouse"
    shutil.rmtree(context, ignore_errors=True)
    house.mkdir(parents=True)
    for wheel in dependency_wheels().glob("*.whl"):
        shutil.copy2(wheel, house)
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(house), str(REPO)],
                            capture_output=True, text=True, timeout=600, cwd=workdir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
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
