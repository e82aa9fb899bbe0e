"""The exporter's aiohttp routes. Every answer comes from the cache: no handler awaits upstream I/O.

An upstream failure is data (state `down`, `up 0`) and still a 200 here; a bad name is a 404; only a
bug in the exporter gives a 500.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import generate_latest
from pydantic import BaseModel

from llm_vitals.exporter import backstop_ask
from llm_vitals.exporter.clock import Clock, as_clock
from llm_vitals.exporter.collector import LifecycleCollector, LoopLagCollector, build_process_registry
from llm_vitals.exporter.discovery.manager import Discovery, apply_to_store, sources_for
from llm_vitals.exporter.gpu_faults.node_watch import NodeCache, NodeWatchRunner
from llm_vitals.exporter.keys import (
    CLOCK,
    DISCOVERY,
    LAG,
    NODE_WATCH,
    NODES,
    PAGES,
    POLLER,
    REGISTRY,
    RELOAD,
    SESSION,
    SETTINGS,
    STORE,
)
from llm_vitals.exporter.loop_lag import LoopLag
from llm_vitals.exporter.page import PageCache
from llm_vitals.exporter.poller import Poller
from llm_vitals.exporter.reload import ReloadState, load_for_reload, record_success
from llm_vitals.exporter.settings import ConfigError, ExporterSettings
from llm_vitals.exporter.state import StateStore, target_view
from llm_vitals.exporter.status_page import setup_status_page
from llm_vitals.exporter.verdict import is_started
from llm_vitals.exposition import TEXT_CONTENT_TYPE
from llm_vitals.logs import log_event
from llm_vitals.targets import TargetsAnswer

log = logging.getLogger("llm_vitals.exporter")


PROBES = {"startup", "ready", "live"}


# A target name in a path: a static name, or a discovered one with its one `/` (discovery/targetset.py).
NAME = "{name:[^/]+(?:/[^/]+)?}"


def create_app(settings: ExporterSettings, *, clock: Clock | Callable[[], float] | None = None, poll: bool = True,
               config_path: Path | None = None, sighup: bool = False) -> web.Application:
    """The exporter app. `poll=False` serves the cache without starting the poll loops or discovery (for tests).

    `clock`: the real pair (monotonic, wall) by default; one plain function (a test's fake time) is
    both (llm_vitals/exporter/clock.py). `config_path` is the file `POST /-/reload` re-reads;
    `sighup` makes SIGHUP reload it too (the CLI's choice).
    """
    app = web.Application()
    app[SETTINGS] = settings
    clock = app[CLOCK] = as_clock(clock if clock is not None else Clock())
    store = app[STORE] = StateStore(settings, clock.mono())
    app[REGISTRY] = build_process_registry()  # the vitals are rendered by llm_vitals/exporter/page.py
    app[PAGES] = PageCache()
    discovery = app[DISCOVERY] = Discovery(settings, store, apply_to_store(store, clock.mono), clock.wall)
    discovery.sync()  # the shard applies to the static targets from the start
    app[RELOAD] = ReloadState(config_path, last_success=clock.wall())
    app[LAG] = LoopLag()
    app[REGISTRY].register(LifecycleCollector(discovery, app[RELOAD]))
    app[REGISTRY].register(LoopLagCollector(app[LAG]))
    app.cleanup_ctx.append(_client_session)
    if poll:
        app[NODES] = NodeCache()
        app[NODE_WATCH] = NodeWatchRunner(app[NODES])
        app.cleanup_ctx.append(_loop_lag)
        app.cleanup_ctx.append(_node_watch)
        app.cleanup_ctx.append(_pollers)
        app.cleanup_ctx.append(_backstop_ask)
        if sighup:
            app.on_startup.append(_reload_on_sighup)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/api/v1/targets", list_targets)
    app.router.add_get("/api/v1/discovery", show_discovery)
    app.router.add_get(f"/api/v1/targets/{NAME}/history", show_history)
    app.router.add_get(f"/api/v1/targets/{NAME}", show_target)
    app.router.add_post(f"/probe/{NAME}/drain", drain)
    app.router.add_post(f"/probe/{NAME}/undrain", undrain)
    app.router.add_post(f"/api/v1/targets/{NAME}/gpu_fault/release", release_gpu_fault)
    app.router.add_get(f"/probe/{NAME}/{{probe}}", probe)
    app.router.add_post("/-/reload", reload)
    setup_status_page(app)  # GET /: the human view of the same cache
    return app


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    # One session for every poll and canary. aiohttp rather than httpx: measured on this project's
    # 1,000-target benchmark, httpx spent ~13x the CPU per request.
    # No pool limits: each target has at most one poll and one canary in flight by construction, and a
    # shared limit would let one slow target delay the polls of the others.
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=max(30.0, 3 * settings.poll_interval))
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers={"User-Agent": "llm-vitals-exporter"}) as session:
        app[SESSION] = session
        yield


async def _loop_lag(app: web.Application) -> AsyncIterator[None]:
    """The sampler of the loop's own lateness (llm_vitals/exporter/loop_lag.py), for as long as the app runs."""
    task = asyncio.create_task(app[LAG].run(), name="loop-lag")
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _pollers(app: web.Application) -> AsyncIterator[None]:
    poller = Poller(app[SETTINGS], app[STORE], app[SESSION], app[CLOCK], nodes=_watched_nodes(app), lag=app[LAG])
    app[POLLER] = poller
    poller.start()
    discovery = app[DISCOVERY]
    discovery.apply = poller.apply  # from now on a change of the target set starts and stops poll loops
    discovery.start(sources_for(app[SETTINGS]))
    yield
    await discovery.stop()
    await poller.stop()


async def _backstop_ask(app: web.Application) -> AsyncIterator[None]:
    """The remediator's word for the liveness backstop (exporter/backstop_ask.py), asked while the app runs."""
    settings = app[SETTINGS]
    if settings.backstop is None or settings.remediator_url is None:
        yield
        return
    task = asyncio.create_task(backstop_ask.run(app[STORE], app[SESSION], str(settings.remediator_url),
                                                settings.remediator_token, settings.backstop, app[CLOCK]),
                               name="backstop-ask")
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _reload_on_sighup(app: web.Application) -> None:
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[object]] = set()

    def on_sighup() -> None:
        task = asyncio.create_task(reload_config(app), name="reload")
        tasks.add(task)  # a reference until done: the loop keeps only weak ones
        task.add_done_callback(tasks.discard)

    loop.add_signal_handler(signal.SIGHUP, on_sighup)


async def reload_config(app: web.Application) -> tuple[bool, str, list[str]]:
    """Re-read the config file and apply it: (ok, the error or "", restart-only keys changed). Never raises."""
    state, discovery = app[RELOAD], app[DISCOVERY]
    async with state.lock:  # two reloads at once would start a source twice
        try:
            new = load_for_reload(state)
        except ConfigError as exc:
            return False, str(exc), []
        old = discovery.settings
        poller = app.get(POLLER)
        if poller is not None:
            poller.reconfigure(new)
        app[STORE].history_seconds, app[STORE].poll_interval = new.history_seconds, new.poll_interval
        await discovery.reconfigure(new, sources_for(new) if poller is not None else [])
        runner = app.get(NODE_WATCH)
        if runner is not None:
            await runner.follow(new.node_watch_access())  # the same rules as the poller's from now on; started or stopped as needed
            if poller is not None:
                poller.node_source.cache = _watched_nodes(app)
        return True, "", record_success(state, app[CLOCK].wall(), old, new)


def _watched_nodes(app: web.Application) -> NodeCache | None:
    """The node cache while the node watch runs: without it no target is told anything about its node."""
    runner = app.get(NODE_WATCH)
    return runner.cache if runner is not None and runner.running else None


async def _node_watch(app: web.Application) -> AsyncIterator[None]:
    """The watch of the targets' nodes (GPU faults from node conditions and taints), while the config wants it."""
    runner = app[NODE_WATCH]
    await runner.follow(app[SETTINGS].node_watch_access())
    yield
    await runner.stop()


async def reload(request: web.Request) -> web.Response:
    # Guarded like drain: with a drain token configured, a reload needs it too (a reload can drop
    # every target); without one the exporter is trusted to its listen address, as drain is.
    if not _authorized(request):
        return web.json_response({"error": "missing or wrong bearer token"}, status=401,
                                 headers={"WWW-Authenticate": "Bearer"})
    ok, error, pending = await reload_config(request.app)
    if not ok:
        # 500 is what Prometheus answers for a refused reload; the old config keeps running.
        return web.json_response({"reloaded": False, "error": error}, status=500)
    return web.json_response({"reloaded": True, "targets": len(request.app[STORE].records), "needs_restart": pending})


async def show_discovery(request: web.Request) -> web.Response:
    """Each discovery source's health, target count and what it skipped, and the last reload's outcome."""
    discovery, state = request.app[DISCOVERY], request.app[RELOAD]
    shard = discovery.settings.shard
    return web.json_response({
        "sources": [asdict(status) for status in discovery.status.values()],
        "shard": shard.model_dump() if shard else None,
        "targets": len(request.app[STORE].records),
        "conflicts": discovery.conflicts,
        "reload": {"successful": state.successful, "last_success": state.last_success, "error": state.error},
    })


def _unknown(name: str) -> web.Response:
    return web.json_response({"error": f"unknown target '{name}'"}, status=404)


async def metrics(request: web.Request) -> web.StreamResponse:
    # The page is joined from each target's kept lines, the targets that changed since the last
    # scrape rendered again first (llm_vitals/exporter/page.py), and sent in pieces, handing the loop
    # back between them: at 5,000 targets it is ~120,000 lines, and a probe or a poll should not
    # wait for all of it. Each target is read once, first, so the page holds one reading of each
    # target whatever polls run in the gaps.
    now = request.app[CLOCK].now()
    store = request.app[STORE]
    response = web.StreamResponse(headers={"Content-Type": TEXT_CONTENT_TYPE})
    if request.transport is not None:
        # Let the page's pieces queue in the transport rather than each wait for the scraper to
        # read the one before (aiohttp awaits a drain past 64 KiB, and a 5,000-target page is
        # ~140 pieces). At most the page itself is held, as a whole-body answer would.
        request.transport.set_write_buffer_limits(high=64 * 2**20)
    await response.prepare(request)
    for piece in request.app[PAGES].pieces(list(store), now.mono, wall=now.wall):
        if piece:
            await response.write(piece)
        await asyncio.sleep(0)
    await response.write(generate_latest(request.app[REGISTRY]))
    await response.write_eof()
    return response


def _json(model: BaseModel) -> web.Response:
    return web.Response(text=model.model_dump_json(), content_type="application/json")


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "targets": len(request.app[STORE].records)})


