"""Hostile upstreams: each gives the right `down` reason, and none kills its poll loop."""

from __future__ import annotations

import asyncio

from aiohttp import web
from conftest import free_port
from fake_http import app_of
from test_exporter_helpers import BUSY_PAGE, IDLE_PAGE, make_settings, make_target, record, start_exporter, wait_for

# One upstream app; each scenario lives under its own prefix, so one exporter watches all of them.
SCENARIOS = {
    "stall": "timeout",  # headers sent, then nothing
    "trickle": "timeout",  # a byte every 0.2 s: no per-read timeout trips, the total deadline does
    "endless": "too_large",  # chunked body that never ends
    "huge": "too_large",  # a 50 MB page with a Content-Length
    "html": "bad_metrics",
    "bad-utf8": "bad_metrics",
    "nan": "bad_metrics",  # NaN where a required gauge (running) belongs; NaN KV usage is only absent
    "error-500": "http_status",
    "health-503": "health_503",  # work pending, nothing moving, /health 503
}
HUGE_BYTES = 50 * 1024 * 1024


class Hostile:
    def __init__(self) -> None:
        self.healed = False
        self.release = asyncio.Event()
        self.reads: dict[str, int] = {name: 0 for name in [*SCENARIOS, "backwards"]}

    def app(self) -> web.Application:
        return app_of(("GET", "/{scenario}/metrics", self.metrics), ("GET", "/{scenario}/health", self.health))

    async def health(self, request: web.Request) -> web.Response:
        scenario = request.match_info["scenario"]
        return web.Response(status=503 if scenario == "health-503" and not self.healed else 200)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        scenario = request.match_info["scenario"]
        self.reads[scenario] += 1
        if self.healed:
            return web.Response(body=IDLE_PAGE, content_type="text/plain")
        if scenario in ("stall", "trickle", "endless"):
            response = web.StreamResponse()
            response.content_type = "text/plain"
            await response.prepare(request)
            try:
                if scenario == "stall":
                    await asyncio.wait_for(self.release.wait(), 30)
                while not self.release.is_set():
                    if scenario == "trickle":
                        await response.write(b"#")
                        await asyncio.sleep(0.2)
                    else:
                        await response.write(b"# endless\n" * 6553)
            except (ConnectionResetError, TimeoutError, asyncio.CancelledError):
                pass
            return response
        if scenario == "huge":
            # A 50 MB page, declared up front and streamed: the exporter must not read it all.
            response = web.StreamResponse()
            response.content_type = "text/plain"
            response.content_length = HUGE_BYTES
            await response.prepare(request)
            chunk = b"#" * 65536
            try:
                for _ in range(HUGE_BYTES // len(chunk)):
                    await response.write(chunk)
            except (ConnectionResetError, asyncio.CancelledError):
                pass
            return response
        if scenario == "html":
            return web.Response(text="<html><body><h1>502 Bad Gateway</h1></body></html>", content_type="text/html")
        if scenario == "bad-utf8":
            return web.Response(body=IDLE_PAGE.replace(b"vllm:num_requests_running", b"vllm:\xff\xfe", 1),
                                content_type="text/plain")
        if scenario == "nan":
            page = IDLE_PAGE.replace(b'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
                                     b'vllm:num_requests_running{engine="0",model_name="tiny"} NaN')
            assert page != IDLE_PAGE
            return web.Response(body=page, content_type="text/plain")
        if scenario == "backwards":
            # The busy page once, then the same page with a counter fallen and the same start time.
            page = BUSY_PAGE if self.reads[scenario] == 1 else BUSY_PAGE.replace(
                b'vllm:generation_tokens_total{engine="0",model_name="tiny"} 903.0',
                b'vllm:generation_tokens_total{engine="0",model_name="tiny"} 3.0')
            return web.Response(body=page, content_type="text/plain")
        if scenario == "error-500":
            return web.Response(status=500, text="Internal Server Error")
        if scenario == "health-503":
            return web.Response(body=BUSY_PAGE, content_type="text/plain")
        raise web.HTTPNotFound()


async def test_hostile_upstreams_are_down_with_the_right_reason_and_polling_survives(aiohttp_server, aiohttp_client) -> None:
    hostile = Hostile()
    server = await aiohttp_server(hostile.app(), shutdown_timeout=1)
    base = str(server.make_url("")).rstrip("/")
    targets = [make_target(name, f"{base}/{name}", canary={"enabled": False}) for name in SCENARIOS]
    # Room for a late poll on a loaded box: its one bad read must stay short of down_after.
    targets.append(make_target("backwards", f"{base}/backwards", canary={"enabled": False}, down_after=5))
    targets.append(make_target("refused", f"http://127.0.0.1:{free_port()}", canary={"enabled": False}))
    settings = make_settings(targets, metrics_timeout=0.6, max_page_bytes=1024 * 1024)
    client = await start_exporter(aiohttp_client, settings)
    expected = {**SCENARIOS, "refused": "refused"}
    try:
        def all_down() -> bool:
            return all(
                record(client, name).verdict.state == "down" and record(client, name).verdict.reason == reason
                for name, reason in expected.items())

        try:
            await wait_for(all_down, timeout=15, what="every hostile target down with its reason")
        except AssertionError:
            seen = {name: (record(client, name).verdict.state, record(client, name).verdict.reason) for name in expected}
            raise AssertionError(f"got {seen}") from None

        # A counter going backwards without a start-time change is one bad read (then re-based): counted,
        # never a restart, and one failed read short of down_after keeps the state (busy).
        backwards = record(client, "backwards")
        await wait_for(lambda: backwards.poll_errors["bad_metrics"] >= 1, what="backwards counter seen")
        assert backwards.verdict.restarts == 0
        assert "down" not in [state for _, _, state in backwards.history], backwards.history

        for name, reason in expected.items():
            rec = record(client, name)
            assert rec.poll_errors[reason] >= 1, name
            assert rec.poll_errors.get("internal", 0) == 0, name
        metrics = await (await client.get("/metrics")).text()
        assert 'llm_vitals_poll_errors_total{reason="too_large",target="huge"}' in metrics
        assert 'llm_vitals_up{target="stall"} 0.0' in metrics
        api = await (await client.get("/api/v1/targets/huge")).json()
        assert api["state"] == "down" and api["reason"] == "too_large" and api["up"] is False

        # The loops are alive: once the upstream behaves, every target recovers.
        hostile.healed = True
        hostile.release.set()
        recovered = [name for name in SCENARIOS]
        await wait_for(lambda: all(record(client, n).verdict.state == "idle" for n in recovered), timeout=10,
                       what="recovery to idle")
    finally:
        hostile.release.set()
