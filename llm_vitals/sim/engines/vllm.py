"""`llm-vitals-sim --engine vllm` (the default): the simulated engine shown as vLLM 0.32 shows itself.

The page is vLLM's own (llm_vitals/sim/metrics.py renders it from the engine's numbers, with the
families, types and labels of the real pages in tests/fixtures/vllm/). As on the real server:

- `/health`: 200 with an empty body while the engine lives, hung or not; 503 once it is known dead;
- sleep mode as `--enable-sleep-mode` (with VLLM_SERVER_DEV_MODE=1) serves it: `POST /sleep?level=1|2`
  (`&mode=keep`: the requests in flight stay in the engine, as the simulator does in every mode),
  `POST /wake_up`, `GET /is_sleeping`;
- the RL pause as VLLM_SERVER_DEV_MODE=1 serves it (vllm/entrypoints/rl/online/api_router.py):
  `POST /pause?mode=keep` (`{"status": "paused"}`; the simulator serves only `keep`), `POST /resume`
  (`{"status": "resumed"}`), `GET /is_paused` (`{"is_paused": bool}`, asked through the engine core:
  a hung engine does not answer it, as vLLM's EngineCore under SIGSTOP does not);
- `/version`, `/load`, and the OpenAI-compatible routes (llm_vitals/sim/completions.py).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from llm_vitals.sim import completions
from llm_vitals.sim.config import VLLM_VERSION
from llm_vitals.sim.engines import SimEngine
from llm_vitals.sim.metrics import CONTENT_TYPE, render
from llm_vitals.sim.openai_api import ApiError
from llm_vitals.sim.process import PROCESS_KEY, json_response


async def health(request: web.Request) -> web.Response:
    """200 with an empty body while the engine lives (even hung); 503 once it is known dead."""
    process = request.app[PROCESS_KEY]
    return web.Response(status=503 if process.driver.dead else 200)


# Sleep mode, as vLLM serves it with --enable-sleep-mode (and VLLM_SERVER_DEV_MODE=1).
async def sleep(request: web.Request) -> web.Response:
    process = request.app[PROCESS_KEY]
    level = request.query.get("level", "1")
    if level not in ("1", "2"):
        error = ApiError(400, f"level must be 1 or 2, not {level!r}", param="level")
        return json_response(error.body(), status=error.status)
    if request.query.get("mode", "abort") not in PAUSE_MODES:
        error = ApiError(400, f"mode must be one of {', '.join(PAUSE_MODES)}", param="mode")
        return json_response(error.body(), status=error.status)
    process.driver.set_sleep(int(level))
    return web.Response(status=200)


async def wake_up(request: web.Request) -> web.Response:
    request.app[PROCESS_KEY].driver.set_sleep(0)
    return web.Response(status=200)


async def is_sleeping(request: web.Request) -> web.Response:
    return json_response({"is_sleeping": request.app[PROCESS_KEY].driver.sleep_level > 0})


PAUSE_MODES = ("abort", "wait", "keep")


async def pause(request: web.Request) -> web.Response:
    mode = request.query.get("mode", "abort")
    if mode not in PAUSE_MODES:
        return json_response({"error": f"mode must be one of {', '.join(PAUSE_MODES)}, not {mode!r}"}, status=400)
    if mode != "keep":
        return json_response({"error": f"the simulator pauses with mode=keep only, not {mode!r}"}, status=400)
    request.app[PROCESS_KEY].driver.set_paused(True)
    return json_response({"status": "paused"})


async def resume(request: web.Request) -> web.Response:
    request.app[PROCESS_KEY].driver.set_paused(False)
    return json_response({"status": "resumed"})


async def is_paused(request: web.Request) -> web.Response:
    driver = request.app[PROCESS_KEY].driver
    while driver.hung:  # vLLM asks its EngineCore, which a hung engine never answers
        await asyncio.sleep(0.05)
    return json_response({"is_paused": driver.paused})


async def version(request: web.Request) -> web.Response:
    return json_response({"version": VLLM_VERSION})


async def load(request: web.Request) -> web.Response:
    return json_response({"server_load": 0})


async def metrics(request: web.Request) -> web.Response:
    process = request.app[PROCESS_KEY]
    return web.Response(body=render(process.collector), headers={"Content-Type": CONTENT_TYPE})


def routes(app: web.Application) -> None:
    app.router.add_get("/version", version)
    app.router.add_post("/sleep", sleep)
    app.router.add_post("/wake_up", wake_up)
    app.router.add_get("/is_sleeping", is_sleeping)
    app.router.add_post("/pause", pause)
    app.router.add_post("/resume", resume)
    app.router.add_get("/is_paused", is_paused)
    app.router.add_get("/load", load)
    app.router.add_get("/v1/models", completions.models)
    app.router.add_post("/v1/completions", completions.completions)
    app.router.add_post("/v1/chat/completions", completions.chat_completions)


SIM_ENGINE = SimEngine(name="vllm", metrics=metrics, health=(("/health", health),), routes=routes)
