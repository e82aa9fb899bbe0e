"""The whole llm-vitals chain on loopback, for the end-to-end test (no tests here).

    llm-vitals-sim (3 backends + control)  <- load generators (this test process)
        ^ polls /metrics, canaries              ^ POST /backends/{i}/restart (http executor)
    llm-vitals-exporter                     llm-vitals-remediator
        ^ scrape job `llm-vitals`               ^ webhook (bearer token file)      ^ scrape
    real Prometheus (1 s scrape + evaluation, the shipped rules with short `for:`) -> real Alertmanager

Each part is its own process, as users run them: the simulator too, so that the test's own load
generators and polling never share an event loop with the servers being judged (on a loaded 2-core
machine that sharing alone made `/metrics` answers take seconds). Every process listens on a free
127.0.0.1 port chosen at run time and is stopped by its own PID when the `async with` block ends,
failed or not. Configs and logs go under the test's tmp dir. Faults go through the fleet control
server, exactly like the remediator's restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import yaml
from conftest import free_port
from stack import (
    EXPORTER_JOB,
    RULES_FILE,
    ManagedProcess,
    RealStack,
    alertmanager_config,
    start_on_free_port,
    wait_for,
    write_rules_with_short_for,
)

REMEDIATOR_JOB = "llm-vitals-remediator"
TOKEN = "e2e-webhook-s3cret"
HEALTHY_STATES = frozenset({"idle", "busy"})


def _cli(name: str) -> str:
    """The console script installed next to this interpreter (the project venv)."""
    path = Path(sys.executable).with_name(name)
    if not path.exists():
        raise RuntimeError(f"{path} not found: install the project (`make install`)")
    return str(path)


@dataclass(frozen=True)
class ChainTimings:
    """Short, test-sized settings for every part; the production defaults are minutes."""

    poll_interval: float = 0.5
    stuck_after: float = 3.0
    # Timeouts stay generous: a false `down` or canary timeout on a busy CI machine is not what this tests.
    metrics_timeout: float = 10.0
    canary_interval: float = 3.0
    canary_timeout: float = 5.0
    global_cooldown: float = 8.0  # long enough that Alertmanager re-sends a held alert within it, even when slow
    max_unhealthy: int = 2
    startup_seconds: float = 1.0  # a simulated restart's loading period
    repeat_interval: str = "2s"  # Alertmanager re-sends a still-firing alert (e.g. after a cooldown refusal)
    rules_for: float = 1.0
    rules_for_overrides: dict[str, float] = field(
        # Stuck waits 4 s, not 1: when the whole fleet hangs at once, the exporter sees each target
        # stuck up to a poll or two apart (more on a loaded CI machine), and the first alert must not
        # reach the remediator before the others are stuck too (the fleet gate judges the fleet as
        # the exporter sees it then, through a read the remediator may reuse for exporter_max_age).
        default_factory=lambda: {"LLMVitalsExporterAbsent": 30, "LLMServerSaturated": 5, "LLMServerStuck": 4}
    )


class Load:
    """Keeps `workers` completions in flight against one backend until stopped.

    A hung backend holds them unanswered (so it is stuck, not idle); a restart answers them 500 and
    the workers send new ones once the backend serves again. Errors back off briefly rather than
    spin while a backend's port is closed.
    """

    def __init__(self, url: str, workers: int, max_tokens: int) -> None:
        self.url = url
        self.workers = workers
        self.max_tokens = max_tokens
        self.answered: dict[int, int] = {}  # HTTP status -> count
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> Load:
        # No total timeout: a request on a hung backend must stay in flight until the restart.
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=2))
        self._tasks = [asyncio.create_task(self._worker(), name=f"load:{self.url}") for _ in range(self.workers)]
        return self

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _worker(self) -> None:
        assert self._session is not None
        body = {"model": "tiny", "prompt": "def main():", "max_tokens": self.max_tokens, "ignore_eos": True}
        while True:
            try:
                async with self._session.post(self.url + "/v1/completions", json=body) as response:
                    await response.read()
                    self.answered[response.status] = self.answered.get(response.status, 0) + 1
                    if response.status == 200:
                        continue
            except (aiohttp.ClientError, OSError):
                pass
            await asyncio.sleep(0.2)

    async def __aenter__(self) -> Load:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class SimFleet:
    """The `llm-vitals-sim` process: backend i on `port + i`, driven through its control server."""

    def __init__(self, process: ManagedProcess, port: int, backends: int, control_url: str,
                 http: httpx.AsyncClient) -> None:
        self.process = process
        self.backend_urls = [f"http://127.0.0.1:{port + i}" for i in range(backends)]
        self.control_url = control_url
        self.http = http

    async def states(self) -> list[dict[str, Any]]:
        """Every backend's `/admin/state` (phase, fault, restarts, running, waiting, ...)."""
        response = await self.http.get(f"{self.control_url}/backends")
        response.raise_for_status()
        return response.json()["backends"]

    async def fault(self, index: int, fault: str) -> dict[str, Any]:
        response = await self.http.post(f"{self.control_url}/backends/{index}/fault", json={"fault": fault})
        response.raise_for_status()
        return response.json()

    async def restarts(self) -> list[int]:
        """Restarts each backend has actually been through (whoever asked for them)."""
        return [state["restarts"] for state in await self.states()]


