"""The remediator's docker executor against the real Docker Engine (the tier's own dockerd).

A restart keeps the container (same Id) and starts a new process in it (new State.StartedAt);
a missing container, a stopped one, a socket the process may not use and a daemon that is down
each give one clear error, and the daemon shows that nothing was started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import httpx
from conftest import free_port

from llm_vitals.remediator.executors import DockerExecutor
from llm_vitals.remediator.settings import DockerTarget

from .engine import Engine, wait_until


def _executor(engine: Engine, container: str, socket_path: Path | None = None, **extra) -> DockerExecutor:
    return DockerExecutor(DockerTarget(executor="docker", container=container,
                                       socket_path=socket_path or engine.socket_path, **extra))


@contextlib.contextmanager
def sim_container(engine: Engine, image: str):
    """One simulated vLLM in its own container on a free loopback port; removed afterwards."""
    port = free_port()
    name = f"lv-test-exec-{port}"
    engine.run_detached(name, ["llm-vitals-sim", "--host", "127.0.0.1", "--port", str(port), "--no-control",
                               "--startup-seconds", "0", "--log-level", "warning"])
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{url}/admin/state", timeout=2).json()["phase"] == "serving", 60,
                   f"{name} to serve")
        yield name, url
    finally:
        engine.remove(name)


def _actions(engine: Engine, name: str, since: float) -> list[str]:
    events = engine.events(since, time.time() + 0.5, {"container": [name], "type": ["container"]})
    return [e["Action"] for e in events]


async def test_restart_keeps_the_container_and_starts_a_new_process(engine: Engine, image: str):
    with sim_container(engine, image) as (name, url):
        before_id, before_started, _ = engine.identity(name)
        # Hung, with a request held in flight: what the remediator restarts in production.
        assert httpx.post(f"{url}/admin/fault", json={"fault": "hang"}, timeout=5).json()["fault"] == "hang"
        held = asyncio.create_task(asyncio.to_thread(
            lambda: httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 8},
                               timeout=60)))
        since = time.time()
        t0 = time.monotonic()
        result = await _executor(engine, name, stop_timeout=10, timeout=60).restart()
        took = time.monotonic() - t0
        assert (result.result, result.detail) == ("ok", f"docker restarted {name}")
        after_id, after_started, _ = engine.identity(name)
        assert after_id == before_id
        assert after_started > before_started
        assert _actions(engine, name, since).count("restart") == 1
        with contextlib.suppress(httpx.HTTPError):
            await held
        state = wait_until(lambda: httpx.get(f"{url}/admin/state", timeout=2).json(), 60, f"{name} after restart")
        assert state["fault"] in (None, "none") and state["phase"] in ("loading", "serving")
        print(f"\nreal docker restart of a hung simulator: {took:.1f} s (stop_timeout 10)")


async def test_a_container_that_does_not_exist(engine: Engine, image: str):
    name = f"lv-test-absent-{free_port()}"
    since = time.time()
    result = await _executor(engine, name).restart()
    assert result.result == "error"
    assert result.detail == f"docker inspect {name}: HTTP 404: No such container: {name}"
    assert _actions(engine, name, since) == []


async def test_a_stopped_container_is_refused_and_not_started(engine: Engine, image: str):
    with sim_container(engine, image) as (name, _):
        engine.docker("stop", "-t", "5", name)
        _, stopped_at, _ = engine.identity(name)
        since = time.time()
        result = await _executor(engine, name).restart()
        assert result.result == "error"
        assert f"container {name} is exited, not running: refused, nothing started" in result.detail
        assert engine.inspect(name)["State"]["Status"] == "exited"
        assert engine.identity(name)[1] == stopped_at
        assert _actions(engine, name, since) == []


def test_a_socket_without_permission(engine: Engine, image: str):
    """The image's own user (uid 10001) on the daemon's root:docker 0660 socket, as the compose
    remediator would be without `user: root`: EACCES, said plainly; the target keeps running."""
    mode = os.stat(engine.socket_path).st_mode & 0o777
    assert mode & 0o007 == 0, f"the socket is open to everyone ({oct(mode)}): nothing to test"
    with sim_container(engine, image) as (name, _):
        _, started, _ = engine.identity(name)
        since = time.time()
        code = ("import asyncio; from llm_vitals.remediator.executors import DockerExecutor; "
                "from llm_vitals.remediator.settings import DockerTarget; "
                f"r = asyncio.run(DockerExecutor(DockerTarget(executor='docker', container='{name}')).restart()); "
                "print(r.result); print(r.detail)")
        run = engine.docker("run", "--rm", "--network", "none", "--label", "io.llm-vitals.test=real-docker",
                            "-v", f"{engine.socket_path}:/var/run/docker.sock", image, "python", "-c", code,
                            timeout=120)
        result, detail = run.stdout.strip().splitlines()
        assert result == "error"
        assert detail == ("docker socket /var/run/docker.sock: cannot connect: [Errno 13] Permission denied"
                          " (this process's user may not use the socket: run as root or in the socket's group)")
        assert engine.identity(name)[1] == started
        assert "restart" not in _actions(engine, name, since)


async def test_a_daemon_that_is_down(engine: Engine, crashed_daemon: Path):
    result = await _executor(engine, "llm-vitals-sim-a", socket_path=crashed_daemon).restart()
    assert result.result == "error"
    assert result.detail == (f"docker socket {crashed_daemon}: cannot connect: [Errno 111] Connection refused"
                             " (nothing listens on the socket: the Docker daemon is down)")
    crashed_daemon.unlink()
    gone = await _executor(engine, "llm-vitals-sim-a", socket_path=crashed_daemon).restart()
    assert gone.result == "error" and "[Errno 2] No such file or directory" in gone.detail
    assert "the Docker daemon is not running, or the socket is not mounted" in gone.detail
