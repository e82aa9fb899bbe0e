"""The remediator's HTTP routes: thin handlers that parse, call the service and format the answer.

Two middlewares do what every route does, once: `guard` answers 401 unless the caller's token
grants what the route needs (`needs`: `act` by default, so a route cannot forget it; `read` for
the reads; None only for /healthz and /metrics), and `state_errors` answers 503 when the shared
state cannot be reached, or is lost (`state_lost`: nothing is done until it is re-initialised).

Status codes follow Alertmanager's retry rule (5xx is retried, 4xx is dropped): 401 without valid
auth, 403 with the read token on a route that acts, 413 over the body cap, 400 for invalid JSON,
422 for a payload of the wrong shape (naming the field), 200 for anything handled or deliberately
refused, and 503 only when nothing was started and a retry is safe (see `Remediator.handle_payload`).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime

import aiohttp
from aiohttp import web
from prometheus_client import generate_latest
from pydantic import ValidationError

from llm_vitals.backstop_word import answer_json
from llm_vitals.exposition import TEXT_CONTENT_TYPE
from llm_vitals.kube.client import KubeClient
from llm_vitals.logs import log_event

from .auth import Authenticator, Grant
from .executors import Executor
from .follow import follow
from .gate import JournalState
from .journal import Journal
from .payload import WebhookPayload, describe_errors
from .redecide import redecide
from .service import Remediator, log, store_for
from .settings import KubernetesSettings, Settings
from .store import StateLost, StateUnavailable

SETTINGS = web.AppKey("settings", Settings)
CLOCK: web.AppKey[Callable[[], float]] = web.AppKey("clock")
AUTH = web.AppKey("auth", Authenticator)
SERVICE = web.AppKey("service", Remediator)
EXECUTORS = web.AppKey("executors", dict)
# Every route of the API, each declared on its handler below.
ROUTES = web.RouteTableDef()

_CHUNK = 64 * 1024


def create_app(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.time,
    executors: dict[str, Executor] | None = None,
) -> web.Application:
    """The remediator as an aiohttp application; the journal and HTTP client live in cleanup_ctx."""
    app = web.Application(client_max_size=settings.body_limit, middlewares=[guard, state_errors])
    app[SETTINGS] = settings
    app[CLOCK] = clock
    app[AUTH] = Authenticator(settings.auth)
    app[EXECUTORS] = executors or {}
    app.cleanup_ctx.append(_service_ctx)
    app.router.add_routes(ROUTES)
    return app


async def _service_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    journal = Journal(settings.state_path, retention=settings.journal_retention)
    interrupted = await journal.open(app[CLOCK]())
    if interrupted:
        log_event(log, "restarts interrupted by a previous stop; they count against the cooldown", count=interrupted)
    try:
        kube = kube_client(settings)
        try:
            # One client for the exporter and the http executors; never one per request. Each request
            # has its own timeout and follows no redirect; the environment's proxies apply, as before.
            async with store_for(settings, kube, app[CLOCK]) as store, \
                    aiohttp.ClientSession(trust_env=True, timeout=aiohttp.ClientTimeout(total=None)) as client:
                service = Remediator(settings, journal, store, client, app[CLOCK], app[EXECUTORS] or None, kube)
                app[SERVICE] = service
                follower = None
                if not store.last_is_current and settings.kubernetes and settings.kubernetes.lease:
                    follower = asyncio.create_task(follow(store, settings.kubernetes.lease.duration))
                # The remediator's own look between Alertmanager's re-sends (redecide.py).
                looker = None
                if settings.redecide_interval > 0:
                    looker = asyncio.create_task(redecide(service.loop, settings.redecide_interval), name="redecide")
                yield
                for task in (follower, looker):
                    if task is not None:
                        task.cancel()
                        await asyncio.gather(task, return_exceptions=True)
                await service.shutdown()
        finally:
            if kube is not None:
                await kube.close()
    finally:
        await journal.close()


def kube_client(settings: Settings) -> KubeClient | None:
    """The Kubernetes API client, when the shared Lease or a target template needs one."""
    if settings.kubernetes is None and not settings.target_templates:
        return None
    return KubeClient(settings.kubernetes or KubernetesSettings())


def _error(status: int, message: str, **extra: object) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


def _unauthorized(app: web.Application) -> web.Response:
    response = _error(401, "authentication required")
    response.headers["WWW-Authenticate"] = f'{app[AUTH].scheme} realm="llm-vitals-remediator"'
    return response


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def needs(grant: Grant | None) -> Callable[[Handler], Handler]:
    """Mark what a route's caller must be granted (`guard` reads it); unmarked routes need `act`."""

    def mark(handler: Handler) -> Handler:
        handler.needs = grant  # type: ignore[attr-defined]
        return handler

    return mark


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """401 unless the Authorization header grants what the route needs; 403 for the read token on a route that acts."""
    if request.match_info.http_exception is not None:  # no such route (404, 405): nothing to guard
        return await handler(request)
    wanted: Grant | None = getattr(request.match_info.handler, "needs", "act")
    if wanted is None:
        return await handler(request)
    auth = request.app[AUTH]
    header = request.headers.get("Authorization")
    if auth.allows(header, wanted):
        return await handler(request)
    if auth.grant(header) == "read":
        return _error(403, "the read token cannot act: this route needs the act token")
    return _unauthorized(request.app)


