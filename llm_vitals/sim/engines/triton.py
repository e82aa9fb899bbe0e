"""The simulator's Triton: Triton 2.51's metrics page shape, its v2 health routes and a KServe v2 infer route.

Same continuous-batching core as the vLLM simulation (a `max_num_seqs`-slot engine and a queue);
only what the server shows differs, as on a real Triton (tests/fixtures/triton/):

    # HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
    # TYPE nv_inference_pending_request_count gauge
    nv_inference_pending_request_count{model="tiny",version="1"} 3

- only *queued* requests show (`nv_inference_pending_request_count`); running ones show nowhere;
- the counters (`nv_inference_request_success`, `_exec_count`, `_compute_infer_duration_us`, ...)
  move only when a request completes; there is no start-time metric (a restart resets them);
- `/v2/health/live`, `/v2/health/ready`, `/v2/models/<model>/ready`: 200, 503 once the engine died;
  no `/v1/models`. `POST /v2/models/<model>/infer` takes `{"inputs": [{"name": "max_tokens",
  "shape": [1, 1], "datatype": "INT32", "data": [N]}]}` and "generates" N tokens.

The faults are the simulator's own (`hang`: HTTP and this page answer, nothing completes).
The page is served on the server's own port (a real Triton uses a third one, 8002): point the
exporter's `metrics_url` at `<url>/metrics`.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from aiohttp import web

from llm_vitals.sim.engine import Engine, SimRequest
from llm_vitals.sim.engines import SimEngine
from llm_vitals.sim.process import PROCESS_KEY, json_response

CONTENT_TYPE = "text/plain; charset=utf-8"
VERSION = "2.51.0"
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
# (family, type, HELP) in the real page's order; the text is Triton 2.51's own.
FAMILIES = (
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)"),
    ("nv_inference_request_duration_us", "counter",
     "Cumulative inference request duration in microseconds (includes cached requests)"),
    ("nv_inference_queue_duration_us", "counter",
     "Cumulative inference queuing duration in microseconds (includes cached requests)"),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
    ("nv_inference_pending_request_count", "gauge",
     "Instantaneous number of pending requests awaiting execution per-model."),
    ("nv_pinned_memory_pool_total_bytes", "gauge", "Pinned memory pool total memory size, in bytes"),
    ("nv_pinned_memory_pool_used_bytes", "gauge", "Pinned memory pool used memory size, in bytes"),
    ("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]"),
    ("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes"),
    ("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes"),
)


def page_values(engine: Engine) -> dict[str, float]:
    """Each family's value for the one model, from the engine's plain numbers (the page holds no more)."""
    stats = engine.stats
    failed = stats.request_success.get("abort", 0) + stats.request_success.get("error", 0)
    succeeded = stats.finished - failed
    e2e = stats.histograms["e2e_request_latency_seconds"].sum
    queued = stats.histograms["request_queue_time_seconds"].sum
    return {
        "nv_inference_request_success": succeeded,
        "nv_inference_count": succeeded,
        "nv_inference_exec_count": succeeded,
        "nv_inference_request_duration_us": int(e2e * 1e6),
        "nv_inference_queue_duration_us": int(queued * 1e6),
        "nv_inference_compute_input_duration_us": 17 * succeeded,
        "nv_inference_compute_infer_duration_us": int((e2e - queued) * 1e6),
        "nv_inference_compute_output_duration_us": 9 * succeeded,
        "nv_inference_pending_request_count": engine.num_waiting,
        "nv_pinned_memory_pool_total_bytes": 268435456,
        "nv_pinned_memory_pool_used_bytes": 0,
        "nv_cpu_utilization": 0.9 if engine.has_work else 0.02,
        "nv_cpu_memory_total_bytes": 25275990016,
        "nv_cpu_memory_used_bytes": 4755587072,
    }


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def render(engine: Engine, model: str) -> str:
    """The page, in Triton's text: integers as integers, per-model labels sorted as Triton writes them."""
    values = page_values(engine)
    failures = engine.stats.request_success.get("abort", 0), engine.stats.request_success.get("error", 0)
    lines: list[str] = []
    for name, kind, help_text in FAMILIES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        if name == "nv_inference_request_failure":
            by_reason = {"REJECTED": 0, "CANCELED": failures[0], "BACKEND": failures[1], "OTHER": 0}
            lines += [f'{name}{{model="{model}",reason="{r}",version="1"}} {by_reason[r]}' for r in FAILURE_REASONS]
        elif name.startswith("nv_inference_"):
            lines.append(f'{name}{{model="{model}",version="1"}} {_number(values[name])}')
        else:
            lines.append(f"{name} {_number(values[name])}")
    return "\n".join(lines) + "\n"


