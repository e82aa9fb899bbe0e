"""The simulator's engine table: per `--engine`, the page renderer and the health routes it serves.

Every engine shares one continuous-batching core (llm_vitals/sim/engine.py, driven by driver.py) and
the admin/fault routes; an entry only says how that engine's server shows it: its `/metrics` page
(the same family names and types as the real pages in tests/fixtures/<engine>/), its health routes,
and its other routes (models, completions or inference). vLLM is the full entry; the engine helpers
add theirs as one module each (llm_vitals/sim/sim_llamacpp.py, sim_sglang.py, sim_triton.py, sim_tgi.py),
each defining `SIM_ENGINE`, and one line in `SIM_ENGINES` below.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from llm_vitals.sim import server, sim_llamacpp, sim_sglang, sim_tgi

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class SimEngine:
    """One simulated server kind."""

    name: str
    metrics: Handler  # renders this lifetime's page; reads the process's engine, never sleeps
    health: tuple[tuple[str, Handler], ...]  # (path, handler): the routes the exporter's table counts
    routes: Callable[[web.Application], None]  # everything else the server answers (models, completions)
    metrics_path: str = "/metrics"
    # url, model -> the exporter target keys (beyond name/url/engine) that watch this simulated server
    # (Triton: its page is on the server's own port, its canary a v2 infer): what the demo configures.
    target: Callable[[str, str], dict[str, Any]] = lambda url, model: {}


def _vllm_routes(app: web.Application) -> None:
    app.router.add_get("/version", server.version)
    app.router.add_post("/sleep", server.sleep)
    app.router.add_post("/wake_up", server.wake_up)
    app.router.add_get("/is_sleeping", server.is_sleeping)
    app.router.add_get("/load", server.load)
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/completions", server.completions)
    app.router.add_post("/v1/chat/completions", server.chat_completions)


VLLM = SimEngine(name="vllm", metrics=server.metrics, health=(("/health", server.health),), routes=_vllm_routes)

TGI = SimEngine(name="tgi", metrics=sim_tgi.metrics, health=(("/health", sim_tgi.health),), routes=sim_tgi.routes)


def _entries() -> tuple[SimEngine, ...]:
    # Imported here: sim_triton imports this module for SimEngine.
    from llm_vitals.sim import sim_triton

    return (VLLM, sim_llamacpp.sim_engine(), sim_sglang.sim_engine(), sim_triton.SIM_ENGINE, TGI)


SIM_ENGINES: dict[str, SimEngine] = {entry.name: entry for entry in _entries()}


def sim_engine(name: str) -> SimEngine:
    """The entry for `name`; ValueError naming the known ones otherwise."""
    try:
        return SIM_ENGINES[name]
    except KeyError:
        raise ValueError(f"the simulator has no engine {name!r} (known: {', '.join(SIM_ENGINES)})") from None


def add_engine_routes(app: web.Application, name: str) -> None:
    """Add engine `name`'s page, health and other routes to one lifetime's app."""
    entry = sim_engine(name)
    app.router.add_get(entry.metrics_path, entry.metrics)
    for path, handler in entry.health:
        app.router.add_get(path, handler)
    entry.routes(app)