@web.middleware
async def state_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """503 when the shared state cannot be read or written (retry-safe), saying when it is lost."""
    try:
        return await handler(request)
    except StateLost as exc:
        return _error(503, f"the shared state is lost: {exc}", state_lost=True)
    except StateUnavailable as exc:
        return _error(503, f"cannot reach the shared state: {exc}")


async def _read_capped(request: web.Request, limit: int) -> bytes | None:
    """The body, or None as soon as it passes `limit` (the rest is never read)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(_CHUNK):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _parsed(body: bytes) -> object:
    """The body's JSON, or the 400 to answer: malformed, or nested too deeply to parse (never a 500)."""
    try:
        return json.loads(body)
    except ValueError as exc:  # includes UnicodeDecodeError
        return _error(400, f"invalid JSON: {exc}")
    except RecursionError:
        return _error(400, "invalid JSON: nested too deeply")


async def _query_or_body(request: web.Request) -> object:
    """What an operator's call names, from its query or its JSON body (never both), or the error to answer."""
    body = await _read_capped(request, 64 * 1024)
    if body is None:
        return _error(413, "body too large")
    if not body.strip():
        return dict(request.query)
    if request.query:
        return _error(400, "name the workload in the query or in the body, not both")
    return _parsed(body)


@ROUTES.post("/webhook")
async def webhook(request: web.Request) -> web.Response:
    """POST /webhook: one Alertmanager v4 payload."""
    limit = request.app[SETTINGS].body_limit
    body = await _read_capped(request, limit)
    if body is None:
        return _error(413, f"body larger than {limit} bytes")
    data = _parsed(body)
    if isinstance(data, web.Response):
        return data
    try:
        payload = WebhookPayload.model_validate(data)
    except ValidationError as exc:
        fields = describe_errors(exc)
        return _error(422, "invalid Alertmanager payload: " + "; ".join(fields[:5]), fields=fields)
    outcome = await request.app[SERVICE].handle_payload(payload)
    return web.json_response(
        {"decisions": outcome.decisions, "truncated_alerts": payload.truncatedAlerts}, status=outcome.status
    )


@ROUTES.get("/api/v1/actions")
@needs("read")
async def actions(request: web.Request) -> web.Response:
    """GET /api/v1/actions?limit=N: the journal, newest first (the read token: it names pods, nodes, alerts)."""
    raw = request.query.get("limit", "100")
    try:
        limit = int(raw)
        if not 1 <= limit <= 1000:
            raise ValueError
    except ValueError:
        return _error(400, "limit must be an integer from 1 to 1000")
    service = request.app[SERVICE]
    rows = await service.journal.actions(limit)
    # The pause as last seen (no Lease read here): what the status page shows.
    state, now = service.gate_state_now(), request.app[CLOCK]()
    return web.json_response({"actions": rows, "pause": _pause_view(state, now)})


@ROUTES.get("/api/v1/actions/{id}")
@needs("read")
async def action(request: web.Request) -> web.Response:
    """GET /api/v1/actions/{id}: one decision with its evidence (the exporter's TARGET, pre_restart output)."""
    try:
        action_id = int(request.match_info["id"])
    except ValueError:
        return _error(400, "the action id is an integer")
    if not 1 <= action_id < 2**63:  # past SQLite's integers: no such row (a 20-digit id is not a 500)
        return _error(404, f"no action {request.match_info['id'][:30]}")
    row = await request.app[SERVICE].journal.action(action_id)
    if row is None:
        return _error(404, f"no action {action_id}")
    return web.json_response(row)


def _pause_view(state: JournalState, now: float) -> dict[str, object]:
    paused = state.paused_until is not None and now < state.paused_until
    return {"paused": paused, "until": state.paused_until if paused else None, "reason": state.pause_reason if paused else ""}


@ROUTES.get("/api/v1/pause")
@needs("read")
async def pause_get(request: web.Request) -> web.Response:
    """GET /api/v1/pause: the pause as stored, read at most a second ago (never one Lease read per request)."""
    return web.json_response(_pause_view(await request.app[SERVICE].recent_state(), request.app[CLOCK]()))


