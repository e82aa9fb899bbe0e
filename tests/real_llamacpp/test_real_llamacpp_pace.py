"""A real limping llama-server beside its peer (issue 40; the gray-failure recipe: one server's CPU quota cut).

Two real llama-servers of one workload under the same closed-loop load (2 clients each, 32 tokens
a request), one exporter watching both (pace.min_peers 1: each is the other's peer). Once both
are judged, server 2 gets a twentieth of a core through the kernel's cgroup v1 CPU controller (or,
where it is not writable, a SIGSTOP/SIGCONT duty cycle of 80/20 ms). It keeps stepping, at a
fraction of its peer's pace: it must read degraded within pace.degraded_after + 2 windows, its peer
never, and neither ever stuck. Scaled: poll 1 s, window 15 s, degraded_after 15 s; requests of 32
tokens, since llama.cpp's pace counters move only when a request ends, and the throttled server
must end several within a window.

The figures (time to degraded, the ratio, how it was throttled) go to .cache/real-llamacpp/pace.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml
from real_engine.harness import exporter_binary
from real_engine.launcher import free_port, tail
from real_engine.load import Load
from real_engine.places import run_dir

from .llamacpp_server import LlamaServer

WINDOW_S = 15.0
DEGRADED_AFTER_S = 15.0
POLL_S = 1.0
SLACK_S = 10.0  # a loaded shared box: late polls, a request that spans the throttle's start
WORKLOAD = "Deployment/llm/llama"
NAMES = ("llama-1", "llama-2")
# µs of CPU per 100 ms period: a twentieth of a core. The RECIPE's fifth barely slowed a server on
# the shared 2-core box at load ~9, where the free peer itself got about a fifth of a core (ratio
# 1.6 after 55 s).
QUOTA = 5_000
OUT = run_dir("llamacpp")


def _config(port: int, servers: list[LlamaServer]) -> str:
    targets = [{"name": name, "url": server.url, "engine": "llamacpp", "workload": WORKLOAD, "stuck_after": "30s",
                "down_after": "10s", "startup_grace": "5m", "canary": {"enabled": False}}
               for name, server in zip(NAMES, servers, strict=True)]
    return yaml.safe_dump({
        "listen": f"127.0.0.1:{port}", "poll_interval": f"{POLL_S:g}s", "metrics_timeout": "5s", "targets": targets,
        "pace": {"window": f"{WINDOW_S:g}s", "degraded_after": f"{DEGRADED_AFTER_S:g}s", "min_peers": 1,
                 "min_work": 50},
    }, sort_keys=False)


@contextlib.contextmanager
def exporter(servers: list[LlamaServer], log_dir: Path) -> Iterator[str]:
    """The exporter watching both servers, as a subprocess (stopped by its PID): its URL."""
    port = free_port()
    config, log = log_dir / "pace-exporter.yaml", log_dir / "pace-exporter.log"
    config.write_text(_config(port, servers))
    with open(log, "wb") as out:
        proc = subprocess.Popen([exporter_binary(), "--config", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                start_new_session=True)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    assert proc.returncode is not None, tail(log)


def _cpu_cgroup() -> Path | None:
    """A writable cgroup v1 `cpu` hierarchy's root, or None."""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] == "cgroup" and "cpu" in fields[3].split(","):
            root = Path(fields[1])
            if os.access(root, os.W_OK):
                return root
    return None


@contextlib.contextmanager
def throttled(pid: int) -> Iterator[str]:
    """The process `pid` held to a fifth of a core until the block ends: how it was done."""
    root = _cpu_cgroup()
    if root is not None:
        group = root / f"llm-vitals-pace-{os.getpid()}"
        group.mkdir(exist_ok=True)
        try:
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text(str(QUOTA))
            (group / "cgroup.procs").write_text(str(pid))  # every thread of it follows
            yield f"cgroup v1 cpu.cfs_quota_us {QUOTA}/100000"
        finally:
            with contextlib.suppress(OSError):  # gone with the process, if it died
                (root / "cgroup.procs").write_text(str(pid))
            group.rmdir()
        return
    stop = threading.Event()

    def duty_cycle() -> None:
        while not stop.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.08)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.02)

    thread = threading.Thread(target=duty_cycle, daemon=True)
    thread.start()
    try:
        yield "SIGSTOP 80 ms / SIGCONT 20 ms"
    finally:
        stop.set()
        thread.join(timeout=5)
        os.kill(pid, signal.SIGCONT)


def test_one_throttled_llama_server_reads_degraded_its_peer_never_and_none_stuck(built: None) -> None:
    log_dir = OUT / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    servers = [LlamaServer(port=free_port(), log_dir=log_dir, name=f"llama-server-pace-{i}") for i in (1, 2)]
    began = time.monotonic()
    seen: dict[str, set] = {name: set() for name in NAMES}
    states: set[str] = set()
    try:
        for server in servers:
            server.start()
        body = {"prompt": "Once upon a time", "n_predict": 32, "ignore_eos": True, "cache_prompt": False}
        loads = [Load.sustained(server.url, "/completion", lambda n: body, concurrency=2, max_seconds=240, timeout=120)
                 for server in servers]
        with exporter(servers, log_dir) as url, httpx.Client(timeout=20) as client:

            def paces() -> dict[str, dict]:
                views = {t["name"]: t for t in client.get(f"{url}/api/v1/targets").json()["targets"]}
                for name in NAMES:
                    seen[name].add(views[name]["pace"]["degraded"])
                    states.add(views[name]["state"])
                return views

            def wait(condition, timeout: float, what: str) -> dict[str, dict]:
                deadline, last = time.monotonic() + timeout, {}
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        last = paces()
                        if condition(last):
                            return last
                    assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s: {last}"
                    time.sleep(0.5)

            wait(lambda v: all(v[n]["pace"]["basis"] == "judged" for n in NAMES), 120, "both judged beside each other")
            before = {n: v["pace"]["ratio"] for n, v in paces().items()}
            assert seen == {n: {False} for n in NAMES}, seen
            with throttled(servers[1].pid or 0) as how:
                slowed_at = time.monotonic()
                views = wait(lambda v: v["llama-2"]["pace"]["degraded"], DEGRADED_AFTER_S + 2 * WINDOW_S + SLACK_S,
                             "llama-2 degraded")
                took = time.monotonic() - slowed_at
                ratio = views["llama-2"]["pace"]["ratio"]
                assert views["llama-2"]["state"] == "busy", views["llama-2"]  # degraded is no state
                # A few more polls: the peer stays as it was, and nothing reads stuck.
                end = time.monotonic() + 3 * POLL_S
                while time.monotonic() < end:
                    paces()
                    time.sleep(0.5)
            for load in loads:
                load.cancel()
        assert seen["llama-1"] == {False}, "the unthrottled peer read degraded"
        assert True in seen["llama-2"]
        assert "stuck" not in states and "down" not in states, states
        assert ratio is not None and ratio >= 2.0, ratio
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "pace.json").write_text(json.dumps({
            "throttle": how, "degraded_s": round(took, 1), "bound_s": DEGRADED_AFTER_S + 2 * WINDOW_S,
            "ratio": round(ratio, 2), "ratios_before": before, "states": sorted(states),
            "wall_s": round(time.monotonic() - began, 1)}, indent=1) + "\n")
    finally:
        for server in servers:
            server.stop()
