"""The real-Docker tier: the image, the compose stack and the docker executor on a real Docker Engine.

Collected only under LLM_VITALS_REAL_DOCKER=1, which `make test-docker` (tools/real-docker-test.sh)
sets after starting a daemon of its own: the main `pytest -n 2` run of tests/ never talks to Docker.
Without that daemon the tier skips with one line; under LLM_VITALS_REQUIRE_REAL_DOCKER=1 (CI) that
is a failure.

The session builds the project's image once, on the locally made Debian base (nothing is pulled),
from a wheelhouse built on the host (`pip wheel`): the build runs with `--network none`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from real_tier import RealTier
from wheelhouse import fill_wheelhouse

from .engine import BASE_IMAGE, BASE_TAR_ENV, IMAGE, RUN_DIR_ENV, Engine, engine_from_env, wait_until

TIER = RealTier("Docker", enable="LLM_VITALS_REAL_DOCKER", require="LLM_VITALS_REQUIRE_REAL_DOCKER")
REPO = Path(__file__).resolve().parents[2]
# Not part of the normal suite: `make test-docker` runs these on their own daemon.
collect_ignore_glob = TIER.left_out("test_*.py")


def pytest_configure(config):
    TIER.stop_on_sigterm()


@pytest.fixture(scope="session")
def run_dir() -> Path:
    """The tier's scratch directory (short, under /tmp: unix socket paths are limited to ~107 bytes)."""
    path = os.environ.get(RUN_DIR_ENV)
    if not path:
        TIER.skip_or_fail(f"{RUN_DIR_ENV} is not set; run `make test-docker`")
    return Path(path)


@pytest.fixture(scope="session")
def engine() -> Engine:
    found = engine_from_env()
    if found is None:
        TIER.skip_or_fail("no daemon of the tier's own (LLM_VITALS_DOCKER_SOCK unset, or no docker CLI); "
                          "run `make test-docker`")
    ping = found.api("GET", "/_ping")
    assert ping.status_code == 200 and ping.text == "OK", ping.text
    yield found
    found.remove_labelled()


@pytest.fixture(scope="session")
def timings() -> dict[str, float]:
    """Seconds each build step took this session (printed at the end)."""
    spent: dict[str, float] = {}
    yield spent
    print("\nreal-Docker tier build steps: " + ", ".join(f"{k} {v:.0f} s" for k, v in spent.items()))


@pytest.fixture(scope="session")
def base_image(engine: Engine, timings) -> str:
    """The Debian bookworm image made by tools/real-docker-setup.sh (debootstrap), imported into our daemon."""
    tar = os.environ.get(BASE_TAR_ENV)
    if not tar or not Path(tar).is_file():
        TIER.skip_or_fail(f"no base rootfs tar ({BASE_TAR_ENV}={tar!r}); run tools/real-docker-setup.sh")
    t0 = time.monotonic()
    with open(tar, "rb") as stream:
        result = subprocess.run([engine.docker_bin, "-H", engine.host, "import", "-", BASE_IMAGE],
                                stdin=stream, capture_output=True, text=True, timeout=300, env=engine.env())
    assert result.returncode == 0, result.stderr
    timings["import base"] = time.monotonic() - t0
    return BASE_IMAGE


@pytest.fixture(scope="session")
def wheelhouse(run_dir: Path, timings) -> Path:
    """The project's wheel and every dependency's, built on the host with the host's pip config."""
    return fill_wheelhouse(run_dir / "build-context", run_dir, timings)


@pytest.fixture(scope="session")
def image(engine: Engine, base_image: str, wheelhouse: Path, timings) -> str:
    """The project's Dockerfile built on the local base from the wheelhouse, with no network at all."""
    t0 = time.monotonic()
    engine.docker("build", "--network", "none", "--force-rm", "-q",
                  "--build-arg", f"BASE_IMAGE={base_image}", "--build-arg", "WHEELHOUSE=wheelhouse",
                  "-f", str(REPO / "Dockerfile"), "-t", IMAGE, str(wheelhouse.parent), timeout=900)
    timings["docker build"] = time.monotonic() - t0
    yield IMAGE
    engine.remove_labelled()
    engine.docker("rmi", "-f", IMAGE, base_image, check=False)
    engine.docker("image", "prune", "-f", check=False)


@pytest.fixture
def crashed_daemon(run_dir: Path):
    """A second dockerd of our own, started, answering, then killed (SIGKILL, a crash): its socket
    file stays behind with nobody listening. Its containerd is stopped by its PID, its dirs removed."""
    root = run_dir / "crash"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    sock = root / "d.sock"
    with open(root / "dockerd.log", "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            ["nice", "-n", "10", shutil.which("dockerd") or "/usr/sbin/dockerd", "--host", f"unix://{sock}",
             "--data-root", str(root / "data"), "--exec-root", str(root / "exec"), "--pidfile", str(root / "d.pid"),
             "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    containerd_pid = root / "exec" / "containerd" / "containerd.pid"
    try:
        wait_until(lambda: Engine(sock, "docker").api("GET", "/_ping").text == "OK", 60, "the second dockerd")
        wait_until(lambda: containerd_pid.read_text().strip(), 10, "its containerd's pid file")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert sock.is_socket()
        yield sock
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(containerd_pid.read_text().strip()), signal.SIGTERM)
        mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True).stdout
        for target in sorted((m for m in mounts.split() if m.startswith(f"{root}/")), reverse=True):
            subprocess.run(["umount", "-l", target], check=False)
        shutil.rmtree(root, ignore_errors=True)
