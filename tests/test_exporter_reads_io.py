"""Refused, frozen and slow at the I/O edge (issue 29), through real servers on loopback.

The pure rules are tables in tests/test_verdict_reads.py; here the reads themselves: what
`bounded_get` reports for a refused port, a port that accepts and never answers, and a slow page,
and what the exporter's probes answer when a vLLM stand-in is stopped whole, slowed, or gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time

import aiohttp
import pytest
from aiohttp import web
from fake_http import app_of
from test_exporter_helpers import BUSY_PAGE, make_settings, make_target, record, start_exporter, wait_for

from llm_vitals.exporter.engines import PageError
from llm_vitals.exporter.upstream import Get, bounded_get, carry_out
from llm_vitals.targets import RESTARTABLE_STATES

STEPS = re.compile(rb'^(vllm:iteration_tokens_total_count\{[^}]*\} )[0-9.]+$', re.M)


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def silent_port():
    """A loopback port that accepts connections and never answers (a process stopped whole)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.close()
        server.close()


class Stoppable:
    """A busy vLLM stand-in that can be stopped whole (nothing answers), or have only its /metrics slowed."""

    def __init__(self) -> None:
        self.frozen = False
        self.metrics_delay = 0.0
        self.reads = 0
        self.release = asyncio.Event()

    def app(self) -> web.Application:
        return app_of(("GET", "/metrics", self._metrics), ("GET", "/health", self._health))

    async def _hold(self) -> None:
        if self.frozen:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.release.wait(), 30)

    async def _metrics(self, request: web.Request) -> web.Response:
        await self._hold()
        if self.metrics_delay:
            await asyncio.sleep(self.metrics_delay)
        self.reads += 1
        # The page's step counter moves on every read: a busy server making progress.
        page = STEPS.sub(b"\\g<1>%d.0" % (462 + self.reads), BUSY_PAGE)
        return web.Response(body=page, content_type="text/plain")

    async def _health(self, request: web.Request) -> web.Response:
        await self._hold()
        return web.Response()


async def watched_stoppable(aiohttp_server, aiohttp_client):
    """A `Stoppable` vLLM on loopback, target `a` of an exporter (metrics timeout 0.3 s, health 0.2 s):
    the server, its aiohttp test server (to close), the exporter's client and the target's record."""
    server = Stoppable()
    upstream = await aiohttp_server(server.app())
    client = await start_exporter(aiohttp_client, make_settings(
        [busy_target(str(upstream.make_url("")))], poll_interval=POLL, metrics_timeout=0.3, health_timeout=0.2))
    return server, upstream, client, record(client, "a")


async def test_a_refused_port_is_refused_not_connect() -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(PageError) as caught:
            await bounded_get(session, f"http://127.0.0.1:{free_port()}/metrics", timeout=1.0, max_bytes=1024)
    assert caught.value.reason == "refused"


async def test_a_port_that_accepts_and_never_answers_is_a_timeout() -> None:
    async with silent_port() as port, aiohttp.ClientSession() as session:
        with pytest.raises(PageError) as caught:
            await bounded_get(session, f"http://127.0.0.1:{port}/metrics", timeout=0.3, max_bytes=1024)
    assert caught.value.reason == "timeout"


async def test_a_connect_that_cannot_finish_within_the_deadline_is_connect_not_timeout() -> None:
    # A listener whose backlog is full leaves the next SYN unanswered, as a partitioned host does.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(8):  # fill the accept queue (Linux keeps backlog + 1)
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5)) as session:
            started = time.monotonic()
            with pytest.raises(PageError) as caught:
                await bounded_get(session, f"http://127.0.0.1:{port}/metrics", timeout=0.6, max_bytes=1024)
        assert caught.value.reason == "connect", caught.value.detail
        assert time.monotonic() - started < 1.5
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_a_slow_page_is_a_timeout_under_a_short_deadline_and_arrives_under_a_long_one(aiohttp_server) -> None:
    server = Stoppable()
    server.metrics_delay = 0.3
    url = str((await aiohttp_server(server.app())).make_url("/metrics"))
    async with aiohttp.ClientSession() as session:
        with pytest.raises(PageError) as caught:
            await bounded_get(session, url, timeout=0.15, max_bytes=1 << 20)
        assert caught.value.reason == "timeout"
        status, _ = await bounded_get(session, url, timeout=0.15 * 3, max_bytes=1 << 20)
    assert status == 200



