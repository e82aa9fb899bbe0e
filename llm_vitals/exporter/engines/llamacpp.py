"""The llama.cpp adapter: llama.cpp's native `llama-server --metrics` (not llama-cpp-python's server).

A sample of the page (real, llama.cpp 0c1e570 on CPU: 2 slots busy, 1 request deferred; the full
pages are in tests/fixtures/llamacpp/). No labels, and every family is one sample:

    # HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
    # TYPE llamacpp:prompt_tokens_total counter
    llamacpp:prompt_tokens_total 36
    llamacpp:tokens_predicted_total 64
    # HELP llamacpp:n_decode_total Total number of llama_decode() calls, excluding speculative ...
    # TYPE llamacpp:n_decode_total counter
    llamacpp:n_decode_total 451
    llamacpp:predicted_tokens_seconds 0
    # TYPE llamacpp:requests_processing gauge
    llamacpp:requests_processing 2
    # TYPE llamacpp:requests_deferred gauge
    llamacpp:requests_deferred 1

and the response carries the header `Process-Start-Time-Unix: 1571301719`.

- **Pending**: `requests_processing` (busy slots) + `requests_deferred` (queued for a slot).
- **Progress**: `n_decode_total`, one per `llama_decode()` call, i.e. per engine step for all slots
  together: the live signal (451 -> 709 in 6 s while busy). `tokens_predicted_total` and
  `prompt_tokens_total` move only when a request ends (they stayed at 64 through ~700 steps), and
  the throughput gauges read 0 while requests run; they are read, but never relied on.
- **Prefill and stuck_after**: a prompt is fed in batches of `-b` tokens (default 2048), one decode
  call each, so during a long prefill `n_decode_total` moves once per batch (a 2801-token prompt on
  the 2-core box, -b 2048: it stood still for 13 s between its two batches, and the token counters
  for the whole 20 s). `stuck_after` must therefore exceed the time of
  one `-b` batch at the server's prefill speed, with room for load: seconds per batch =
  `-b` / prompt tokens per second (`prompt_per_second` in any /completion answer's `timings`;
  ~140 for the tiny test model on 2 cores, so -b 2048 needs stuck_after of 30 s or more there; a
  GPU prefills thousands per second). Or lower `-b`. llama.cpp has no chunk counter to read instead.
- **Restart**: every counter resets to 0, and the `Process-Start-Time-Unix` header changes. Its
  value is `ggml_time_us()` at start, **microseconds on the monotonic clock since boot**, not Unix
  time: it is the table's opaque restart token, compared for inequality only, never a start time.
- **Hung engine**: the engine loop answers /metrics itself (a METRICS task on its queue), except
  during a decode, when a worker thread does. So a loop wedged outside a decode, or a stopped
  process, accepts the connection and never answers /metrics, while a loop wedged inside a decode
  keeps /metrics fast with frozen counters. The table's fact `metrics_unanswered_is_stuck` makes the
  first `stuck` (reason `metrics_unanswered`); the second is ordinary no-progress `stuck`.
- **HTTP threads** (issue 38): every in-flight request holds one of llama-server's HTTP threads
  (`--threads-http`) until it ends. Where that pool is fixed (before cpp-httplib's pool grew on
  demand, yhirose/cpp-httplib#2368; 0c1e570 vendors 0.58 and adds up to 1024 threads), a new connection
  waits behind the clients once they hold them all, `/metrics` and the second probe with it. So a
  server last seen saturated (busy slots and requests deferred) is judged by `stuck_after` alone
  (verdict.saturated), and the poller keeps its connection, and the thread it holds, open between
  polls (`keep_alive` below, exporter/keep_warm.py).
- **/health**: 503 `{"error":{"message":"Loading model",...}}` while loading, then 200 `{"status":"ok"}`,
  also with the engine loop frozen: it proves the process, never progress.
"""

from __future__ import annotations

from llm_vitals.exporter.engines import Engine, EngineFacts, PageError, PageReading
from llm_vitals.exporter.engines.scan import Scanner, snapshot_of, text_parse, total

PROCESSING = "llamacpp:requests_processing"
DEFERRED = "llamacpp:requests_deferred"
DECODES = "llamacpp:n_decode_total"
TOKENS_PREDICTED = "llamacpp:tokens_predicted_total"
PROMPT_TOKENS = "llamacpp:prompt_tokens_total"
RESTART_HEADER = "Process-Start-Time-Unix"
# Pace (llm_vitals/exporter/pace.py): seconds spent generating and the tokens generated, both moved
# when a request ends; their quotient is seconds per token per slot (the gray RECIPE: 5.5x cleanly
# for a server given a fifth of a core, where plain tokens per second hid half of it).
PREDICTED_SECONDS = "llamacpp:tokens_predicted_seconds_total"

_SCANNER = Scanner((PROCESSING, DEFERRED, DECODES, TOKENS_PREDICTED, PROMPT_TOKENS, PREDICTED_SECONDS))
# Without its live step counter a busy llama.cpp shows progress only when a request ends: a long
# generation would read stuck. Such a page is refused rather than misjudged.
_REQUIRED = (PROCESSING, DEFERRED, DECODES)


def parse_text(text: str) -> PageReading:
    """Turn a llama-server `/metrics` body into a PageReading; raises PageError."""
    found = _SCANNER.scan(text)
    for name in _REQUIRED:
        if name not in found:
            raise PageError("bad_metrics", f"no {name} on the page (not llama-server --metrics, or one older than n_decode_total?)")
    seconds, tokens = total(found, PREDICTED_SECONDS), total(found, TOKENS_PREDICTED)
    return snapshot_of(found, running=PROCESSING, waiting=DEFERRED, steps=DECODES, generation_tokens=TOKENS_PREDICTED,
                       prompt_tokens=PROMPT_TOKENS,
                       pace=(seconds, tokens) if seconds is not None and tokens is not None else None)


# The table adds the header's restart token.
parse = text_parse(parse_text)


ENGINE = Engine(
    name="llamacpp",
    parse=parse,
    signature="llamacpp:",
    # 503 while the model loads; with the engine loop frozen it still answers 200.
    health_paths=("/health",),
    restart_header=RESTART_HEADER,
    # cpp-httplib closes a connection idle for 5 s (CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND; llama-server
    # keeps it), less than the shipped poll plus jitter, and serves a connection on one pool thread.
    keep_alive=5.0,
    # The engine loop serves /metrics itself: accepted and never answered while work was pending is stuck.
    facts=EngineFacts(metrics_unanswered_is_stuck=True),
)
