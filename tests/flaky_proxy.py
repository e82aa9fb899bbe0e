"""A flaky proxy for drills: forwards every request to one upstream, and holds every `every`-th read of
`path` for `delay` seconds first, so that a reader with a shorter timeout sees that read time out.

The real engines cannot be told to miss one read in three; a proxy between the exporter and the
engine's /metrics can, whatever the engine. Run it in the test's own event loop::

    async with FlakyProxy(upstream, every=3, delay=2.0) as proxy:   # proxy.url, proxy.reads, proxy.held
        ...                                                          # point the exporter at proxy.url

`proxy.freeze()` makes it a server stopped whole (SIGSTOP, a deadlocked loop): every request on
every path is accepted and never answered until `proxy.thaw()`.

Or, from a test that has no event loop of its own (the real-engine tiers), in a thread::

    with FlakyProxy(upstream, every=3, delay=12.0).in_thread() as proxy:
        ...

Only loopback: it listens on 127.0.0.1, and its upstream is the engine the test itself started.
Responses come back whole, their headers with them (llama.cpp's restart token is one); a held read
whose reader has gone is dropped (no forward).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from types import TracebackType

import aiohttp
from aiohttp import web

# Headers that belong to one hop, not to the message (RFC 9110 §7.6.1), and the ones aiohttp sets itself.
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "host", "content-length", "content-encoding"})


class FlakyProxy:
    """A loopback reverse proxy to `upstream` (scheme://host:port) that holds every `every`-th read of `path`."""

    def __init__(self, upstream: str, *, path: str = "/metrics", every: int = 3, delay: float = 2.0,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        if every < 1 or delay < 0:
            raise ValueError("every must be >= 1 and delay >= 0")
        self.upstream = upstream.rstrip("/")
        self.path = path
        self.every = every
        self.delay = delay
        self.host = host
        self.port = port
        self.reads = 0  # reads of `path` seen
        self.held = 0  # of which held for `delay`
        self.url = ""
        self.frozen = False
        self._thawed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        return app

    async def start(self) -> FlakyProxy:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300),
                                              connector=aiohttp.TCPConnector(limit=0))
        # handler_cancellation: a held read whose reader gave up is dropped, not forwarded later.
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.url = f"http://{self.host}:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> FlakyProxy:
        return await self.start()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    def freeze(self) -> None:
        """From now on accept every request and answer none (until `thaw`), on every path."""
        self.frozen = True
        self._thawed.clear()

    def thaw(self) -> None:
        self.frozen = False
        self._thawed.set()

    def held_now(self, read: int) -> bool:
        """Whether the `read`-th read of `path` (1-based) is held: every `every`-th one."""
        return read % self.every == 0

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if self.frozen:
            await self._thawed.wait()
        if request.path == self.path and request.method == "GET":
            self.reads += 1
            if self.held_now(self.reads):
                self.held += 1
                await asyncio.sleep(self.delay)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        body = await request.read()
        try:
            async with self._session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                             data=body or None, allow_redirects=False) as answer:
                payload = await answer.read()
                kept = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP}
                return web.Response(status=answer.status, body=payload, headers=kept)
        except aiohttp.ClientError as exc:
            # The upstream refused or broke off: a bad gateway, as a real proxy answers.
            return web.Response(status=502, text=f"flaky proxy: upstream failed: {type(exc).__name__}")

    @contextlib.contextmanager
    def in_thread(self) -> Iterator[FlakyProxy]:
        """Serve from a thread with its own event loop until the block ends (for tests without a loop)."""
        loop = asyncio.new_event_loop()
        started = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:
                failure.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        thread = threading.Thread(target=serve, name="flaky-proxy", daemon=True)
        thread.start()
        started.wait(30)
        if failure:
            raise failure[0]
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(30)