async def metrics(request: web.Request) -> web.Response:
    process = request.app[PROCESS_KEY]
    return web.Response(text=render(process.driver.engine, process.config.model), headers={"Content-Type": CONTENT_TYPE})


def _alive(request: web.Request) -> web.Response:
    process = request.app[PROCESS_KEY]
    return web.Response(status=503 if process.driver.dead else 200)


async def health(request: web.Request) -> web.Response:
    return _alive(request)


async def model_ready(request: web.Request) -> web.Response:
    process = request.app[PROCESS_KEY]
    if request.match_info["model"] != process.config.model:
        return _error(404, f"Request for unknown model: '{request.match_info['model']}' is not found")
    return _alive(request)


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=json.dumps({"error": message}), content_type="application/json")


def tokens_asked(body: object) -> int | None:
    """N from a KServe v2 infer body `{"inputs": [{"name": "max_tokens", ..., "data": [N]}]}`; None when malformed."""
    inputs = body.get("inputs") if isinstance(body, dict) else None
    if not isinstance(inputs, list) or not inputs or not isinstance(inputs[0], dict):
        return None
    data = inputs[0].get("data")
    value = data[0] if isinstance(data, list) and data else None
    while isinstance(value, list) and value:  # data may be nested by shape
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


async def infer(request: web.Request) -> web.Response:
    process = request.app[PROCESS_KEY]
    model = request.match_info["model"]
    if model != process.config.model:
        return _error(400, f"Request for unknown model: '{model}' is not found")
    try:
        body = json.loads(await request.read())
    except (UnicodeDecodeError, ValueError):
        return _error(400, "failed to parse the request JSON buffer")
    n = tokens_asked(body)
    if n is None or n + 1 > process.config.max_model_len:
        return _error(400, "expected input 'max_tokens' as [[N]] with 1 <= N < max_model_len")
    sim = SimRequest(request_id=f"infer-{secrets.token_hex(8)}", prompt_tokens=1, max_tokens=n)
    channel = process.driver.submit(sim)
    try:
        while True:
            event = await channel.get()
            if event.error is not None:
                return _error(500, event.error)
            if event.finished_reason is not None:
                return json_response({
                    "model_name": model, "model_version": "1",
                    "outputs": [{"name": "generated", "datatype": "INT32", "shape": [1, 1], "data": [n]}],
                })
    finally:
        process.driver.abort(sim.request_id)


async def server_metadata(request: web.Request) -> web.Response:
    return json_response({"name": "triton", "version": VERSION, "extensions": ["classification", "sequence",
                                 "model_repository", "schedule_policy", "model_configuration", "statistics"]})


def _routes(app: web.Application) -> None:
    app.router.add_get("/v2", server_metadata)
    app.router.add_get("/v2/models/{model}/ready", model_ready)
    app.router.add_post("/v2/models/{model}/infer", infer)


def exporter_target(url: str, model: str) -> dict[str, Any]:
    """How an exporter watches this simulated Triton: the page on its own port, a 1-token v2 infer canary."""
    canary = {"inputs": [{"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}
    return {"metrics_url": f"{url}/metrics", "model": model, "canary": {"request": canary}}


SIM_ENGINE = SimEngine(
    name="triton",
    metrics=metrics,
    health=(("/v2/health/live", health), ("/v2/health/ready", health)),
    routes=_routes,
    target=exporter_target,
)
