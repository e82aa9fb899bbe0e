"""The tier's handle on its own Docker Engine: the docker CLI and the Engine API on one unix socket.

`tools/real-docker-test.sh` starts the daemon (own socket, data root, exec root and pid file, no
bridge) and names its socket in LLM_VITALS_DOCKER_SOCK; it stops it by PID afterwards. Everything
here talks to that socket only, never to /var/run/docker.sock.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

SOCKET_ENV = "LLM_VITALS_DOCKER_SOCK"
BASE_TAR_ENV = "LLM_VITALS_DOCKER_BASE_TAR"
RUN_DIR_ENV = "LLM_VITALS_DOCKER_RUN"
BASE_IMAGE = "llm-vitals-test/debian-local:bookworm"
IMAGE = "llm-vitals-test/llm-vitals:test"
# Every container the tier starts carries this label, so cleanup finds them all.
LABEL = "io.llm-vitals.test=real-docker"


class DockerError(RuntimeError):
    """A docker CLI call failed; the message carries its output."""


@dataclass
class Engine:
    socket_path: Path
    docker_bin: str

    @property
    def host(self) -> str:
        return f"unix://{self.socket_path}"

    def env(self) -> dict[str, str]:
        """This process's environment pointed at our daemon only (docker, docker-compose)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
        env["DOCKER_HOST"] = self.host
        # docker-compose 1.29 builds with the docker CLI when asked; the legacy builder is what 20.10 has.
        env["DOCKER_BUILDKIT"] = "0"
        env["COMPOSE_DOCKER_CLI_BUILD"] = "0"
        return env

    def docker(self, *args: str, timeout: float = 300, check: bool = True,
               stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
        argv = [self.docker_bin, "-H", self.host, *args]
        result = subprocess.run(argv, input=stdin.decode() if stdin is not None else None, capture_output=True,
                                text=True, timeout=timeout, env=self.env())
        if check and result.returncode != 0:
            raise DockerError(f"{' '.join(argv[3:])}: exit {result.returncode}: {result.stdout[-2000:]}"
                              f"{result.stderr[-2000:]}")
        return result

    # -- the Engine API, as the remediator reads it -------------------------------------------

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        transport = httpx.HTTPTransport(uds=str(self.socket_path))
        with httpx.Client(transport=transport, base_url="http://docker", timeout=30) as client:
            return client.request(method, path, **kwargs)

    def inspect(self, container: str) -> dict[str, Any]:
        response = self.api("GET", f"/containers/{container}/json")
        response.raise_for_status()
        return response.json()

    def identity(self, container: str) -> tuple[str, str, int]:
        """(Id, State.StartedAt, RestartCount): a restart keeps the Id and changes the start time."""
        data = self.inspect(container)
        return data["Id"], data["State"]["StartedAt"], data["RestartCount"]

    def events(self, since: float, until: float, filters: dict[str, list[str]]) -> list[dict[str, Any]]:
        """The daemon's event log between two times (`GET /events` with since/until: returns, not streams)."""
        response = self.api("GET", "/events", params={
            "since": f"{since:.3f}", "until": f"{until:.3f}", "filters": json.dumps(filters)})
        response.raise_for_status()
        return [json.loads(line) for line in response.text.splitlines() if line.strip()]

    # -- lifetimes -----------------------------------------------------------------------------

    def run_detached(self, name: str, argv: Sequence[str], *, image: str = IMAGE,
                     extra: Sequence[str] = ()) -> str:
        """`docker run -d` on the host network (loopback only), with an init, labelled for cleanup."""
        result = self.docker("run", "-d", "--name", name, "--network", "host", "--init", "--label", LABEL,
                             *extra, image, *argv)
        return result.stdout.strip()

    def remove(self, *names: str) -> None:
        if names:
            self.docker("rm", "-f", "-v", *names, check=False)

    def remove_labelled(self) -> None:
        ids = self.docker("ps", "-aq", "--filter", f"label={LABEL}", check=False).stdout.split()
        self.remove(*ids)


def engine_from_env() -> Engine | None:
    socket = os.environ.get(SOCKET_ENV)
    if not socket:
        return None
    docker = shutil.which("docker", path="/usr/bin") or shutil.which("docker")
    if docker is None:
        return None
    return Engine(Path(socket), docker)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.25):
    """Poll `predicate` until truthy (exceptions count as not yet); the last value in the error."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except Exception as exc:  # a server still starting
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


async def wait_until_async(predicate, timeout: float, what: str, evidence: Callable[[], str] | None = None):
    """`wait_until` for a test whose event loop must keep running (a load runs on it): `predicate` is
    a blocking read, run in a thread every 0.5 s; an HTTP, lookup or parse error counts as not yet.
    On timeout the error carries the last value and, if given, `evidence()` (the stack's logs)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = await asyncio.to_thread(predicate)
            if value:
                return value
            last = value
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            last = exc
        await asyncio.sleep(0.5)
    more = f"\n{evidence()}" if evidence is not None else ""
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last: {last!r}{more}")