async def test_carry_out_does_each_get_in_order_and_throws_a_failure_in_where_it_was_asked(aiohttp_server) -> None:
    # The poll's GETs, one call into upstream (issue 42): each answer sent back, a failure thrown in.
    url = str((await aiohttp_server(Stoppable().app())).make_url("/metrics"))
    refused = f"http://127.0.0.1:{free_port()}/health"
    seen: list[object] = []

    def gets():
        status, body, _ = yield Get(url, 1.0, 1 << 20)
        seen.append((status, bool(body)))
        try:
            yield Get(refused, 1.0, 1024)
        except PageError as exc:
            seen.append(exc.reason)
        status, _, _ = yield Get(url, 1.0, 1 << 20)
        seen.append(status)

    asked = gets()
    async with aiohttp.ClientSession() as session:
        await carry_out(session, asked, next(asked))
    assert seen == [(200, True), "refused", 200]


POLL = 0.2
DOWN_AFTER = 1.0
LIVENESS = 2.0
SLACK = 1.5  # a late poll on a loaded 2-core box


def busy_target(url: str) -> dict:
    return make_target("a", url, stuck_after=1.0, down_after=DOWN_AFTER, liveness_budget=LIVENESS,
                       canary={"enabled": False})


async def test_a_vllm_stopped_whole_is_restartable_and_unlive_and_never_down(aiohttp_server, aiohttp_client) -> None:
    server, _, client, rec = await watched_stoppable(aiohttp_server, aiohttp_client)
    try:
        await wait_for(lambda: rec.verdict.reason == "progress", what="busy with progress")
        server.frozen = True
        frozen_at = time.monotonic()
        await wait_for(lambda: rec.verdict.state == "stuck", timeout=DOWN_AFTER + 2 * (POLL + 2 * 0.3) + SLACK,
                       what="stuck (frozen whole)")
        assert rec.verdict.reason == "metrics_unanswered", rec.verdict.detail
        assert (await client.get("/probe/a/ready")).status == 503
        await wait_for(lambda: rec.verdict.state in RESTARTABLE_STATES and
                       (time.monotonic() - frozen_at) > 0 and _unlive(rec), timeout=LIVENESS + 2 * POLL + SLACK,
                       what="liveness failing")
        assert (await client.get("/probe/a/live")).status == 503
        assert time.monotonic() - frozen_at <= DOWN_AFTER + LIVENESS + 2 * (POLL + 2 * 0.3) + SLACK
        assert "down" not in {state for _, _, state in rec.history}
    finally:
        server.release.set()


def _unlive(rec) -> bool:
    from llm_vitals.exporter.verdict import is_live
    return not is_live(rec.verdict, rec.settings, time.monotonic())


async def test_a_vllm_with_a_slow_metrics_page_is_never_unready_nor_restartable(aiohttp_server, aiohttp_client) -> None:
    # Pages take 0.4 s against a 0.3 s timeout: every plain read times out; /health answers at once.
    server, _, client, rec = await watched_stoppable(aiohttp_server, aiohttp_client)
    await wait_for(lambda: rec.verdict.reason == "progress", what="busy with progress")
    server.metrics_delay = 0.4
    slowed_at, polls = time.monotonic(), rec.polls
    while time.monotonic() - slowed_at < DOWN_AFTER + LIVENESS + 1:
        assert rec.verdict.state == "busy", rec.verdict.detail
        assert (await client.get("/probe/a/ready")).status == 200, rec.verdict.detail
        assert (await client.get("/probe/a/live")).status == 200
        await asyncio.sleep(0.05)
    assert rec.polls - polls >= 4
    assert rec.poll_errors.get("timeout", 0) >= 1  # the short deadline was missed, and that was all
    assert rec.verdict.state == "busy" and rec.verdict.reason == "progress"


async def test_a_refused_connection_is_down_and_unready_at_the_first_read(aiohttp_server, aiohttp_client) -> None:
    _, upstream, client, rec = await watched_stoppable(aiohttp_server, aiohttp_client)
    await wait_for(lambda: rec.verdict.reason == "progress", what="busy with progress")
    assert (await client.get("/probe/a/ready")).status == 200
    await upstream.close()
    polls = rec.polls
    await wait_for(lambda: rec.polls > polls, what="one more poll")
    # The first read after the process went: not the held `busy` for down_after.
    await wait_for(lambda: rec.polls >= polls + 1 and rec.verdict.state == "down", timeout=POLL * 3 + SLACK,
                   what="down at the first refused read")
    assert rec.verdict.reason == "refused" and rec.polls - polls <= 2
    assert (await client.get("/probe/a/ready")).status == 503