@ROUTES.get("/api/v1/state")
@needs("read")
async def state_get(request: web.Request) -> web.Response:
    """GET /api/v1/state: whether the shared state is lost, and its circuits, nodes, pause and ladder as last seen."""
    return web.json_response(request.app[SERVICE].state_view())


@ROUTES.get("/api/v1/backstop")
@needs("read")
async def backstop_get(request: web.Request) -> web.Response:
    """GET /api/v1/backstop?workload=W[&workload=W2...]: the gate's word for each workload's liveness
    backstop (gate_word.py): `act` or `hold`, with the reason and since when, at the remediator's clock."""
    workloads = request.query.getall("workload", [])
    if not workloads or len(workloads) > 100 or any(not w or len(w) > 512 for w in workloads):
        return _error(400, "name 1 to 100 workloads: ?workload=Deployment/<namespace>/<name>")
    now, words = await request.app[SERVICE].backstop_words(list(dict.fromkeys(workloads)))
    return web.json_response(answer_json(now, words))


@ROUTES.post("/api/v1/state/reinit")
async def state_reinit(request: web.Request) -> web.Response:
    """POST /api/v1/state/reinit {"from": "empty" | "journal", "reason": TEXT}: a human re-initialises
    the replicas' shared state (lost, or on purpose). The answer says what it discarded."""
    body = await _read_capped(request, 64 * 1024)
    if body is None:
        return _error(413, "body too large")
    data = _parsed(body or b"null")
    if isinstance(data, web.Response):
        return data
    if not isinstance(data, dict) or set(data) != {"from", "reason"} or data["from"] not in ("empty", "journal") \
            or not isinstance(data["reason"], str) or not data["reason"].strip() or len(data["reason"]) > 500:
        return _error(422, 'expected {"from": "empty" | "journal", "reason": TEXT}: say where the new state comes'
                           " from and why; what the old one held is discarded")
    by = request.headers.get("X-Remote-User") or request.remote or "unknown"
    try:
        answer = await request.app[SERVICE].reinitialise(data["from"], data["reason"].strip(), by)
    except ValueError as exc:
        return _error(409, str(exc))
    return web.json_response(answer)


@ROUTES.post("/api/v1/pause")
async def pause_post(request: web.Request) -> web.Response:
    """POST /api/v1/pause {"until": RFC 3339 or unix seconds, "reason": TEXT}: restart nothing until then."""
    body = await _read_capped(request, 64 * 1024)
    if body is None:
        return _error(413, "body too large")
    data = _parsed(body)
    if isinstance(data, web.Response):
        return data
    parsed = parse_pause(data, request.app[CLOCK]())
    if isinstance(parsed, BadRequest):
        return _error(400, str(parsed))
    if isinstance(parsed, str):
        return _error(422, parsed)
    until, reason = parsed
    state = await request.app[SERVICE].set_pause(until, reason)
    return web.json_response(_pause_view(state, request.app[CLOCK]()))


@ROUTES.delete("/api/v1/pause")
async def pause_delete(request: web.Request) -> web.Response:
    """DELETE /api/v1/pause: resume now."""
    state = await request.app[SERVICE].set_pause(None, "")
    return web.json_response(_pause_view(state, request.app[CLOCK]()))


# The last second RFC 3339 (and the journal's dates) can write: 9999-12-31T23:59:59Z.
MAX_UNTIL = 253402300799.0


class BadRequest(str):
    """An error message for a 400: a name that names nothing, a number no time can be (never a 500)."""


class WrongShape(str):
    """An error message for a 422: a body of the wrong shape."""


def parse_pause(data: object, now: float) -> tuple[float, str] | str:
    """`{"until", "reason"}` -> (unix seconds, reason), or the error message: for a 422, or an
    `BadRequest` one for a 400."""
    if not isinstance(data, dict) or set(data) - {"until", "reason"}:
        return 'expected {"until": TIME, "reason": TEXT}'
    until, reason = data.get("until"), data.get("reason")
    if not isinstance(reason, str) or not reason.strip() or len(reason) > 500:
        return "reason: a non-empty text of at most 500 characters is required"
    if isinstance(until, bool) or not isinstance(until, (int, float, str)):
        return "until: an RFC 3339 time or unix seconds is required"
    if isinstance(until, str):
        try:
            stamp = datetime.fromisoformat(until.replace("Z", "+00:00"))
        except ValueError:
            return f"until: not an RFC 3339 time: {until[:64]!r}"
        if stamp.tzinfo is None:
            return "until: give a time zone (Z or +01:00)"
        until = stamp.timestamp()
    if isinstance(until, int) and abs(until) > MAX_UNTIL:  # before float(): a huge int overflows it
        return BadRequest(f"until: at most {MAX_UNTIL:.0f} (9999-12-31T23:59:59Z)")
    if math.isfinite(until) and until > MAX_UNTIL:
        return BadRequest(f"until: at most {MAX_UNTIL:.0f} (9999-12-31T23:59:59Z)")
    if not math.isfinite(until) or until <= now:
        return "until: must be in the future"
    return float(until), reason.strip()


