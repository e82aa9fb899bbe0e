"""The routes every simulated server lifetime serves whatever its engine: `/admin/*`, and its plumbing.

`POST /admin/fault`, `POST /admin/restart`, `GET /admin/state` act on the backend the lifetime
belongs to; the fleet's control server (llm_vitals/sim/control.py) applies the same bodies with
`apply_fault` and `apply_restart`. `create_app` builds one lifetime's app with these routes and the
middleware that feeds the `http_*` families; the engine's own routes come from its table entry
(llm_vitals/sim/engines/table.py).
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal, Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llm_vitals.sim.process import PROCESS_KEY, ServerProcess, json_response


class Faultable(Protocol):
    """What the admin routes act on: a backend (llm_vitals/sim/backend.py) across its lifetimes."""

    def set_fault(self, fault: str, factor: float | None = None,
                  startup_seconds: float | None = None) -> dict[str, Any]: ...

    def state(self) -> dict[str, Any]: ...


BACKEND_KEY: web.AppKey[Faultable] = web.AppKey("backend")

FAULTS = ("hang", "freeze", "die", "restart", "slow", "none", "peer")
MAX_BODY_BYTES = 4 * 1024 * 1024


class FaultRequest(BaseModel):
    """Body of POST /admin/fault (and the control server's /backends/{i}/fault)."""

    model_config = ConfigDict(extra="forbid")

    fault: Literal["hang", "freeze", "die", "restart", "slow", "none", "peer"]
    factor: float = Field(4.0, gt=1.0, le=1000.0, description="slow: divide the token rates by this")
    startup_seconds: float | None = Field(None, ge=0, le=3600, description="restart: loading period override")


class RestartRequest(BaseModel):
    """Optional body of POST /admin/restart."""

    model_config = ConfigDict(extra="forbid")

    startup_seconds: float | None = Field(None, ge=0, le=3600)


class FaultConflict(Exception):
    """A fault that cannot apply in the backend's current phase (e.g. `hang` on a dead backend)."""


def json_error(kind: type[web.HTTPError], message: str) -> web.HTTPError:
    """An admin or control error to raise: `{"error": message}` with the status of `kind`."""
    return kind(text=json.dumps({"error": message}), content_type="application/json")


async def read_json(request: web.Request, *, optional: bool = False) -> Any:
    """The request's JSON body, or a 400 with what was wrong with it."""
    raw = await request.read()
    if not raw.strip():
        if optional:
            return {}
        raise json_error(web.HTTPBadRequest, "empty body: send a JSON object")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise json_error(web.HTTPBadRequest, f"body is not valid JSON: {exc}") from None


def parse_model(model: type[BaseModel], body: Any) -> Any:
    """Validate an admin body; a 400 that names the bad field otherwise."""
    if not isinstance(body, dict):
        raise json_error(web.HTTPBadRequest, "body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "body"
            if err["type"] == "literal_error" and where == "fault":
                problems.append(f"unknown fault {err['input']!r}: use one of {', '.join(FAULTS)}")
            elif err["type"] == "extra_forbidden":
                problems.append(f"unknown field {where!r}")
            else:
                problems.append(f"{where}: {err['msg']}")
        raise json_error(web.HTTPBadRequest, "; ".join(problems)) from None


def apply_fault(backend: Faultable, body: Any) -> dict[str, Any]:
    """Shared by /admin/fault and the control server: validate, apply, return the new state."""
    fault = parse_model(FaultRequest, body)
    try:
        return backend.set_fault(fault.fault, factor=fault.factor, startup_seconds=fault.startup_seconds)
    except FaultConflict as exc:
        raise json_error(web.HTTPConflict, str(exc)) from None


def apply_restart(backend: Faultable, body: Any) -> dict[str, Any]:
    """Shared by /admin/restart and the control server: validate, start the restart, return the state."""
    restart = parse_model(RestartRequest, body)
    return backend.set_fault("restart", startup_seconds=restart.startup_seconds)


# -- admin routes ---------------------------------------------------------------------------------
async def admin_fault(request: web.Request) -> web.Response:
    return json_response(apply_fault(request.app[BACKEND_KEY], await read_json(request)))


async def admin_restart(request: web.Request) -> web.Response:
    apply_restart(request.app[BACKEND_KEY], await read_json(request, optional=True))
    return json_response({"restarting": True})


async def admin_state(request: web.Request) -> web.Response:
    return json_response(request.app[BACKEND_KEY].state())


# -- plumbing -------------------------------------------------------------------------------------
@web.middleware
async def http_stats_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Feeds the http_* families (as vLLM's instrumentator does) and turns stray errors into JSON."""
    started = time.perf_counter()
    status = 500
    response: web.StreamResponse | None = None
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        route = request.match_info.route.resource
        if route is not None:
            size = 0
            if isinstance(response, web.Response) and isinstance(response.body, bytes):
                size = len(response.body)
            elif response is not None:
                size = response.body_length
            request.app[PROCESS_KEY].http.record(route.canonical, request.method, status,
                                                 request.content_length or 0, size,
                                                 time.perf_counter() - started, time.time())


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["server"] = "uvicorn"


def create_app(process: ServerProcess, backend: Faultable) -> web.Application:
    """The admin routes of one simulated server lifetime (the engine's own come from its table entry)."""
    app = web.Application(middlewares=[http_stats_middleware], client_max_size=MAX_BODY_BYTES)
    app[PROCESS_KEY] = process
    app[BACKEND_KEY] = backend
    app.on_response_prepare.append(_server_header)
    # The engine's own routes are added by the caller (backend.py), from its entry in llm_vitals/sim/engines/table.py.
    app.router.add_post("/admin/fault", admin_fault)
    app.router.add_post("/admin/restart", admin_restart)
    app.router.add_get("/admin/state", admin_state)
    return app
