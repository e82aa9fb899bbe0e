"""The fleet control server: faults and restarts for any backend, even one whose port is closed.

A `die`d backend no longer listens, so its own `/admin/*` routes are gone; this server, which
always listens, is how it is brought back (`POST /backends/{i}/restart`).
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from llm_vitals.sim.admin import apply_fault, apply_restart, json_error, read_json
from llm_vitals.sim.backend import Backend

BACKENDS_KEY: web.AppKey[Sequence[Backend]] = web.AppKey("backends")


def _backend(request: web.Request) -> Backend:
    backends = request.app[BACKENDS_KEY]
    raw = request.match_info["index"]
    if not raw.isdigit() or int(raw) >= len(backends):
        raise json_error(web.HTTPNotFound, f"unknown backend {raw!r}: use 0..{len(backends) - 1}")
    return backends[int(raw)]


async def list_backends(request: web.Request) -> web.Response:
    return web.json_response({"backends": [b.state() for b in request.app[BACKENDS_KEY]]})


async def backend_state(request: web.Request) -> web.Response:
    return web.json_response(_backend(request).state())


async def backend_fault(request: web.Request) -> web.Response:
    backend = _backend(request)
    return web.json_response(apply_fault(backend, await read_json(request)))


async def backend_restart(request: web.Request) -> web.Response:
    state = apply_restart(_backend(request), await read_json(request, optional=True))
    return web.json_response({"restarting": True, **state})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def create_control_app(backends: Sequence[Backend]) -> web.Application:
    app = web.Application(client_max_size=64 * 1024)
    app[BACKENDS_KEY] = backends
    app.router.add_get("/backends", list_backends)
    app.router.add_get("/backends/{index}/state", backend_state)
    app.router.add_post("/backends/{index}/fault", backend_fault)
    app.router.add_post("/backends/{index}/restart", backend_restart)
    app.router.add_get("/health", health)
    return app
