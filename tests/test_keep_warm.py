"""Keeping a llama-server connection open between polls (issue 38): the pure schedule, and the poller
on a loopback server that closes idle connections sooner than the poll comes."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from itertools import pairwise

import pytest
from aiohttp import web
from conftest import REPO
from fake_http import app_of
from test_exporter_helpers import make_settings, make_target, record, start_exporter, wait_for

from llm_vitals.exporter.engines.table import ENGINES
from llm_vitals.exporter.keep_warm import warm_times

PAGE = (REPO / "tests/fixtures/llamacpp/llamacpp-0c1e570-cpu-metrics-busy-1.txt").read_bytes()


@pytest.mark.parametrize(("wait", "keep_alive", "times"), [
    (5.5, 5.0, (4.0,)),  # the shipped poll and its jitter against llama-server's 5 s
    (5.0, 5.0, (4.0,)),
    (4.0, 5.0, ()),  # the next poll comes first
    (3.0, 5.0, ()),
    (12.0, 5.0, (4.0, 8.0)),  # a longer poll: one every 4 s
    (12.1, 5.0, (4.0, 8.0, 12.0)),
    (30.0, None, ()),  # a server that keeps connections open long enough
])
def test_warm_times_keep_every_gap_within_the_keep_alive_less_its_margin(wait, keep_alive, times) -> None:
    assert warm_times(wait, keep_alive) == pytest.approx(times)
    if keep_alive is not None:
        ends = (0.0, *times, wait)
        assert all(b - a <= 0.8 * keep_alive + 1e-9 for a, b in pairwise(ends))


class Ports:
    """A llama-server stand-in that notes the client port of every /metrics read (one port, one connection)."""

    def __init__(self) -> None:
        self.metrics: list[int] = []

    def app(self) -> web.Application:
        return app_of(("GET", "/metrics", self._metrics), ("GET", "/health", self._health))

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics.append(request.transport.get_extra_info("peername")[1])
        return web.Response(body=PAGE, content_type="text/plain", headers={"Process-Start-Time-Unix": "1"})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})


@pytest.mark.parametrize(("keep_alive", "one_connection"), [(0.5, True), (None, False)])
async def test_polls_further_apart_than_the_servers_keep_alive_keep_one_connection_where_the_engine_says(
        aiohttp_server, aiohttp_client, monkeypatch, keep_alive, one_connection) -> None:
    # The server drops a connection idle for 0.5 s; the exporter polls every 0.8 s.
    monkeypatch.setitem(ENGINES, "llamacpp", replace(ENGINES["llamacpp"], keep_alive=keep_alive))
    server = Ports()
    upstream = await aiohttp_server(server.app(), keepalive_timeout=0.5)
    client = await start_exporter(aiohttp_client, make_settings(
        [make_target("a", str(upstream.make_url("")), engine="llamacpp", canary={"enabled": False})],
        poll_interval=0.8, poll_jitter=0.0))
    rec = record(client, "a")
    await wait_for(lambda: rec.polls >= 5, timeout=20, what="five polls")
    await asyncio.sleep(0)
    ports = server.metrics[:5]
    assert (len(set(ports)) == 1) is one_connection, ports
    if not one_connection:
        assert len(set(ports)) == len(ports), ports  # every read on a fresh connection
