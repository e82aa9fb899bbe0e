"""Shared plumbing for the exporter tests: a scriptable fake vLLM on loopback, an exporter under
test, and waiting for a condition with a deadline. (No tests here.)"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from conftest import VLLM_FIXTURES
from fake_http import app_of

from llm_vitals.exporter.app import STORE, create_app
from llm_vitals.exporter.settings import ExporterSettings, parse_settings

IDLE_PAGE = (VLLM_FIXTURES / "vllm-0.32.0-cpu-metrics-idle.txt").read_bytes()
BUSY_PAGE = (VLLM_FIXTURES / "vllm-0.32.0-cpu-metrics-busy.txt").read_bytes()
MODELS = (VLLM_FIXTURES / "vllm-0.32.0-cpu-models.json").read_bytes()
COMPLETION = {"id": "cmpl-1", "object": "text_completion", "model": "tiny",
              "choices": [{"index": 0, "text": " the", "finish_reason": "length"}]}


class FakeVllm:
    """A vLLM stand-in whose answers a test sets: the /metrics page, /health status, canary behaviour."""

    def __init__(self, page: bytes = IDLE_PAGE) -> None:
        self.page = page
        self.metrics_status = 200
        self.health_status = 200
        self.completion_mode = "ok"  # ok | error (500) | rejected (401) | hang
        self.completions: list[dict[str, Any]] = []  # {"body", "headers"} of each canary received
        self.models_headers: list[dict[str, str]] = []
        self.metrics_reads = 0
        self.release = asyncio.Event()

    def app(self) -> web.Application:
        return app_of(("GET", "/metrics", self._metrics), ("GET", "/health", self._health),
                      ("GET", "/v1/models", self._models), ("POST", "/v1/completions", self._completions))

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics_reads += 1
        return web.Response(body=self.page, status=self.metrics_status, content_type="text/plain")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=self.health_status)

    async def _models(self, request: web.Request) -> web.Response:
        self.models_headers.append(dict(request.headers))
        return web.Response(body=MODELS, content_type="application/json")

    async def _completions(self, request: web.Request) -> web.Response:
        self.completions.append({"body": await request.json(), "headers": dict(request.headers)})
        if self.completion_mode == "hang":
            try:
                await asyncio.wait_for(self.release.wait(), 30)
            except TimeoutError:
                pass
        if self.completion_mode in ("error", "rejected"):
            # Echo the Authorization header back, as a careless upstream might: it must not leak further.
            return web.json_response({"error": {"message": f"bad key {request.headers.get('Authorization')}"}},
                                     status=500 if self.completion_mode == "error" else 401)
        return web.json_response(COMPLETION)


def make_settings(targets: list[dict[str, Any]], environ: dict[str, str] | None = None, **overrides: Any) -> ExporterSettings:
    """Fast settings for integration tests: short poll interval and timeouts."""
    config: dict[str, Any] = {"listen": "127.0.0.1:0", "poll_interval": 0.2, "poll_jitter": 0.1,
                              "metrics_timeout": 2, "connect_timeout": 1, "targets": targets}
    config.update(overrides)
    return parse_settings(config, "test", environ=environ or {})


def make_target(name: str, url: str, **overrides: Any) -> dict[str, Any]:
    # Scaled to the 0.2 s poll: stuck after 1.5 s, down after 0.5 s of failed reads (2-3 polls).
    target: dict[str, Any] = {"name": name, "url": url, "stuck_after": 1.5, "down_after": 0.5, "startup_grace": 0,
                              "canary": {"interval": 0.5, "timeout": 1}}
    target.update(overrides)
    return target


async def start_exporter(aiohttp_client: Callable[..., Any], settings: ExporterSettings, **kwargs: Any) -> Any:
    """A test client on a live exporter (its poll loops running)."""
    return await aiohttp_client(create_app(settings, **kwargs))


def record(client: Any, name: str):
    return client.app[STORE].get(name)


async def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll `predicate` until truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def target_json(client: Any, name: str) -> dict[str, Any]:
    response = await client.get(f"/api/v1/targets/{name}")
    assert response.status == 200
    return await response.json()


@contextlib.asynccontextmanager
async def requests_in_flight(url: str, body: dict[str, Any], workers: int):
    """`workers` clients, each POSTing `body` to `url` again as soon as its last request returns, until the block exits."""
    async def worker(session: aiohttp.ClientSession) -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with session.post(url, json=body) as answer:
                    await answer.read()
            await asyncio.sleep(0)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks = [asyncio.create_task(worker(session)) for _ in range(workers)]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
