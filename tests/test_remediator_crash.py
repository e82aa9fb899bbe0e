"""Crash safety: kill -9 the remediator while a restart runs, start it again on the same journal,
and the alert must not restart anything a second time. The remediator is a real subprocess; its
`command` executor is a real process that blocks."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import yaml
from conftest import REPO, free_port
from stack import wait_for
from test_remediator_helpers import AUTH, TOKEN, FakeExporter, alert_payload

# The "restart": records its pid, then blocks like a slow `systemctl restart`.
BLOCKING_RESTART = "import os, sys, time; open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(30)"


class RemediatorProcess:
    def __init__(self, config: Path, log: Path):
        self.config, self.log = config, log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> asyncio.subprocess.Process:
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "llm_vitals.remediator", "--config", str(self.config), "--log-level", "debug",
                cwd=REPO, stdout=log, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        return self.proc

    async def kill(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()


async def test_kill_during_restart_then_restart_blocks_a_second_restart(aiohttp_server, tmp_path):
    exporter = FakeExporter({"a": "stuck", "b": "stuck", "c": "idle", "d": "idle", "e": "idle"})
    exporter_server = await aiohttp_server(exporter.app())
    marker = tmp_path / "restarts.log"
    (tmp_path / "token").write_text(TOKEN + "\n")
    port = free_port()
    command = {"executor": "command", "argv": [sys.executable, "-c", BLOCKING_RESTART, str(marker)], "timeout": "60s"}
    config = {
        "listen": f"127.0.0.1:{port}",
        "exporter_url": str(exporter_server.make_url("")).rstrip("/"),
        "auth": {"bearer_token_file": str(tmp_path / "token")},
        "state_path": str(tmp_path / "journal.db"),
        "global_cooldown": "15m",
        "budget": {"max_restarts": 1, "window": "1h"},
        "max_unhealthy": 2,
        "targets": {name: command for name in "abcde"},
    }
    config_path = tmp_path / "remediator.yaml"
    config_path.write_text(yaml.safe_dump(config))
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "remediator.log"
    first, second = RemediatorProcess(config_path, log), RemediatorProcess(config_path, log)

    async with aiohttp.ClientSession() as http:

        async def healthz():
            try:
                async with http.get(base + "/healthz") as response:
                    return await response.json() if response.status == 200 else None
            except aiohttp.ClientError:
                return None

        async def post(payload):
            async with http.post(base + "/webhook", json=payload, headers=AUTH) as response:
                return response.status, (await response.json())["decisions"][0]["reason"]

        def restarts_run() -> list[str]:
            return marker.read_text().split() if marker.exists() else []

        try:
            await first.start()
            await wait_for(healthz, 20, interval=0.05, what="the first remediator")
            assert await post(alert_payload("a")) == (200, "allowed")
            await wait_for(restarts_run, 20, interval=0.05, what="the restart command to start")
            assert (await healthz())["restart_in_progress"] == "a"

            await first.kill()  # between the journal's intent and the executor's end

            await second.start()
            state = await wait_for(healthz, 20, interval=0.05, what="the second remediator")
            assert state["restart_in_progress"] is None  # the interrupted restart is over, but ...
            assert await post(alert_payload("a")) == (200, "duplicate")
            assert await post(alert_payload("a", starts_at="2026-12-02T15:00:00Z")) == (200, "cooldown")
            assert await post(alert_payload("b", fingerprint="fb")) == (200, "cooldown")
            assert len(restarts_run()) == 1

            async with http.get(base + "/api/v1/actions", headers=AUTH) as response:
                rows = (await response.json())["actions"]
            [restart] = [r for r in rows if r["decision"] == "restart"]
            assert restart["result"] == "interrupted" and restart["target"] == "a"
            async with http.get(base + "/metrics") as response:
                metrics = await response.text()
            # The budget (1 per hour) was spent before the crash: the circuit is still open.
            assert 'llm_vitals_remediator_circuit_open{workload="a"} 1.0' in metrics
            assert 'llm_vitals_remediator_last_restart_timestamp_seconds{target="a"}' in metrics

            # A second remediator on the same journal refuses to start.
            third = RemediatorProcess(config_path, tmp_path / "third.log")
            third.config = tmp_path / "third.yaml"
            third.config.write_text(yaml.safe_dump({**config, "listen": f"127.0.0.1:{free_port()}"}))
            proc = await third.start()
            assert await asyncio.wait_for(proc.wait(), 30) == 1
            assert "in use by another remediator" in (tmp_path / "third.log").read_text()
        finally:
            await first.kill()
            await second.kill()
            for pid in restarts_run():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
    assert TOKEN not in log.read_text()
