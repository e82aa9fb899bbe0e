"""The real Alertmanager delivering to the remediator: its own payload, its own auth header
(`credentials_file`), and its resolved notification. One restart comes out of it."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal

import httpx
import pytest
import yaml
from conftest import free_port, require_binary
from stack import wait_for
from test_remediator_helpers import TOKEN, FakeExporter, RestartCounter, make_settings

from llm_vitals.remediator.app import SERVICE, create_app

pytestmark = pytest.mark.real_stack


async def test_real_alertmanager_delivers_one_restart_and_the_resolution(aiohttp_server, tmp_path):
    binary = require_binary("prometheus-alertmanager")
    exporter = FakeExporter({"a": "stuck", "b": "idle", "c": "idle"})
    exporter_server = await aiohttp_server(exporter.app())
    restarter = RestartCounter()
    restart_server = await aiohttp_server(restarter.app())
    settings = make_settings(
        tmp_path,
        str(exporter_server.make_url("")).rstrip("/"),
        {n: {"executor": "http", "url": str(restart_server.make_url("/admin/restart"))} for n in "abc"},
    )
    remediator = await aiohttp_server(create_app(settings))
    service = remediator.app[SERVICE]

    token_file = tmp_path / "remediator.token"
    token_file.write_text(TOKEN + "\n")
    am_config = {
        "route": {"receiver": "remediator", "group_by": ["alertname", "target"], "group_wait": "0s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "remediator", "webhook_configs": [{
            "url": str(remediator.make_url("/webhook")), "send_resolved": True,
            "http_config": {"authorization": {"type": "Bearer", "credentials_file": str(token_file)}}}]}],
    }
    (tmp_path / "am.yml").write_text(yaml.safe_dump(am_config))
    (tmp_path / "am-data").mkdir()
    port = free_port()
    am_url = f"http://127.0.0.1:{port}"
    with (tmp_path / "am.log").open("wb") as log:
        am = await asyncio.create_subprocess_exec(
            binary, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}", f"--web.external-url={am_url}/", "--cluster.listen-address=",
            stdout=log, stderr=log,
        )
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=5) as http:

            async def ready():  # a connection error counts as "not yet"
                return (await http.get(f"{am_url}/-/ready")).status_code == 200

            await wait_for(ready, 30, what="Alertmanager to be ready")
            starts = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=90)
            alert = {
                "labels": {"alertname": "LLMServerStuck", "target": "a", "remediation": "restart",
                           "severity": "critical", "job": "llm-vitals"},
                "annotations": {"summary": "a is stuck"},
                "startsAt": starts.isoformat(),
            }
            # Posted twice, as an HA pair of Prometheus servers would.
            for _ in range(2):
                assert (await http.post(f"{am_url}/api/v2/alerts", json=[alert])).status_code == 200

            async def rows():
                return await service.journal.actions(50)

            async def restarted():
                return [r for r in await rows() if r["decision"] == "restart" and r["result"] == "ok"]

            [restart] = await wait_for(restarted, 30, what="the restart")
            assert restart["target"] == "a" and restart["alertname"] == "LLMServerStuck"
            assert abs(restart["starts_at"] - starts.timestamp()) < 0.01
            assert restarter.calls == 1

            alert["endsAt"] = dt.datetime.now(dt.UTC).isoformat()
            assert (await http.post(f"{am_url}/api/v2/alerts", json=[alert])).status_code == 200

            async def resolved():
                return [r for r in await rows() if r["decision"] == "resolved"]

            await wait_for(resolved, 30, what="the resolved notification")
            await service.wait_idle()
            assert restarter.calls == 1
            assert not [r for r in await rows() if r["reason"] not in ("allowed", "not_firing", "duplicate")]
    finally:
        if am.returncode is None:
            am.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(am.wait(), 10)
            except TimeoutError:
                os.kill(am.pid, signal.SIGKILL)
                await am.wait()
    assert TOKEN not in (tmp_path / "am.log").read_text()
