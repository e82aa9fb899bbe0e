"""`llm-vitals-sim --engine sglang`: the simulated engine shown as SGLang 0.5 shows itself.

The families, types and label names are those of the real SGLang 0.5.23 pages in
tests/fixtures/sglang/ (a test compares them); the subset served is what the exporter's adapter
reads plus the gauges a dashboard shows next to them. As on the real server:

- running counts decoding requests only: a request whose long prompt is still being chunked is
  neither running nor queued, and shows in `http_requests_active` and `num_used_tokens` instead;
- `realtime_tokens_total` and `cuda_graph_passes_total` move every step, by `mode`; the token
  totals and `num_requests_total` move only when a request ends;
- no process families and no start time (SGLang runs prometheus-client in multiprocess mode);
- `/health` and `/health_generate`: 200 while the engine steps, 503 at once while dead, and 503
  after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) while hung, as SGLang's own check of the scheduler.

Not simulated: the 40-step staleness of the scheduler's gauges (here they are live) and the
launcher's ~6 s of hanging before it exits after a scheduler death (`die` closes the port).
"""

from __future__ import annotations

import asyncio
from collections import Counter

from aiohttp import web

from llm_vitals.sim import completions
from llm_vitals.sim.engines import Handler, SimEngine
from llm_vitals.sim.process import PROCESS_KEY, ServerProcess, json_response

# SGLANG_HEALTH_CHECK_TIMEOUT's default: how long /health waits for a frozen scheduler.
HEALTH_TIMEOUT_S = 20.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ACTIVE_KEY: web.AppKey[Counter[str]] = web.AppKey("sglang_http_active", Counter)

_HELP = {
    "realtime_tokens_total": ("counter", "Total number of tokens processed (updated on each log interval). "
                                         "mode: prefill_compute, prefill_cache, decode."),
    "cuda_graph_passes_total": ("counter", "Total number of forward passes categorized by CUDA graph."),
    "http_requests_total": ("counter", "Total number of HTTP requests by endpoint and method"),
    "prompt_tokens_total": ("counter", "Number of prefill tokens processed."),
    "generation_tokens_total": ("counter", "Number of generation tokens processed."),
    "num_requests_total": ("counter", "Number of requests processed."),
    "http_requests_active": ("gauge", "Number of currently active HTTP requests"),
    "max_total_num_tokens": ("gauge", "Maximum total number of tokens in the KV cache pool."),
    "context_len": ("gauge", "Maximum context length."),
    "num_running_reqs": ("gauge", "The number of running requests."),
    "num_queue_reqs": ("gauge", "The number of requests in the waiting queue."),
    "gen_throughput": ("gauge", "The generation throughput (token/s)."),
    "token_usage": ("gauge", "The token usage."),
    "num_used_tokens": ("gauge", "The number of used tokens."),
}


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{key}="{value}"' for key, value in sorted(pairs.items())) + "}"


def render(process: ServerProcess, active: Counter[str]) -> bytes:
    """One lifetime's page, in the real page's layout: HELP, TYPE, then the samples of each family."""
    config, engine = process.config, process.driver.engine
    stats = engine.stats
    scheduler = {"engine_type": "unified", "model_name": config.model, "moe_ep_rank": "0", "pp_rank": "0",
                 "tp_rank": "0"}
    tokenizer = {"engine_type": "unified", "is_streaming": "false", "model_name": config.model}
    decoding = sum(1 for r in engine.running if not r.prefilling)
    used = sum(r.computed_prompt + r.generated for r in engine.running)
    histograms = stats.histograms
    http_totals: dict[tuple[str, str], float] = {}
    for (handler, method, _status), (count, _created) in process.http.requests.items():
        http_totals[(handler, method)] = http_totals.get((handler, method), 0.0) + count
    series: dict[str, list[tuple[dict[str, str], float]]] = {
        "realtime_tokens_total": [({**scheduler, "mode": "prefill_compute"}, stats.prefill_tokens_computed),
                                  ({**scheduler, "mode": "decode"}, stats.generation_tokens)],
        "cuda_graph_passes_total": [({**scheduler, "mode": "prefill_none"}, stats.prefill_passes),
                                    ({**scheduler, "mode": "decode_none"}, stats.decode_passes)],
        "http_requests_total": [({"endpoint": e, "method": m}, n) for (e, m), n in sorted(http_totals.items())],
        "prompt_tokens_total": [(tokenizer, histograms["request_prompt_tokens"].sum)],
        "generation_tokens_total": [(tokenizer, histograms["request_generation_tokens"].sum)],
        "num_requests_total": [(tokenizer, stats.finished)],
        "http_requests_active": [({"endpoint": e, "method": "GET" if e == "/metrics" else "POST"}, n)
                                 for e, n in sorted(active.items())],
        "max_total_num_tokens": [(scheduler, config.kv_cache_tokens)],
        "context_len": [(scheduler, config.max_model_len)],
        "num_running_reqs": [(scheduler, decoding)],
        "num_queue_reqs": [(scheduler, engine.num_waiting)],
        "gen_throughput": [(scheduler, config.tokens_per_second * decoding if decoding else 0.0)],
        "token_usage": [(scheduler, round(used / config.kv_cache_tokens, 2))],
        "num_used_tokens": [(scheduler, used)],
    }
    lines: list[str] = []
    for name, samples in series.items():
        kind, help_text = _HELP[name]
        # As prometheus-client's multiprocess mode writes them: a counter's HELP/TYPE keep `_total`.
        lines += [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} {kind}"]
        lines += [f"sglang:{name}{_labels(labels)} {float(value)!r}" for labels, value in samples]
    return ("\n".join(lines) + "\n").encode()


async def metrics(request: web.Request) -> web.Response:
    active = request.app[ACTIVE_KEY]
    active["/metrics"] += 1  # SGLang's own page counts the read serving it
    try:
        return web.Response(body=render(request.app[PROCESS_KEY], active), headers={"Content-Type": CONTENT_TYPE})
    finally:
        active["/metrics"] -= 1


async def health(request: web.Request) -> web.Response:
    """SGLang's /health = /health_generate: a 1-token generation through the scheduler, empty body."""
    driver = request.app[PROCESS_KEY].driver
    if driver.dead:
        return web.Response(status=503)
    waited = 0.0
    while driver.hung and waited < HEALTH_TIMEOUT_S:
        await asyncio.sleep(0.1)
        waited += 0.1
    return web.Response(status=503 if driver.hung or driver.dead else 200)


async def models(request: web.Request) -> web.Response:
    config = request.app[PROCESS_KEY].config
    return json_response({"object": "list", "data": [{
        "id": config.model, "object": "model", "created": int(request.app[PROCESS_KEY].start_time),
        "owned_by": "sglang", "root": config.model, "parent": None, "max_model_len": config.max_model_len,
    }]})


def _counted(endpoint: str, handler: Handler) -> Handler:
    """`handler`, shown in `http_requests_active{endpoint}` while it runs."""

    async def counted(request: web.Request) -> web.StreamResponse:
        active = request.app[ACTIVE_KEY]
        active[endpoint] += 1
        try:
            return await handler(request)
        finally:
            active[endpoint] -= 1

    return counted


def routes(app: web.Application) -> None:
    app[ACTIVE_KEY] = Counter()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", _counted("/v1/completions", completions.completions))
    app.router.add_post("/v1/chat/completions", _counted("/v1/chat/completions", completions.chat_completions))


SIM_ENGINE = SimEngine(name="sglang", metrics=metrics, health=(("/health", health), ("/health_generate", health)),
                       routes=routes)
