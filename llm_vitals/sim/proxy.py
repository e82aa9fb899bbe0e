"""A least-connection reverse proxy in front of the simulated backends (like nginx `least_conn`).

It forwards `/v1/*` and `/metrics`, so a `/metrics` read may come from any backend, which is
exactly the trap the exporter must avoid (a proxy target is checked through `/v1/models` only).
Ties go round-robin; a backend that refuses the connection is skipped (nginx's
`proxy_next_upstream error`). Responses, SSE included, are streamed through as they come.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp
from aiohttp import web

BACKEND_URLS_KEY: web.AppKey[Callable[[], Sequence[str]]] = web.AppKey("backend_urls")
SESSION_KEY: web.AppKey[aiohttp.ClientSession] = web.AppKey("session")
BALANCER_KEY: web.AppKey[LeastConnections] = web.AppKey("balancer")

_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
                         "transfer-encoding", "upgrade", "host", "content-length"})


class LeastConnections:
    """Picks the backend with the fewest requests in flight; ties in turn."""

    def __init__(self) -> None:
        self.active: dict[str, int] = {}
        self._turn = itertools.count()

    def order(self, urls: Sequence[str]) -> list[str]:
        """All backends, best first: fewest active, ties rotated so idle reads spread."""
        if not urls:
            return []
        shift = next(self._turn) % len(urls)
        rotated = list(urls[shift:]) + list(urls[:shift])
        return sorted(rotated, key=lambda url: self.active.get(url, 0))  # stable: rotation breaks ties


async def forward(request: web.Request) -> web.StreamResponse:
    balancer = request.app[BALANCER_KEY]
    session = request.app[SESSION_KEY]
    body = await request.read()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
    last_error = "no backends configured"
    for base in balancer.order(request.app[BACKEND_URLS_KEY]()):
        balancer.active[base] = balancer.active.get(base, 0) + 1
        try:
            async with session.request(request.method, base + request.rel_url.path_qs, headers=headers,
                                       data=body, allow_redirects=False) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name.lower() not in _HOP_BY_HOP:
                        response.headers.add(name, value)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientConnectorError as exc:  # refused or unreachable: try the next backend
            last_error = f"{base}: {exc}"
        finally:
            balancer.active[base] -= 1
    return web.json_response({"error": f"no backend available ({last_error})"}, status=502)


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    # No total timeout: completions stream for as long as they take; connecting must be quick.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=2.0)
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
        app[SESSION_KEY] = session
        yield


def create_proxy_app(backend_urls: Callable[[], Sequence[str]]) -> web.Application:
    """The proxy app; `backend_urls()` is read per request (ports are known only once bound)."""
    app = web.Application(client_max_size=4 * 1024 * 1024)
    app[BACKEND_URLS_KEY] = backend_urls
    app[BALANCER_KEY] = LeastConnections()
    app.cleanup_ctx.append(_client_session)
    app.router.add_route("*", "/v1/{tail:.*}", forward)
    app.router.add_get("/metrics", forward)
    return app