@ROUTES.post("/api/v1/circuit/reset")
async def circuit_reset(request: web.Request) -> web.Response:
    """POST /api/v1/circuit/reset {"workload": NAME} | {"target": NAME} | {"all": true} (or the same as a
    query parameter): close one circuit, or every one when asked by name.

    Circuits are per workload; a static target is its own workload, so `target` (the older key)
    names the same thing for it. A reset names what it touches: an empty or null name, or no name
    at all, is a 400 (an unset shell variable must not reset every budget)."""
    if set(request.query) - {"workload", "target", "all"}:
        return _error(400, "unknown query parameter: expected workload, target or all")
    data = await _query_or_body(request)
    if isinstance(data, web.Response):
        return data
    chosen = reset_choice(data)
    if isinstance(chosen, (BadRequest, WrongShape)):
        return _error(422 if isinstance(chosen, WrongShape) else 400, str(chosen))
    service = request.app[SERVICE]
    known = await service.workloads_known()
    if chosen is None:
        # Static targets first, then the workloads the state knows.
        workloads = list(request.app[SETTINGS].targets) + sorted(known - set(request.app[SETTINGS].targets))
    else:
        if chosen not in known:
            return _error(404, "unknown workload")
        workloads = [chosen]
    was_open = await service.reset_circuits(workloads)
    return web.json_response({"reset": workloads, "were_open": was_open})


_RESET_SHAPE = 'expected {"workload": NAME}, {"target": NAME} or {"all": true}'


def reset_choice(data: object) -> str | BadRequest | WrongShape | None:
    """What a circuit reset names: a workload, None for every one (`all` true), or the error (400 or 422)."""
    if not isinstance(data, dict) or len(data) > 1 or set(data) - {"target", "workload", "all"}:
        return WrongShape(_RESET_SHAPE)
    if not data:
        return BadRequest("name what to reset: " + _RESET_SHAPE)
    if "all" in data:
        return None if data["all"] in (True, "true") else BadRequest('all: only true resets every circuit')
    return named_workload(data.get("workload", data.get("target")))


def named_workload(name: object) -> str | BadRequest:
    """A workload an operator named, or the error for a 400: never empty, null or padded."""
    if not isinstance(name, str) or not name.strip():
        return BadRequest("name a workload: an empty or null name touches nothing")
    if len(name) > 512 or name != name.strip():
        return BadRequest("not a workload name")
    return name


@ROUTES.post("/api/v1/workloads/release")
async def workload_release(request: web.Request) -> web.Response:
    """POST /api/v1/workloads/release {"workload": NAME}: a human has looked at a paged workload; its page
    ends and its ladder starts again at a restart (its circuit and budget are the circuit reset's)."""
    data = await _query_or_body(request)
    if isinstance(data, web.Response):
        return data
    if not isinstance(data, dict) or set(data) != {"workload"}:
        return _error(400, 'expected {"workload": NAME}')
    name = named_workload(data["workload"])
    if isinstance(name, BadRequest):
        return _error(400, str(name))
    was_paged = await request.app[SERVICE].release_workload(name)
    return web.json_response({"workload": name, "released": True, "was_paged": was_paged})


# A Kubernetes node name: a DNS subdomain.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@ROUTES.post("/api/v1/nodes/{node}/release")
async def node_release(request: web.Request) -> web.Response:
    """POST /api/v1/nodes/{node}/release: forget that llm-vitals cordoned the node (a human uncordons it)."""
    node = request.match_info["node"]
    if len(node) > 253 or not _NODE_NAME.match(node):
        return _error(400, "not a Kubernetes node name")
    was_escalated = await request.app[SERVICE].release_node(node)
    return web.json_response({"node": node, "released": True, "was_escalated": was_escalated})


@ROUTES.get("/metrics")
@needs(None)
async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[SERVICE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": TEXT_CONTENT_TYPE})


@ROUTES.get("/healthz")
@needs(None)
async def healthz(request: web.Request) -> web.Response:
    state = request.app[SERVICE].gate_state_now()
    return web.json_response({"status": "ok", "restart_in_progress": state.in_progress})
