"""The tests' fake HTTP servers (an engine, an API server, an exporter) build their aiohttp app one way."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def app_of(*routes: tuple[str, str, Handler]) -> web.Application:
    """An app answering each (method, path) with its handler (a GET answers HEAD too, as add_get's)."""
    app = web.Application()
    for method, path, handler in routes:
        if method == "GET":
            app.router.add_get(path, handler)
        else:
            app.router.add_route(method, path, handler)
    return app
