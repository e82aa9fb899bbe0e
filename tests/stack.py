"""The real Prometheus and Alertmanager as plain processes on loopback, for end-to-end tests.

One `RealStack` is one throw-away monitoring stack: Prometheus scraping the given targets every
second and evaluating the given rule files every second, sending to an Alertmanager whose config
the test supplies (usually the repo's own `alerts/alertmanager.yml`, re-pointed by
`alertmanager_config`). Both run on free 127.0.0.1 ports with storage under the test's temp dir and
are stopped by their own PIDs when the `async with` block ends, failed or not.

    rules = write_rules_with_short_for(RULES_FILE, tmp_path / "rules.yml", seconds=1)
    am = alertmanager_config(webhook_url=f"{sink}/webhook", token="t0ken", token_dir=tmp_path)
    async with RealStack(tmp_path, scrape_targets={"llm-vitals": ["127.0.0.1:8000"]},
                         rule_files=[rules], alertmanager_config=am) as stack:
        await wait_for(lambda: stack.query('ALERTS{alertstate="firing"}'), timeout=30)

The command lines and configs are the demo's (llm_vitals/demo/monitoring.py: one recipe for both).
Under load the real Prometheus skips evaluations for seconds at a time, so callers wait with
generous deadlines (20-30 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

# `tests/` is on sys.path under pytest (rootdir conftest, prepend import mode), as in the other tests.
from conftest import REPO, free_port, require_binary

from llm_vitals.demo.monitoring import (
    READY_PATH,
    alertmanager_argv,
    alertmanager_routing,
    prometheus_argv,
    prometheus_config,
    rules_with_for,
)
from llm_vitals.demo.processes import Child, StartError

RULES_FILE = REPO / "alerts" / "llm-vitals.rules.yml"
ALERTMANAGER_EXAMPLE = REPO / "alerts" / "alertmanager.yml"
REMEDIATOR_RECEIVER = "llm-vitals-remediator"
EXPORTER_JOB = "llm-vitals"

T = TypeVar("T")


class StackError(RuntimeError):
    """A process of the stack did not start, or a wait ran out; the message carries the evidence."""


# ---------------------------------------------------------------------------------------------
# Config writers (pure file work: usable without the binaries)
# ---------------------------------------------------------------------------------------------


def write_rules_with_short_for(
    source: Path,
    dest: Path,
    seconds: float = 1,
    overrides: Mapping[str, float] | None = None,
) -> Path:
    """Copy a rules file with every `for:` set to `seconds` (or `overrides[alertname]`); the source stays as is."""
    dest = Path(dest)
    dest.write_text(yaml.safe_dump(rules_with_for(source, seconds, overrides), sort_keys=False, width=1000))
    return dest


def alertmanager_config(
    webhook_url: str,
    token: str,
    token_dir: Path,
    *,
    base: Path = ALERTMANAGER_EXAMPLE,
    receiver: str = REMEDIATOR_RECEIVER,
    group_wait: str = "0s",
    group_interval: str = "1s",
    repeat_interval: str = "1h",
) -> dict[str, Any]:
    """The repo's example Alertmanager config, with its remediator receiver pointed at `webhook_url`.

    The bearer token goes to a file in `token_dir`, as in production (`credentials_file`); every
    route gets test timings.
    """
    token_file = Path(token_dir) / f"{receiver}.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    return alertmanager_routing(base, receiver, webhook_url, token_file, group_wait=group_wait,
                                group_interval=group_interval, repeat_interval=repeat_interval)


# ---------------------------------------------------------------------------------------------
# Waiting
# ---------------------------------------------------------------------------------------------


async def wait_for(
    predicate: Callable[[], T | Awaitable[T]],
    timeout: float,
    *,
    interval: float = 0.2,
    what: str = "condition",
    diagnostics: Callable[[], str] | None = None,
) -> T:
    """Poll `predicate` (sync or async) until it returns something truthy; return that value.

    Exceptions raised by the predicate count as "not yet" (a server still starting); on timeout
    the last value or exception and `diagnostics()` (e.g. process log tails) are in the error.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            last = value
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            extra = f"\n{diagnostics()}" if diagnostics else ""
            raise StackError(f"timed out after {timeout:g}s waiting for {what}; last: {last!r}{extra}")
        await asyncio.sleep(interval)


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


