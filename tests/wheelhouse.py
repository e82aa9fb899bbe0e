"""The wheelhouse the project's Dockerfile installs from, built on the host: one recipe for the
Docker tier (tests/real_docker) and the kubelet tier (tests/kubelet/image.py).

The dependencies' wheels are built once per dependency list and Python version and cached outside
the clone (tools/cache-path.sh docker-wheels KEY; resolving them took 9-97 s a run), so the two
tiers share one download; the project's own wheel is built fresh every run.
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

REPO = Path(__file__).resolve().parents[1]


def dependency_wheels(timings: dict[str, float] | None = None) -> Path:
    """Every dependency's wheel, from the cache or built into it (its cold seconds go to `timings`)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    key = hashlib.sha256(json.dumps([project["dependencies"], sys.version_info[:2]]).encode()).hexdigest()[:12]
    cache = Path(subprocess.run(["bash", str(REPO / "tools" / "cache-path.sh"), "docker-wheels", key],
                                capture_output=True, text=True, check=True).stdout.strip())
    if (cache / ".complete").is_file():
        return cache
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    t0 = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(cache), str(REPO)],
                            capture_output=True, text=True, timeout=900, cwd=cache)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for own in cache.glob("llm_vitals-*.whl"):
        own.unlink()  # the project's own wheel is built fresh every run
    (cache / ".complete").write_text(" ".join(project["dependencies"]) + "\n")
    if timings is not None:
        timings["pip wheel (dependencies, cold)"] = time.monotonic() - t0
    return cache


def fill_wheelhouse(context: Path, workdir: Path, timings: dict[str, float] | None = None) -> Path:
    """A fresh `context/wheelhouse` with every dependency's wheel and the project's own; returns it."""
    house = context / "wheelhouse"
    shutil.rmtree(context, ignore_errors=True)
    house.mkdir(parents=True)
    for wheel in dependency_wheels(timings).glob("*.whl"):
        shutil.copy2(wheel, house)
    t0 = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(house), str(REPO)],
                            capture_output=True, text=True, timeout=600, cwd=workdir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    if timings is not None:
        timings["pip wheel (the project)"] = time.monotonic() - t0
    assert list(house.glob("llm_vitals-*.whl")), sorted(p.name for p in house.iterdir())
    return house
