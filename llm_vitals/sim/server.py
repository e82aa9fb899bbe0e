"""The aiohttp app of one simulated vLLM server lifetime: the vLLM routes plus `/admin/*`.

A new app is built for every (re)start of a backend, so everything it serves (counters, start time,
HTTP stats) belongs to that one "process".
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llm_vitals.sim.config import VLLM_VERSION
from llm_vitals.sim.driver import TokenEvent
from llm_vitals.sim.metrics import CONTENT_TYPE, render
from llm_vitals.sim.openai_api import (
    ApiError,
    ParsedRequest,
    error_body,
    full_response,
    generated_text,
    models_body,
    now_seconds,
    parse_request,
    stream_chunk,
    usage_chunk,
)

if TYPE_CHECKING:
    from llm_vitals.sim.backend import Backend, ServerProcess

_compact = functools.partial(json.dumps, separators=(",", ":"))


def json_response(data: Any, status: int = 200) -> web.Response:
    """JSON as vLLM (FastAPI) writes it: compact."""
    return web.json_response(data, status=status, dumps=_compact)


PROCESS_KEY: web.AppKey[ServerProcess] = web.AppKey("process")
BACKEND_KEY: web.AppKey[Backend] = web.AppKey("backend")

FAULTS = ("hang", "die", "restart", "slow", "none")
MAX_BODY_BYTES = 4 * 1024 * 1024


class FaultRequest(BaseModel):
    """Body of POST /admin/fault (and the control server's /backends/{i}/fault)."""

    model_config = ConfigDict(extra="forbid")

    fault: Literal["hang", "die", "restart", "slow", "none"]
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


def apply_fault(backend: Backend, body: Any) -> dict[str, Any]:
    """Shared by /admin/fault and the control server: validate, apply, return the new state."""
    fault = parse_model(FaultRequest, body)
    try:
        return backend.set_fault(fault.fault, factor=fault.factor, startup_seconds=fault.startup_seconds)
    except FaultConflict as exc:
        raise json_error(web.HTTPConflict, str(exc)) from None


def apply_restart(backend: Backend, body: Any) -> dict[str, Any]:
    """Shared by /admin/restart and the control server: validate, start the restart, return the state."""
    restart = parse_model(RestartRequest, body)
    return backend.set_fault("restart", startup_seconds=restart.startup_seconds)


# -- vLLM routes ----------------------------------------------------------------------------------
async def health(request: web.Request) -> web.Response:
    # 200 with an empty body while the engine lives (even hung); 503 once it is known dead.
    process = request.app[PROCESS_KEY]
    return web.Response(status=503 if process.driver.dead else 200)


# Sleep mode, as vLLM serves it with --enable-sleep-mode (and VLLM_SERVER_DEV_MODE=1).
async def sleep(request: web.Request) -> web.Response:
    process = request.app[PROCESS_KEY]
    level = request.query.get("level", "1")
    if level not in ("1", "2"):
        error = ApiError(400, f"level must be 1 or 2, not {level!r}", param="level")
        return json_response(error.body(), status=error.status)
    process.driver.set_sleep(int(level))
    return web.Response(status=200)


async def wake_up(request: web.Request) -> web.Response:
    request.app[PROCESS_KEY].driver.set_sleep(0)
    return web.Response(status=200)


async def is_sleeping(request: web.Request) -> web.Response:
    return json_response({"is_sleeping": request.app[PROCESS_KEY].driver.sleep_level > 0})


async def version(request: web.Request) -> web.Response:
    return json_response({"version": VLLM_VERSION})


async def load(request: web.Request) -> web.Response:
    return json_response({"server_load": 0})


async def models(request: web.Request) -> web.Response:
    process = request.app[PROCESS_KEY]
    return json_response(models_body(process.config, int(process.start_time)))


async def metrics(request: web.Request) -> web.Response:
    process = request.app[PROCESS_KEY]
    return web.Response(body=render(process.collector), headers={"Content-Type": CONTENT_TYPE})


async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve_completion(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve_completion(request, "chat")


async def _serve_completion(request: web.Request, kind: str) -> web.StreamResponse:
    process = request.app[PROCESS_KEY]
    try:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ApiError(400, f"JSON decode error: {exc}") from None
        parsed = parse_request(kind, body, process.config)
    except ApiError as exc:
        return json_response(exc.body(), status=exc.status)
    channel = process.driver.submit(parsed.sim)
    try:
        if parsed.stream:
            return await _stream(request, parsed, channel)
        return await _collect(parsed, channel)
    finally:
        # Finished requests are gone from the driver already; this only aborts the abandoned ones.
        process.driver.abort(parsed.sim.request_id)


async def _collect(parsed: ParsedRequest, channel: asyncio.Queue[TokenEvent]) -> web.Response:
    tokens = 0
    while True:
        event = await channel.get()
        if event.error is not None:
            return json_response(error_body(500, event.error), status=500)
        tokens += event.tokens
        if event.finished_reason is not None:
            return json_response(full_response(parsed, tokens, event.finished_reason, now_seconds()))


async def _stream(request: web.Request, parsed: ParsedRequest,
                  channel: asyncio.Queue[TokenEvent]) -> web.StreamResponse:
    created = now_seconds()
    first = await channel.get()
    if first.error is not None:  # dead before anything was sent: a plain 500, as vLLM does
        return json_response(error_body(500, first.error), status=500)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await response.prepare(request)

    async def send(obj: Any) -> None:
        await response.write(f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode())

    if parsed.kind == "chat":
        await send(stream_chunk(parsed, created, None, None, first=True))
    tokens, event = 0, first
    while True:
        if event.tokens and event.finished_reason is None and not channel.empty():
            # The last token and the finish arrive together in vLLM's final chunk.
            following = channel.get_nowait()
            event = TokenEvent(tokens=event.tokens + following.tokens, finished_reason=following.finished_reason,
                               error=following.error)
        if event.error is not None:
            await send(error_body(500, event.error))
            break
        if event.tokens:
            text = generated_text(parsed.sim.request_id, tokens, event.tokens)
            tokens += event.tokens
            await send(stream_chunk(parsed, created, text, event.finished_reason))
        elif event.finished_reason is not None:
            await send(stream_chunk(parsed, created, None if parsed.kind == "chat" else "", event.finished_reason))
        if event.finished_reason is not None:
            if parsed.include_usage:
                await send(usage_chunk(parsed, created, tokens))
            break
        event = await channel.get()
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


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


def create_app(process: ServerProcess, backend: Backend) -> web.Application:
    """The admin routes of one simulated server lifetime (the engine's own come from its table entry)."""
    app = web.Application(middlewares=[http_stats_middleware], client_max_size=MAX_BODY_BYTES)
    app[PROCESS_KEY] = process
    app[BACKEND_KEY] = backend
    app.on_response_prepare.append(_server_header)
    # The engine's own routes are added by the caller, from llm_vitals.sim/engine_table.py.
    app.router.add_post("/admin/fault", admin_fault)
    app.router.add_post("/admin/restart", admin_restart)
    app.router.add_get("/admin/state", admin_state)
    return app