class ManagedProcess(Child):
    """The demo's Child (own process group, log file, stop by its PID) that also waits for its
    `ready_url` with the tests' httpx client, and can tell an "address already in use" failure."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        ready_url: str | None,
        env: Mapping[str, str] | None = None,  # added to (not replacing) this process's environment
    ) -> None:
        super().__init__(name, argv, Path(log_path), env)
        self.ready_url = ready_url
        self._log_start = 0  # where this run's output begins in a log shared with earlier attempts

    @property
    def returncode(self) -> int | None:
        return self.process.returncode if self.process else None

    async def start(self, client: httpx.AsyncClient, timeout: float = 30) -> None:
        """Start the process and wait until `ready_url` answers 200, or fail with its log."""
        with contextlib.suppress(OSError):
            self._log_start = self.log_path.stat().st_size
        await super().start()
        if self.ready_url is None:
            return

        async def answers() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return (await client.get(self.ready_url, timeout=2)).status_code == 200
            return False

        try:
            await self.wait_until(answers, self.ready_url, timeout, interval=0.1)
        except StartError as exc:
            raise StackError(str(exc)) from None

    def address_in_use(self) -> bool:
        try:
            output = self.log_path.read_bytes()[self._log_start :]
        except OSError:
            return False
        return b"address already in use" in output.lower()

    def log_tail(self, lines: int = 25) -> str:
        return super().log_tail(lines)


async def start_on_free_port(
    name: str,
    build: Callable[[int], tuple[Sequence[str], str | None]],
    log_path: Path,
    *,
    client: httpx.AsyncClient | None = None,
    env: Mapping[str, str] | None = None,
    attempts: int = 3,
    timeout: float = 30,
) -> tuple[ManagedProcess, int]:
    """Start `build(port) -> (argv, ready_url)` on a free port, retrying if another test took it first.

    Also meant for the exporter and remediator CLIs in end-to-end tests: `build` writes their config
    with `listen: 127.0.0.1:{port}` and returns their `/healthz` as the ready URL.
    """
    own_client = client is None
    if client is None:
        client = httpx.AsyncClient(trust_env=False, timeout=5)
    try:
        for attempt in range(1, attempts + 1):
            port = free_port()
            argv, ready_url = build(port)
            process = ManagedProcess(name, argv, log_path, ready_url, env=env)
            try:
                await process.start(client, timeout=timeout)
                return process, port
            except StackError:
                await process.stop()
                if attempt < attempts and process.address_in_use():
                    continue
                raise
            except BaseException:  # cancelled or interrupted mid-start: never leave it running
                await process.stop()
                raise
        raise AssertionError("unreachable")
    finally:
        if own_client:
            await client.aclose()


# ---------------------------------------------------------------------------------------------
# The stack
# ---------------------------------------------------------------------------------------------


class RealStack:
    """Real Prometheus + Alertmanager on loopback; an async context manager that always cleans up."""

    def __init__(
        self,
        run_dir: Path,
        *,
        scrape_targets: Mapping[str, Sequence[str]],
        rule_files: Sequence[Path] = (),
        alertmanager_config: Mapping[str, Any] | None = None,
        start_timeout: float = 30,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.scrape_targets = {job: list(targets) for job, targets in scrape_targets.items()}
        self.rule_files = [Path(p) for p in rule_files]
        self.alertmanager_config_data = dict(alertmanager_config) if alertmanager_config is not None else None
        self.start_timeout = start_timeout
        self.prometheus: ManagedProcess | None = None
        self.alertmanager: ManagedProcess | None = None
        self.prometheus_url = ""
        self.alertmanager_url = ""
        self._client: httpx.AsyncClient | None = None

    # -- lifetime ---------------------------------------------------------------------------

    async def __aenter__(self) -> RealStack:
        prometheus_bin = require_binary("prometheus")
        alertmanager_bin = require_binary("prometheus-alertmanager") if self.alertmanager_config_data else None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Loopback only: never let an environment proxy see these requests.
        self._client = httpx.AsyncClient(trust_env=False, timeout=5)
        try:
            if alertmanager_bin:
                await self._start_alertmanager(alertmanager_bin)
            await self._start_prometheus(prometheus_bin)
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop Prometheus, then Alertmanager, each by its own PID; safe to call twice."""
        for process in (self.prometheus, self.alertmanager):
            if process is not None:
                await process.stop()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _start_alertmanager(self, binary: str) -> None:
        config_path = self.run_dir / "alertmanager.yml"
        config_path.write_text(yaml.safe_dump(self.alertmanager_config_data, sort_keys=False))
        storage = self.run_dir / "am-data"
        storage.mkdir(exist_ok=True)

        def build(port: int) -> tuple[list[str], str]:
            # Debug logs every notify attempt and failure, for post-mortems.
            argv = alertmanager_argv(binary, config_path, storage, port, extra=["--log.level=debug"])
            return argv, f"http://127.0.0.1:{port}{READY_PATH}"

        self.alertmanager, port = await start_on_free_port(
            "alertmanager", build, self.run_dir / "alertmanager.log", client=self._client, timeout=self.start_timeout
        )
        self.alertmanager_url = f"http://127.0.0.1:{port}"

    async def _start_prometheus(self, binary: str) -> None:
        am_address = self.alertmanager_url.removeprefix("http://") if self.alertmanager else None
        config_path = self.run_dir / "prometheus.yml"
        config_path.write_text(
            yaml.safe_dump(prometheus_config(self.scrape_targets, self.rule_files, am_address), sort_keys=False)
        )
        storage = self.run_dir / "prom-data"
        storage.mkdir(exist_ok=True)

        def build(port: int) -> tuple[list[str], str]:
            argv = prometheus_argv(binary, config_path, storage, port, retention="1h", extra=["--web.enable-lifecycle"])
            return argv, f"http://127.0.0.1:{port}{READY_PATH}"

        self.prometheus, port = await start_on_free_port(
            "prometheus", build, self.run_dir / "prometheus.log", client=self._client, timeout=self.start_timeout
        )
        self.prometheus_url = f"http://127.0.0.1:{port}"

    # -- reading ----------------------------------------------------------------------------

    async def _get_json(self, url: str, **params: str) -> Any:
        if self._client is None:
            raise StackError("the stack is not running")
        response = await self._client.get(url, params=params)
        response.raise_for_status()
        return response.json()

    async def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; the `result` list (`[{"metric": {...}, "value": [t, "v"]}, ...]`)."""
        body = await self._get_json(f"{self.prometheus_url}/api/v1/query", query=promql)
        if body.get("status") != "success":
            raise StackError(f"query {promql!r} failed: {body}")
        return body["data"]["result"]

    async def prometheus_alerts(self, state: str | None = None) -> list[dict[str, Any]]:
        """Prometheus's active alerts (`pending`/`firing`), optionally only one state."""
        body = await self._get_json(f"{self.prometheus_url}/api/v1/alerts")
        alerts = body["data"]["alerts"]
        return [a for a in alerts if state is None or a["state"] == state]

    async def alertmanager_alerts(self) -> list[dict[str, Any]]:
        """Alertmanager's alerts (API v2), each with `labels`, `status` and the `receivers` it routed to."""
        if not self.alertmanager:
            raise StackError("this stack has no Alertmanager")
        return await self._get_json(f"{self.alertmanager_url}/api/v2/alerts")

    async def scrape_targets_health(self) -> dict[str, str]:
        """`{scrapeUrl: health}` for Prometheus's active targets (`up`, `down`, `unknown`)."""
        body = await self._get_json(f"{self.prometheus_url}/api/v1/targets")
        return {t["scrapeUrl"]: t["health"] for t in body["data"]["activeTargets"]}

    def diagnostics(self) -> str:
        """Log tails of both processes, for failure messages."""
        return "\n".join(p.log_tail() for p in (self.prometheus, self.alertmanager) if p is not None)

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 30, *, what: str = "condition") -> Any:
        """`wait_for` with this stack's logs attached to the timeout error."""
        return await wait_for(predicate, timeout, what=what, diagnostics=self.diagnostics)


def pid_alive(pid: int | None) -> bool:
    """True while a process with this PID exists and is not a zombie."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


__all__ = [
    "ALERTMANAGER_EXAMPLE",
    "EXPORTER_JOB",
    "REMEDIATOR_RECEIVER",
    "RULES_FILE",
    "ManagedProcess",
    "RealStack",
    "StackError",
    "alertmanager_config",
    "pid_alive",
    "prometheus_config",
    "start_on_free_port",
    "wait_for",
    "write_rules_with_short_for",
]
