"""A simulated llama.cpp `llama-server --metrics`: its page, header, health route and its hang.

The same continuous-batching core as every simulated engine, shown as llama.cpp 0c1e570 shows it
(tests/fixtures/llamacpp/ has the real pages; a test holds this page to their names, types and
order). A sample:

    # HELP llamacpp:n_decode_total Total number of llama_decode() calls, excluding speculative ...
    # TYPE llamacpp:n_decode_total counter
    llamacpp:n_decode_total 709
    # HELP llamacpp:requests_processing Number of requests processing
    # TYPE llamacpp:requests_processing gauge
    llamacpp:requests_processing 2

with `Process-Start-Time-Unix: <monotonic microseconds at this lifetime's start>` on the answer.
As on the real server:
- `requests_processing` is the requests in slots (running), `requests_deferred` the queued ones;
- `n_decode_total` counts every engine step (a prompt chunk is a step, as a `-b` batch is one
  llama_decode call); the token counters and their seconds move only when a request ends;
- `/health` is 200 `{"status":"ok"}` while the process lives, hung or not;
- the `hang` fault is llama.cpp's engine loop wedged outside a decode: /metrics (answered by the
  loop's own task queue) accepts the connection and never answers, while /health still answers;
  `freeze` is the loop wedged inside a decode: /metrics answers at once, its counters frozen.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from llm_vitals.sim import completions
from llm_vitals.sim.engine import Engine
from llm_vitals.sim.engines import SimEngine
from llm_vitals.sim.openai_api import now_seconds
from llm_vitals.sim.process import PROCESS_KEY, json_response

START_US: web.AppKey[int] = web.AppKey("llamacpp_start_us")
MAX_TOKENS_SEEN: web.AppKey[list[int]] = web.AppKey("llamacpp_n_tokens_max")
CONTENT_TYPE = "text/plain; version=0.0.4"
# (name, type, help) in the real page's order.
FAMILIES = (
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "counter", "Total time spent processing prompts"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens"),
    ("n_decode_total", "counter",
     "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding"),
    ("n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "counter", "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding verification steps"),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s"),
    ("requests_processing", "gauge", "Number of requests processing"),
    ("requests_deferred", "gauge", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call"),
)  # fmt: skip


def values(engine: Engine, n_tokens_max: int) -> dict[str, float]:
    """The page's numbers from the engine's plain ones: tokens and their seconds counted at request end."""
    h = engine.stats.histograms
    prompt, predicted = h["request_prompt_tokens"], h["request_generation_tokens"]
    prompt_s, predicted_s = h["request_prefill_time_seconds"].sum, h["request_decode_time_seconds"].sum
    return {
        "prompt_tokens_total": prompt.sum,
        "prompt_tokens_cached_total": 0,
        "prompt_seconds_total": prompt_s,
        "tokens_predicted_total": predicted.sum,
        "tokens_predicted_seconds_total": predicted_s,
        "n_decode_total": engine.steps,
        "n_tokens_max": n_tokens_max,
        "spec_decode_num_draft_tokens_total": 0,
        "spec_decode_num_accepted_tokens_total": 0,
        "spec_decode_num_drafts_total": 0,
        "prompt_tokens_seconds": prompt.sum / prompt_s if prompt_s > 0 else 0,
        "predicted_tokens_seconds": predicted.sum / predicted_s if predicted_s > 0 else 0,
        "requests_processing": engine.num_running,
        "requests_deferred": engine.num_waiting,
        "n_busy_slots_per_decode": engine.num_running,
    }


def render(numbers: dict[str, float]) -> bytes:
    """The page text: HELP, TYPE and one unlabelled sample per family, as llama-server writes it."""
    lines = []
    for name, kind, text in FAMILIES:
        value = numbers[name]
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        lines += [f"# HELP llamacpp:{name} {text}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {shown}"]
    return ("\n".join(lines) + "\n").encode()


async def metrics(request: web.Request) -> web.StreamResponse:
    process = request.app[PROCESS_KEY]
    driver = process.driver
    # The hang: the loop that would answer this read never takes it; the client's timeout ends it
    # (aiohttp cancels the handler when the client goes away).
    while driver.hung and not driver.in_step and not driver.dead:
        await asyncio.sleep(0.05)
    engine = driver.engine
    seen = request.app[MAX_TOKENS_SEEN]
    seen[0] = max([seen[0], *(r.prompt_tokens + r.generated for r in engine.running)])
    return web.Response(body=render(values(engine, seen[0])), headers={
        "Content-Type": CONTENT_TYPE, "Process-Start-Time-Unix": str(request.app[START_US])})


async def health(request: web.Request) -> web.Response:
    process = request.app[PROCESS_KEY]
    if process.driver.dead:  # the moment between the fault and the port closing
        return json_response({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}},
                             status=503)
    return json_response({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    """`/v1/models` as llama-server lists its `-a` alias (the canary's model lookup reads `data[0].id`)."""
    config = request.app[PROCESS_KEY].config
    return json_response({"object": "list", "data": [{
        "id": config.model, "aliases": [config.model], "tags": [], "object": "model", "created": now_seconds(),
        "owned_by": "llamacpp", "meta": {"n_ctx": config.max_model_len}}]})  # fmt: skip


def routes(app: web.Application) -> None:
    # One lifetime's own state: its start token (ggml_time_us() at start on the real server:
    # monotonic microseconds, changing on every start) and its longest sequence.
    app[START_US] = time.monotonic_ns() // 1000
    app[MAX_TOKENS_SEEN] = [0]
    app.router.add_get("/v1/models", models)
    app.router.add_get("/models", models)
    app.router.add_post("/v1/completions", completions.completions)
    app.router.add_post("/v1/chat/completions", completions.chat_completions)


SIM_ENGINE = SimEngine(name="llamacpp", metrics=metrics, health=(("/health", health),), routes=routes)