async def list_targets(request: web.Request) -> web.Response:
    now = request.app[CLOCK].now()
    answer = TargetsAnswer(targets=[target_view(record, now.mono, now.wall) for record in request.app[STORE]],
                           generated_at=round(now.wall, 3))
    return _json(answer)


async def show_target(request: web.Request) -> web.Response:
    record = request.app[STORE].get(request.match_info["name"])
    if record is None:
        return _unknown(request.match_info["name"])
    now = request.app[CLOCK].now()
    return _json(target_view(record, now.mono, now.wall))


async def show_history(request: web.Request) -> web.Response:
    record = request.app[STORE].get(request.match_info["name"])
    if record is None:
        return _unknown(request.match_info["name"])
    return web.json_response({"points": [list(point) for point in record.history]})


async def probe(request: web.Request) -> web.Response:
    name, kind = request.match_info["name"], request.match_info["probe"]
    if kind not in PROBES:
        return web.json_response({"error": f"unknown probe '{kind}' (startup, ready, live)"}, status=404)
    record = request.app[STORE].get(name)
    if record is None:
        return _unknown(name)
    now = request.app[CLOCK].mono()
    verdict = record.verdict
    if kind == "startup":
        ok = is_started(verdict)
    elif kind == "ready":
        ok = record.ready(now)
    else:
        ok = record.live(now)
    body = {"target": name, "probe": kind, "ok": ok, "state": verdict.state, "reason": verdict.reason,
            "draining": record.draining, "gpu_fault": record.gpu_fault is not None}
    if kind == "live" and (backstop := record.backstop(now)) is not None:
        # Said in the answer: a 200 of a stuck server is the remediator's hold, not a healthy server.
        body["backstop"] = {"mode": backstop.mode, "reason": backstop.reason}
    return web.json_response(body, status=200 if ok else 503)


