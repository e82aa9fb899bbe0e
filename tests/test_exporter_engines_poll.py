"""The poller driven by the engine table, on loopback: the Accept header, metrics on their own URL,
a restart token from a response header, and /metrics that never answers while work was pending."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from aiohttp import web
from fake_http import app_of
from test_exporter_helpers import BUSY_PAGE, IDLE_PAGE, make_settings, make_target, record, start_exporter, wait_for

from llm_vitals.exporter.engines import Page, PageReading
from llm_vitals.exporter.engines.table import ENGINES


class Engine:
    """An upstream whose /metrics page, headers and stalling a test sets."""

    def __init__(self, page: bytes = IDLE_PAGE) -> None:
        self.page = page
        self.headers: dict[str, str] = {}
        self.stall = False
        self.accepts: list[str] = []
        self.release = asyncio.Event()

    def app(self) -> web.Application:
        return app_of(("GET", "/metrics", self.metrics))

    async def metrics(self, request: web.Request) -> web.Response:
        self.accepts.append(request.headers.get("Accept", ""))
        if self.stall:
            try:
                await asyncio.wait_for(self.release.wait(), 30)
            except TimeoutError:
                pass
        return web.Response(body=self.page, headers=self.headers, content_type="text/plain")


async def test_metrics_are_asked_for_in_the_text_format_and_served_as_0_0_4(aiohttp_server, aiohttp_client) -> None:
    engine = Engine()
    server = await aiohttp_server(engine.app())
    settings = make_settings([make_target("a", str(server.make_url("")), canary={"enabled": False})])
    client = await start_exporter(aiohttp_client, settings)
    await wait_for(lambda: record(client, "a").verdict.state == "idle", what="idle")
    assert engine.accepts[0].startswith("text/plain;version=0.0.4")
    response = await client.get("/metrics")
    assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"


async def test_a_target_reads_its_page_from_its_metrics_url(aiohttp_server, aiohttp_client) -> None:
    api, metrics = Engine(page=b"not this one"), Engine(page=BUSY_PAGE)
    api_server, metrics_server = await aiohttp_server(api.app()), await aiohttp_server(metrics.app())
    settings = make_settings([make_target("a", str(api_server.make_url("")), canary={"enabled": False},
                                          metrics_url=str(metrics_server.make_url("/metrics")))])
    client = await start_exporter(aiohttp_client, settings)
    await wait_for(lambda: record(client, "a").verdict.up, what="a good read")
    assert record(client, "a").verdict.snapshot.running > 0 and not api.accepts


@pytest.fixture
def token_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """llamacpp's table entry, its stub parse replaced by one reading `running` from the page's first byte."""

    def parse(page: Page) -> PageReading:
        running = float(page.body[:1] or b"0")
        return PageReading(running, 0, steps=float(page.body[1:] or b"0"))

    monkeypatch.setitem(ENGINES, "llamacpp", replace(ENGINES["llamacpp"], parse=parse, signature=None))


async def test_a_changed_restart_header_is_one_restart(aiohttp_server, aiohttp_client, token_engine) -> None:
    engine = Engine(page=b"0100")
    engine.headers = {"Process-Start-Time-Unix": "1571301719"}
    server = await aiohttp_server(engine.app())
    settings = make_settings([make_target("a", str(server.make_url("")), engine="llamacpp", canary={"enabled": False})])
    client = await start_exporter(aiohttp_client, settings)
    await wait_for(lambda: record(client, "a").verdict.state == "idle", what="idle")
    # A smaller value: monotonic microseconds since boot only ever mean "a different process".
    engine.headers = {"Process-Start-Time-Unix": "860019350"}
    await wait_for(lambda: record(client, "a").verdict.restarts == 1, what="one restart")
    polls = record(client, "a").polls
    await wait_for(lambda: record(client, "a").polls >= polls + 3, what="three more polls")
    assert record(client, "a").verdict.restarts == 1


async def test_metrics_unanswered_while_busy_is_stuck_within_stuck_after_and_two_polls(
        aiohttp_server, aiohttp_client, token_engine) -> None:
    engine = Engine(page=b"2100")
    server = await aiohttp_server(engine.app())
    settings = make_settings([make_target("a", str(server.make_url("")), engine="llamacpp", stuck_after=1.0,
                                          canary={"enabled": False})], metrics_timeout=0.3)
    client = await start_exporter(aiohttp_client, settings)
    steps = iter(range(200, 10_000))

    def moving() -> bool:
        engine.page = b"2" + str(next(steps)).encode()
        return record(client, "a").verdict.reason == "progress"

    await wait_for(moving, what="busy with progress")
    engine.stall = True
    try:
        verdict = await wait_for(lambda: record(client, "a").verdict.state == "stuck" and record(client, "a").verdict,
                                 timeout=1.0 + 2 * (0.2 + 0.3) + 5, what="stuck")
        assert verdict.reason == "metrics_unanswered" and verdict.up is False
    finally:
        engine.release.set()