class Chain:
    """The running chain and the reads the scenario needs."""

    def __init__(self, run_dir: Path, names: Sequence[str], timings: ChainTimings) -> None:
        self.run_dir = run_dir
        self.fleet: SimFleet | None = None
        self.names = list(names)
        self.timings = timings
        self.http = httpx.AsyncClient(trust_env=False, timeout=5)
        self.exporter: ManagedProcess | None = None
        self.remediator: ManagedProcess | None = None
        self.exporter_url = ""
        self.remediator_url = ""
        self.stack: RealStack | None = None
        self.loads: dict[int, Load] = {}

    # -- naming ---------------------------------------------------------------------------------

    def index(self, name: str) -> int:
        return self.names.index(name)

    def name(self, index: int) -> str:
        return self.names[index]

    # -- reads ----------------------------------------------------------------------------------

    async def targets(self) -> dict[str, dict[str, Any]]:
        """The exporter's TARGET objects by name."""
        response = await self.http.get(f"{self.exporter_url}/api/v1/targets")
        response.raise_for_status()
        return {t["name"]: t for t in response.json()["targets"]}

    async def history(self, name: str) -> list[tuple[float, float, str]]:
        """The exporter's per-poll history of one target: (time, steps/s, state)."""
        response = await self.http.get(f"{self.exporter_url}/api/v1/targets/{name}/history")
        response.raise_for_status()
        return [tuple(p) for p in response.json()["points"]]

    async def actions(self) -> list[dict[str, Any]]:
        """The remediator's journal, oldest first."""
        response = await self.http.get(f"{self.remediator_url}/api/v1/actions", params={"limit": "1000"},
                                       headers={"Authorization": f"Bearer {TOKEN}"})
        response.raise_for_status()
        return list(reversed(response.json()["actions"]))

    async def backend_restarts(self) -> list[int]:
        return await self.fleet.restarts()

    async def all_healthy(self) -> bool:
        """Every backend serving and every target idle or busy: the fleet gate counts nothing."""
        if any(s["phase"] != "serving" for s in await self.fleet.states()):
            return False
        targets = await self.targets()
        return all(targets[n]["state"] in HEALTHY_STATES for n in self.names)

    # -- load -----------------------------------------------------------------------------------

    async def load(self, index: int, workers: int, max_tokens: int) -> Load:
        """Start (or replace) the load on backend `index`."""
        await self.unload(index)
        self.loads[index] = await Load(self.fleet.backend_urls[index], workers, max_tokens).start()
        return self.loads[index]

    async def unload(self, index: int) -> None:
        load = self.loads.pop(index, None)
        if load is not None:
            await load.stop()

    # -- waiting --------------------------------------------------------------------------------

    async def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """Poll a condition; on timeout the error carries every process's log tail and the states."""
        return await wait_for(predicate, timeout, what=what, interval=0.25, diagnostics=self.diagnostics)

    def diagnostics(self) -> str:
        parts = []
        for process in (self.fleet.process if self.fleet else None, self.exporter, self.remediator):
            if process is not None:
                parts.append(process.log_tail(40))
        if self.stack is not None:
            parts.append(self.stack.diagnostics())
        return "\n".join(parts)


# -- configs ------------------------------------------------------------------------------------


def exporter_config(port: int, names: Sequence[str], urls: Sequence[str], t: ChainTimings) -> dict[str, Any]:
    return {
        "listen": f"127.0.0.1:{port}",
        "poll_interval": t.poll_interval,
        "metrics_timeout": t.metrics_timeout,
        "log_level": "info",
        "targets": [
            {
                "name": name,
                "url": url,
                "stuck_after": t.stuck_after,
                "startup_grace": 30,
                "canary": {"interval": t.canary_interval, "timeout": t.canary_timeout},
            }
            for name, url in zip(names, urls, strict=True)
        ],
    }


