"""The TGI adapter (Hugging Face text-generation-inference), written from TGI's source: NEVER checked
against a live TGI, since none runs on this machine kind (only its clients are on PyPI).

Source read: github.com/huggingface/text-generation-inference at commit
db931fcf42da018a3657580c64bf2720f167f9ab (2026-01-08): the metric names and descriptions in
`router/src/server.rs` (`describe_*` and `PrometheusBuilder` with its bucket matchers), where they
move in `backends/v3/src/backend.rs` and `backends/v3/src/queue.rs`, `router/src/server.rs` and
`router/src/validation.rs`; the page is rendered by metrics-exporter-prometheus 0.15
(`src/recorder.rs` `render`, `src/formatting.rs`): counters keep their name (no `_total`), the
families come counters first, then gauges, then histograms, each followed by a blank line, and a
family appears only once it was first touched. A sample of a busy page as that code renders it:

    # HELP tgi_batch_inference_count Inference calls per method (prefill or decode)
    # TYPE tgi_batch_inference_count counter
    tgi_batch_inference_count{method="prefill"} 4
    tgi_batch_inference_count{method="decode"} 731

    # HELP tgi_request_success Number of successful requests
    # TYPE tgi_request_success counter
    tgi_request_success 1

    # HELP tgi_queue_size Current queue size
    # TYPE tgi_queue_size gauge
    tgi_queue_size 1
    # HELP tgi_batch_current_size Current batch size
    # TYPE tgi_batch_current_size gauge
    tgi_batch_current_size 2

    # TYPE tgi_request_generated_tokens histogram
    tgi_request_generated_tokens_bucket{le="20.48"} 0
    tgi_request_generated_tokens_sum 64
    tgi_request_generated_tokens_count 1

- Pending: `tgi_queue_size` (waiting, set by the queue) + `tgi_batch_current_size` (running, set at
  each batch and back to 0 when the batch empties). A gauge never touched is absent: on a page that
  is TGI's (it has some `tgi_` family) an absent one reads 0, as the recorder would have it.
- Progress: the step counter `tgi_batch_inference_success` summed over `method` (one per prefill or
  decode forward that returned), and `tgi_batch_inference_count` (one per forward started), both
  live; `tgi_request_success` and `tgi_request_generated_tokens_sum` move only when a request ends.
  Not progress: `tgi_request_count`, `tgi_request_input_length` and `tgi_request_failure{err=...}`
  move when a request *arrives* (or is refused), so a hung server with steady traffic would never
  read stuck on them.
- Restart: no start-time metric (the recorder is built without process metrics), so a counter that
  falls is the restart. A new process has no counter until its first request (the canary's), so
  the restart is counted at that read, once.
- Health: `/health` answers 503 `{"error":"unhealthy"}` when the backend's health check fails (a
  device check while healthy, a real tiny prefill once unhealthy). Its `/metrics` is served on the
  API port as well as on `--prometheus-port`; `/v1/models` and `/v1/completions` serve the canary.
"""

from __future__ import annotations

from llm_vitals.exporter.engines import Engine, PageError, PageReading, signals
from llm_vitals.exporter.engines.scan import Scanner, snapshot_of, text_parse, total

QUEUE = "tgi_queue_size"
BATCH = "tgi_batch_current_size"
STEPS = "tgi_batch_inference_success"
FORWARDS = "tgi_batch_inference_count"
FINISHED = "tgi_request_success"
GENERATED_TOKENS = "tgi_request_generated_tokens_sum"
STATIC = "tgi_batch_max_total_tokens"  # set once at start-up, after the warmup

SCANNER = Scanner((QUEUE, BATCH, STEPS, FORWARDS, FINISHED, GENERATED_TOKENS, STATIC))


def parse_text(text: str) -> PageReading:
    """Turn a TGI router `/metrics` page into a PageReading; raises PageError."""
    found = SCANNER.scan(text)
    if not found and "tgi_" not in text:
        raise PageError("bad_metrics", f"no {QUEUE} nor any tgi_ family on the page (not a TGI /metrics page?)")

    forwards = total(found, FORWARDS)
    return snapshot_of(found, running=BATCH, waiting=QUEUE, steps=STEPS, generation_tokens=GENERATED_TOKENS,
                       finished=FINISHED, more_counters=signals(forwards_started=forwards))


parse = text_parse(parse_text)


ENGINE = Engine(name="tgi", parse=parse, signature="tgi_", health_paths=("/health",))
