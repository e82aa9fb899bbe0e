"""The simulator's engine table: one `SimEngine` per `--engine` value.

Each engine module defines its own `SIM_ENGINE`; this module only gathers them (as the exporter's
llm_vitals/exporter/engines/table.py gathers each `ENGINE`), so an engine's owner edits its own
module and never this one.
"""

from __future__ import annotations

from aiohttp import web

from llm_vitals.sim.engines import SimEngine, llamacpp, sglang, tgi, triton, vllm

SIM_ENGINES: dict[str, SimEngine] = {
    entry.name: entry
    for entry in (vllm.SIM_ENGINE, llamacpp.SIM_ENGINE, sglang.SIM_ENGINE, triton.SIM_ENGINE, tgi.SIM_ENGINE)
}


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