def _authorized(request: web.Request) -> bool:
    token = request.app[SETTINGS].drain_token
    if token is None:
        return True
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    expected = token.get_secret_value().encode()
    return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), expected)


async def _set_draining(request: web.Request, draining: bool) -> web.Response:
    if not _authorized(request):
        return web.json_response({"error": "missing or wrong bearer token"}, status=401,
                                 headers={"WWW-Authenticate": "Bearer"})
    record = request.app[STORE].get(request.match_info["name"])
    if record is None:
        return _unknown(request.match_info["name"])
    if record.set_draining(draining):
        log_event(log, "drain" if draining else "undrain", target=record.name)
    return web.json_response({"target": record.name, "draining": record.draining})


async def drain(request: web.Request) -> web.Response:
    return await _set_draining(request, True)


async def undrain(request: web.Request) -> web.Response:
    return await _set_draining(request, False)


async def release_gpu_fault(request: web.Request) -> web.Response:
    """A human says the target's GPU was reset or replaced: its held Xid faults end at its next poll.

    Guarded like drain. The poll stays the one writer of the target's GPU faults: the sources take
    the release and apply it at their next read; a level (a node condition, a failing DCGM health
    watch, NVML's recovery action, the fault file) is still read as it is.
    """
    if not _authorized(request):
        return web.json_response({"error": "missing or wrong bearer token"}, status=401,
                                 headers={"WWW-Authenticate": "Bearer"})
    record = request.app[STORE].get(request.match_info["name"])
    poller = request.app.get(POLLER)
    if record is None or poller is None:
        return _unknown(request.match_info["name"])
    released = poller.gpu_faults.release(record.settings)
    log_event(log, "gpu fault released by a human", logging.WARNING, target=record.name, sources=released,
              held=record.gpu_fault)
    return web.json_response({"target": record.name, "released": released, "applied": "at the next poll"})
