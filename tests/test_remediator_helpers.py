"""Shared plumbing for the remediator tests: a loopback exporter, a counting restart endpoint,
settings and payload builders. (No tests here; the module name keeps it in the remediator's files.)"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from conftest import AM_FIXTURES
from fake_http import app_of

from llm_vitals.remediator.follow import follow
from llm_vitals.remediator.settings import Settings, build_settings

TOKEN = "s3cret-token"  # the token of the real captured Alertmanager headers
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FIRING = json.loads((AM_FIXTURES / "webhook-firing.json").read_text())
RESOLVED = json.loads((AM_FIXTURES / "webhook-resolved.json").read_text())
TRUNCATED = json.loads((AM_FIXTURES / "webhook-firing-max_alerts-truncated.json").read_text())
STARTS_AT = "2026-12-02T14:38:36.417Z"
STARTS_AT_UNIX = 1796222316.417
OLD_PROCESS = STARTS_AT_UNIX - 3600.0  # started an hour before the alert: no restart since
NOW = STARTS_AT_UNIX + 120.0


def target_json(name: str, state: str = "idle", **over: Any) -> dict[str, Any]:
    """One TARGET object as docs/interfaces.md ("Exporter API") pins it."""
    body = {
        "name": name, "engine": "vllm", "role": "backend", "url": f"http://127.0.0.1:1/{name}",
        "state": state, "reason": "no_progress" if state == "stuck" else "idle", "detail": "",
        "since": OLD_PROCESS + 60, "stuck_seconds": 90.0 if state == "stuck" else 0.0,
        "process_start_time": OLD_PROCESS, "last_poll": NOW, "up": state != "down",
        "ready": state in ("idle", "busy"), "live": True, "draining": False, "gpu_fault": False,
        "restarts": 0, "running": 2, "waiting": 4, "steps_per_second": 0.0,
        "generation_tokens_per_second": 0.0,
        "counters": {"steps": 1, "generation_tokens": 2, "prompt_tokens": 3, "finished": 4, "kv_usage": 0.3},
    }
    body.update(over)
    return body


class FakeExporter:
    """The exporter's `/api/v1/targets`, serving whatever `targets` holds right now."""

    def __init__(self, states: dict[str, str]):
        self.targets = {name: target_json(name, state) for name, state in states.items()}
        self.requests = 0
        self.fail_with: int | None = None
        self.fail_after: int | None = None  # answer 500 once this many reads were served

    def app(self) -> web.Application:
        return app_of(("GET", "/api/v1/targets", self._targets))

    async def _targets(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.fail_after is not None and self.requests > self.fail_after:
            return web.json_response({"error": "boom"}, status=500)
        if self.fail_with:
            return web.json_response({"error": "boom"}, status=self.fail_with)
        return web.json_response({"targets": list(self.targets.values()), "generated_at": time.time()})


class RestartCounter:
    """A restart endpoint (`POST /admin/restart`) that counts the calls it gets."""

    def __init__(self, status: int = 200):
        self.calls = 0
        self.status = status

    def app(self) -> web.Application:
        return app_of(("POST", "/admin/restart", self._restart))

    async def _restart(self, request: web.Request) -> web.Response:
        self.calls += 1
        return web.json_response({"restarting": True}, status=self.status)


def make_settings(tmp_path: Path, exporter_url: str | None, targets: dict[str, dict], **over: Any) -> Settings:
    """Test settings; `exporter_url` None leaves the key out (for `exporter_urls`)."""
    data: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        **({"exporter_url": exporter_url} if exporter_url is not None else {}),
        "exporter_timeout": "2s",
        "auth": {"bearer_token_env": "LLM_VITALS_WEBHOOK_TOKEN"},
        "state_path": str(tmp_path / "journal.db"),
        "global_cooldown": "15m",
        "budget": {"max_restarts": 3, "window": "1h"},
        "max_unhealthy": "40%",
        "targets": targets,
    }
    data.update(over)
    return build_settings(data, {"LLM_VITALS_WEBHOOK_TOKEN": TOKEN})


def alert_payload(
    target: str = "a",
    *,
    fingerprint: str = "ae4ddf2da96a7112",
    starts_at: str = STARTS_AT,
    status: str = "firing",
    remediation: str | None = "restart",
    alertname: str = "LLMServerStuck",
) -> dict[str, Any]:
    """The real captured firing payload, re-aimed at `target`, with the rule's remediation label."""
    payload = copy.deepcopy(FIRING if status == "firing" else RESOLVED)
    alert = payload["alerts"][0]
    alert["labels"].update(target=target, alertname=alertname)
    if remediation is not None:
        alert["labels"]["remediation"] = remediation
    alert["fingerprint"] = fingerprint
    alert["startsAt"] = starts_at
    payload["commonLabels"] = dict(alert["labels"])
    return payload


class Clock:
    """A clock the test moves."""

    def __init__(self, now: float = NOW):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def follow_for(store: Any, rounds: int, interval: float = 15.0) -> list[float]:
    """Run the follower (`follow`) over `store` for `rounds` reads; the sleeps it asked for between them."""
    naps: list[float] = []

    async def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == rounds:
            raise asyncio.CancelledError  # the way out of a loop that runs until cancelled

    with pytest.raises(asyncio.CancelledError):
        await follow(store, interval, sleep)
    return naps
