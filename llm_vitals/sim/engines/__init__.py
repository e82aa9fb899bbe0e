"""The simulator's engines: how each server kind shows the one simulated engine.

Every engine shares one continuous-batching core (llm_vitals/sim/engine.py, driven by driver.py)
and the admin routes (llm_vitals/sim/admin.py); an engine only says how its server shows that core:
its `/metrics` page (the same family names and types as the real pages in tests/fixtures/<engine>/),
its health routes, and its other routes (models, completions or inference). As in the exporter's
llm_vitals/exporter/engines/, there is one module per engine, each defining `SIM_ENGINE`, a
`SimEngine` entry; `table.py` gathers them into `SIM_ENGINES`, what `llm-vitals-sim --engine` offers.

    vllm.py      vLLM 0.32 (the default)
    llamacpp.py  llama.cpp's llama-server --metrics
    sglang.py    SGLang 0.5
    triton.py    NVIDIA Triton 2.51 (v2 health and infer)
    tgi.py       Hugging Face TGI, from its source
    table.py     SIM_ENGINES, gathered from each module's SIM_ENGINE
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _no_target_keys(url: str, model: str) -> dict[str, Any]:
    return {}


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
    target: Callable[[str, str], dict[str, Any]] = _no_target_keys