def remediator_config(
    port: int, exporter_url: str, token_file: Path, state_path: Path, control_url: str, names: Sequence[str],
    t: ChainTimings,
) -> dict[str, Any]:
    return {
        "listen": f"127.0.0.1:{port}",
        "exporter_url": exporter_url,
        "exporter_timeout": 5,
        "exporter_max_age": 0.5,
        "auth": {"bearer_token_file": str(token_file)},
        "state_path": str(state_path),
        "global_cooldown": t.global_cooldown,
        # The backoff off: the chain restarts each server within minutes on purpose (the cooldown
        # and fleet-gate phases); the backoff's own rule is tested on the gate and the app.
        "budget": {"max_restarts": 3, "window": 3600, "backoff": {"initial": 0}},
        "max_unhealthy": t.max_unhealthy,
        # Only the target's name comes from the alert; what runs is this fixed URL per target.
        "targets": {
            name: {"executor": "http", "url": f"{control_url}/backends/{i}/restart", "timeout": 10}
            for i, name in enumerate(names)
        },
    }


async def _start_sim(run_dir: Path, client: httpx.AsyncClient, backends: int, t: ChainTimings) -> SimFleet:
    control_port = 0

    def build(port: int) -> tuple[list[str], str]:
        # Backends take port..port+N-1 (usually free next to a free port; if not, the sim says
        # "address already in use" and start_on_free_port tries again, up to 10 times: a block of ports
        # is taken by the ephemeral ports of other connections far more often than one port); control is its own free port.
        nonlocal control_port
        control_port = free_port()
        argv = [
            _cli("llm-vitals-sim"), "--port", str(port), "--backends", str(backends),
            "--control-port", str(control_port), "--max-num-seqs", "2", "--tokens-per-second", "50",
            "--startup-seconds", str(t.startup_seconds), "--log-level", "warning",
        ]
        return argv, f"http://127.0.0.1:{control_port}/backends"

    process, port = await start_on_free_port("simulator", build, run_dir / "simulator.log", client=client, attempts=10)
    return SimFleet(process, port, backends, f"http://127.0.0.1:{control_port}", client)


async def _start_cli(name: str, run_dir: Path, client: httpx.AsyncClient, config_of: Callable[[int], dict]) -> tuple[ManagedProcess, str]:
    def build(port: int) -> tuple[list[str], str]:
        config_path = run_dir / f"{name}.yaml"
        config_path.write_text(yaml.safe_dump(config_of(port), sort_keys=False))
        return [_cli(f"llm-vitals-{name}"), "--config", str(config_path)], f"http://127.0.0.1:{port}/healthz"

    process, port = await start_on_free_port(name, build, run_dir / f"{name}.log", client=client)
    return process, f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def running_chain(
    run_dir: Path, names: Sequence[str], timings: ChainTimings = ChainTimings()
) -> AsyncIterator[Chain]:
    """Start fleet, exporter, remediator, Prometheus and Alertmanager; stop them all on exit."""
    run_dir.mkdir(parents=True, exist_ok=True)
    chain = Chain(run_dir, names, timings)
    try:
        chain.fleet = fleet = await _start_sim(run_dir, chain.http, len(names), timings)
        chain.exporter, chain.exporter_url = await _start_cli(
            "exporter", run_dir, chain.http,
            lambda port: exporter_config(port, names, fleet.backend_urls, timings),
        )
        am = alertmanager_config(
            "http://127.0.0.1:1/webhook",  # re-pointed below, once the remediator's port is known
            TOKEN, run_dir, group_wait="0s", group_interval="1s", repeat_interval=timings.repeat_interval,
        )
        token_file = run_dir / "llm-vitals-remediator.token"  # written by alertmanager_config
        chain.remediator, chain.remediator_url = await _start_cli(
            "remediator", run_dir, chain.http,
            lambda port: remediator_config(port, chain.exporter_url, token_file, run_dir / "remediator.db",
                                           fleet.control_url, names, timings),
        )
        for receiver in am["receivers"]:
            for hook in receiver.get("webhook_configs", []):
                hook["url"] = f"{chain.remediator_url}/webhook"
        rules = write_rules_with_short_for(
            RULES_FILE, run_dir / "rules.yml", seconds=timings.rules_for, overrides=timings.rules_for_overrides
        )
        chain.stack = RealStack(
            run_dir / "stack",
            scrape_targets={
                EXPORTER_JOB: [chain.exporter_url.removeprefix("http://")],
                REMEDIATOR_JOB: [chain.remediator_url.removeprefix("http://")],
            },
            rule_files=[rules],
            alertmanager_config=am,
        )
        async with chain.stack:
            yield chain
    finally:
        for index in list(chain.loads):
            await chain.unload(index)
        for process in (chain.remediator, chain.exporter, chain.fleet.process if chain.fleet else None):
            if process is not None:
                await process.stop()
        await chain.http.aclose()

