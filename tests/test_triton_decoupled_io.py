"""Triton's decoupled models and model-ready route at the I/O edge (issue 38), through a Triton stand-in on loopback.

The stand-in serves a real Triton 2.51 page, the model's config (`GET /v2/models/<m>/config`), the
model-ready route, an infer route that answers a decoupled model 501 as Triton does, and a
generate-stream route that sends one event and then holds the stream open (a long generation).
The rules are tables in tests/test_triton_decoupled.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web
from conftest import FIXTURES
from fake_http import app_of
from test_exporter_helpers import make_settings, make_target, record, start_exporter, wait_for

from llm_vitals.exporter.engines import ModelConfig
from llm_vitals.targets import RESTARTABLE_STATES

IDLE = (FIXTURES / "triton" / "triton-2.51.0-cpu-metrics-idle-after-busy.txt").read_bytes()
CANARY = {"inputs": [{"name": "max_tokens", "shape": [1], "datatype": "INT32", "data": [1]}]}


class Triton:
    """A Triton stand-in serving one model, `toy_lm_stream`."""

    def __init__(self, *, decoupled: bool = True, config_status: int = 200) -> None:
        self.decoupled = decoupled
        self.config_status = config_status
        self.stream_mode = "ok"  # ok | hang (accepted, no event ever)
        self.ready_delay = 0.0
        self.asked: list[str] = []  # the canary routes asked, in order
        self.generate_bodies: list[Any] = []
        self.config_reads = 0

    def app(self) -> web.Application:
        base = "/v2/models/toy_lm_stream"
        return app_of(("GET", "/metrics", self._metrics), ("GET", "/v2/health/live", self._ok),
                      ("GET", f"{base}/ready", self._ready), ("GET", f"{base}/config", self._config),
                      ("POST", f"{base}/infer", self._infer), ("POST", f"{base}/generate_stream", self._stream))

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=IDLE, content_type="text/plain")

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response()

    async def _ready(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.ready_delay)
        return web.Response()

    async def _config(self, request: web.Request) -> web.Response:
        self.config_reads += 1
        if self.config_status != 200:
            return web.json_response({"error": "This API is restricted"}, status=self.config_status)
        return web.json_response({"name": "toy_lm_stream", "backend": "python",
                                  "model_transaction_policy": {"decoupled": self.decoupled}})

    async def _infer(self, request: web.Request) -> web.Response:
        self.asked.append("infer")
        if self.decoupled:
            return web.json_response({"error": "HTTP end point doesn't support models with decoupled transaction policy"},
                                     status=501)
        return web.json_response({"outputs": [{"name": "generated", "datatype": "INT32", "shape": [1], "data": [1]}]})

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        self.asked.append("generate_stream")
        self.generate_bodies.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if self.stream_mode == "ok":
            await response.write(b'data: {"model_name":"toy_lm_stream","model_version":"1","generated":[1]}\n\n')
        try:
            await asyncio.sleep(30)  # the rest of a long stream: the canary must not wait for it
        except asyncio.CancelledError:
            pass
        return response


def triton_target(url: str, **overrides: Any) -> dict[str, Any]:
    return make_target("t", url, engine="triton", metrics_url=f"{url}/metrics", model="toy_lm_stream",
                       canary={"interval": 0.5, "timeout": 1, "request": CANARY}, **overrides)


async def test_a_decoupled_model_is_canaried_on_generate_stream_by_its_first_event(aiohttp_server, aiohttp_client) -> None:
    fake = Triton()
    server = await aiohttp_server(fake.app())
    client = await start_exporter(aiohttp_client, make_settings([triton_target(str(server.make_url("")))]))
    rec = await wait_for(lambda: (r := record(client, "t")) and r.canaries.get("ok", 0) >= 2 and r, what="two canaries ok")
    assert rec.model_config == ModelConfig(decoupled=True) and fake.config_reads == 1
    assert set(fake.asked) == {"generate_stream"}  # never the infer route that answers it 501
    assert fake.generate_bodies[0] == {"max_tokens": [1]}
    view = await (await client.get("/api/v1/targets/t")).json()
    assert (view["state"], view["reason"], view["unit"]) == ("idle", "unjudgeable", 'model="toy_lm_stream"')
    assert "model toy_lm_stream is decoupled" in view["detail"] and view["ready"]


async def test_a_hung_decoupled_model_is_unjudgeable_and_never_restartable(aiohttp_server, aiohttp_client) -> None:
    fake = Triton()
    fake.stream_mode = "hang"
    server = await aiohttp_server(fake.app())
    client = await start_exporter(aiohttp_client, make_settings([triton_target(str(server.make_url("")))]))
    rec = await wait_for(lambda: (r := record(client, "t")) and r.verdict.canary_failures >= 4 and r,
                         timeout=20, what="four canaries timed out")
    assert rec.canaries.get("timeout", 0) >= 4 and rec.verdict.state not in RESTARTABLE_STATES
    assert all(state not in RESTARTABLE_STATES for _, _, state in rec.history), list(rec.history)
    view = await (await client.get("/api/v1/targets/t")).json()
    assert (view["state"], view["reason"]) == ("idle", "unjudgeable") and "canaries in a row failed" in view["detail"]
    assert (await client.get("/probe/t/live")).status == 200


async def test_a_config_the_server_will_not_give_keeps_the_infer_canary_whose_501_is_rejected(
        aiohttp_server, aiohttp_client) -> None:
    fake = Triton(config_status=403)  # PyTriton's locked model-repository API, say
    server = await aiohttp_server(fake.app())
    client = await start_exporter(aiohttp_client, make_settings([triton_target(str(server.make_url("")))]))
    rec = await wait_for(lambda: (r := record(client, "t")) and r.canaries.get("rejected", 0) >= 3 and r,
                         timeout=20, what="three canaries rejected")
    assert rec.model_config is None and set(fake.asked) == {"infer"}
    assert rec.verdict.canary_failures == 0 and (rec.verdict.state, rec.verdict.reason) == ("idle", "canary_rejected")
    assert all(state not in RESTARTABLE_STATES for _, _, state in rec.history)


async def test_a_model_ready_route_slower_than_its_timeout_never_reads_stuck(aiohttp_server, aiohttp_client) -> None:
    fake = Triton(decoupled=False)
    server = await aiohttp_server(fake.app())
    # Scaled: stuck_after 0.6 s, down_after 1.5 s. A page that answers while the model-ready route
    # does not is a server that answers with its model's readiness unknown: held, never `down`, and
    # never the frozen /metrics page (`stuck`, metrics_unanswered) that a restart would follow.
    settings = make_settings([triton_target(str(server.make_url("")), stuck_after=0.6, down_after=1.5)],
                             health_timeout=0.3)
    client = await start_exporter(aiohttp_client, settings)
    await wait_for(lambda: (r := record(client, "t")) and r.verdict.state == "idle", what="idle")
    fake.ready_delay = 1.0
    rec = record(client, "t")
    began = time.monotonic()
    await wait_for(lambda: rec.poll_errors.get("timeout", 0) >= 5 and time.monotonic() - began > 3.0, timeout=20,
                   what="five ready-route timeouts over twice down_after")
    assert rec.verdict.state == "idle" and rec.verdict.error_reason == "timeout", rec.verdict.detail
    assert "/v2/models/toy_lm_stream/ready" in rec.verdict.detail
    assert all(state not in (*RESTARTABLE_STATES, "down") for _, _, state in rec.history), list(rec.history)
