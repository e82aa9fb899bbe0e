"""`llm-vitals-sim --engine tgi`: the simulated engine shown as TGI's router shows itself.

Written from TGI's source, like the exporter's adapter (llm_vitals/exporter/engines/tgi.py names the files
and commit); no live TGI was ever compared. The page is rendered in metrics-exporter-prometheus
0.15's shape: counters without `_total`, counters then gauges then histograms, a blank line after
each family, and a family only once it was touched (a fresh server shows only
`tgi_batch_max_total_tokens`). tests/tgi_pages.py renders the test fixtures with `render` below.

- `tgi_batch_inference_count|success{method}` move every forward (prefill or decode pass);
  `tgi_request_success` and `tgi_request_generated_tokens` when a request ends;
  `tgi_request_count` when one arrives.
- `tgi_queue_size` is the waiting queue, `tgi_batch_current_size` the running batch.
- `/health`: 200 while the engine lives (TGI's check asks the shard for its device), 503 once dead.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from aiohttp import web

from llm_vitals.sim import completions
from llm_vitals.sim.engines import SimEngine
from llm_vitals.sim.process import PROCESS_KEY, ServerProcess, json_response

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
HELP = {
    "tgi_request_success": "Number of successful requests",
    "tgi_request_count": "Total number of requests",
    "tgi_batch_inference_count": "Inference calls per method (prefill or decode)",
    "tgi_batch_inference_success": "Number of successful inference calls per method (prefill or decode)",
    "tgi_batch_current_size": "Current batch size",
    "tgi_queue_size": "Current queue size",
    "tgi_batch_current_max_tokens": "Maximum tokens for the current batch",
    "tgi_request_generated_tokens": "Generated tokens per request",
}

# A histogram as rendered: (upper bound, cumulative count) per bucket, the sum and the count.
HistogramView = tuple[list[tuple[float, int]], float, int]


@dataclass
class TgiState:
    """What a TGI router has counted; None for a family never touched."""

    max_total_tokens: int
    requests: int | None = None
    success: int | None = None
    prefills: int | None = None
    decodes: int | None = None
    queue: float | None = None
    batch: float | None = None
    batch_max_tokens: float | None = None
    generated_tokens: HistogramView | None = None


def rust_f64(value: float) -> str:
    """Rust's `Display` for f64: the shortest round-trip digits, never an exponent, no `.0`."""
    text = format(Decimal(repr(float(value))), "f")
    return text[:-2] if text.endswith(".0") else text


def render(state: TgiState) -> str:
    """The page's text for `state`."""
    out: list[str] = []

    def family(name: str, kind: str, lines: list[str]) -> None:
        if name in HELP:
            out.append(f"# HELP {name} {HELP[name]}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(lines)
        out.append("")

    if state.requests is not None:
        family("tgi_request_count", "counter", [f"tgi_request_count {state.requests}"])
    if state.success is not None:
        family("tgi_request_success", "counter", [f"tgi_request_success {state.success}"])
    if state.prefills is not None:
        methods = [("prefill", state.prefills), ("decode", state.decodes or 0)]
        for name in ("tgi_batch_inference_count", "tgi_batch_inference_success"):
            family(name, "counter", [f'{name}{{method="{m}"}} {n}' for m, n in methods])
    if state.queue is not None:
        family("tgi_queue_size", "gauge", [f"tgi_queue_size {rust_f64(state.queue)}"])
    if state.batch is not None:
        family("tgi_batch_current_size", "gauge", [f"tgi_batch_current_size {rust_f64(state.batch)}"])
        family("tgi_batch_current_max_tokens", "gauge",
               [f"tgi_batch_current_max_tokens {rust_f64(state.batch_max_tokens or 0)}"])
    family("tgi_batch_max_total_tokens", "gauge", [f"tgi_batch_max_total_tokens {state.max_total_tokens}"])
    if state.generated_tokens is not None:
        buckets, total, count = state.generated_tokens
        name = "tgi_request_generated_tokens"
        lines = [f'{name}_bucket{{le="{rust_f64(bound)}"}} {n}' for bound, n in buckets]
        lines += [f'{name}_bucket{{le="+Inf"}} {count}', f"{name}_sum {rust_f64(total)}", f"{name}_count {count}"]
        family(name, "histogram", lines)
    return "\n".join(out) + ("\n" if out else "")


def state_of(process: ServerProcess) -> TgiState:
    """One lifetime's counters, as TGI's router would hold them."""
    engine, config = process.driver.engine, process.config
    stats = engine.stats
    state = TgiState(max_total_tokens=config.max_model_len)
    arrived = stats.finished + engine.num_running + engine.num_waiting
    if arrived == 0:
        return state  # nothing touched yet: only the start-up gauge
    histogram = stats.histograms["request_generation_tokens"]
    cumulative = [(bound, n) for bound, n in histogram.cumulative() if bound != float("inf")]
    state.requests, state.success = arrived, stats.finished
    state.prefills, state.decodes = stats.prefill_passes, stats.decode_passes
    state.queue, state.batch = float(engine.num_waiting), float(engine.num_running)
    state.batch_max_tokens = float(sum(r.prompt_tokens + r.max_tokens for r in engine.running))
    state.generated_tokens = (cumulative, float(histogram.sum), histogram.count) if stats.finished else None
    return state


async def metrics(request: web.Request) -> web.Response:
    body = render(state_of(request.app[PROCESS_KEY])).encode()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def health(request: web.Request) -> web.Response:
    """TGI's /health: 200 (empty) while the engine lives, 503 `{"error":"unhealthy"}` once dead."""
    if request.app[PROCESS_KEY].driver.dead:
        return json_response({"error": "unhealthy", "error_type": "healthcheck"}, status=503)
    return web.Response(status=200)


def routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", completions.models)
    app.router.add_post("/v1/completions", completions.completions)
    app.router.add_post("/v1/chat/completions", completions.chat_completions)


SIM_ENGINE = SimEngine(name="tgi", metrics=metrics, health=(("/health", health),), routes=routes)
