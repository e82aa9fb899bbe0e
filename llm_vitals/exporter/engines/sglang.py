"""The SGLang adapter: a targeted scan of SGLang's `/metrics` (0.5.x, `--enable-metrics`).

Read from real pages of SGLang 0.5.23 (tests/fixtures/sglang/; the recipe ran it on CPU torch with
an import-only stand-in for its CPU kernel library). A sample of a busy page (labels shortened:
scheduler series carry `engine_type,model_name,moe_ep_rank,pp_rank,tp_rank`):

    # TYPE sglang:num_running_reqs gauge
    sglang:num_running_reqs{engine_type="unified",model_name="tiny-llama",tp_rank="0",...} 2.0
    sglang:num_queue_reqs{engine_type="unified",model_name="tiny-llama",tp_rank="0",...} 1.0
    sglang:num_used_tokens{engine_type="unified",model_name="tiny-llama",tp_rank="0",...} 4044.0
    # TYPE sglang:realtime_tokens_total counter
    sglang:realtime_tokens_total{mode="prefill_compute",...} 25.0
    sglang:realtime_tokens_total{mode="decode",...} 4085.0
    # TYPE sglang:cuda_graph_passes_total counter
    sglang:cuda_graph_passes_total{mode="decode_none",...} 2095.0
    sglang:generation_tokens_total{engine_type="unified",is_streaming="false",model_name="tiny-llama"} 24.0
    sglang:num_requests_total{engine_type="unified",is_streaming="false",model_name="tiny-llama"} 2.0
    sglang:http_requests_active{endpoint="/generate",method="POST"} 3.0

- Pending: `num_running_reqs` + `num_queue_reqs`, summed over ranks. The scheduler refreshes them
  at its log points (every 40 decode steps), so they can lag by that much.
- Progress, every engine step: `realtime_tokens_total` and the step counter `cuda_graph_passes_total`,
  each summed over `mode` (on CPU the mode is `decode_none`, on a GPU `decode_cuda_graph`; a long
  prompt adds `prefill_compute` once per chunk). The token totals and `num_requests_total` move only
  when a request ends. `num_used_tokens` moving is progress too (it grows by a chunk per prefill step).
- Busy while both gauges read 0: during a long chunked prefill SGLang shows running 0 and queued 0.
  The sign of that work read here is `http_requests_active` of the generation routes (it read 1
  throughout a real 12862-token prefill): above 0, the target reads busy, never idle, and gets no
  canary (it would queue behind the prompt). `num_used_tokens` is no such sign: it is refreshed
  only at the scheduler's log points, so an idle server keeps its last value (4 and 12 on the real
  idle pages). `stuck_after` must cover one chunk (`--chunked-prefill-size`, 4096 tokens by
  default; ~1 s on the recipe's quiet box, 35-75 s on a box loaded 10 times over), since nothing
  moves within one.
- Restart: there is no start-time metric (prometheus-client multiprocess mode has no process
  collector), so a counter that falls is the restart.
- Health: no route is read. `/health` (= `/health_generate`) submits a 1-token generation through
  the scheduler, and turns 503 only after 20 s of a frozen scheduler (SGLANG_HEALTH_CHECK_TIMEOUT),
  far past `health_timeout`; the frozen counters already read `stuck` then (HTTP alive, engine hung),
  which a 503 read as `down` would only blur. A killed scheduler takes the whole server down within
  ~6 s (connection refused): `down`.
- Deferred work (prefill/decode disaggregation): requests in the transfer queues wait on the peer
  server, not on this one: `num_prefill_bootstrap_queue_reqs` (the handshake with a decode peer),
  `num_prefill_inflight_queue_reqs` (KV on its way to it), `num_decode_prealloc_queue_reqs` (the
  handshake with a prefill peer, and room for its KV) and `num_decode_transfer_queue_reqs` (KV on
  its way from it), `num_decode_host_receive_queue_reqs` (0.5.23: KV received into host memory);
  older releases name the prefill side's `num_prefill_prealloc_queue_reqs` and
  `num_prefill_infight_queue_reqs` (sic). They are pending work, apart from `num_queue_reqs`; with nothing running and
  nothing moving they read `waiting_on_peer`, which no restart of this server fixes. 0 on a server
  that is not disaggregated (the real pages).
- Paused on purpose: `POST /pause_generation` (mode `abort`, `in_place` or `retract`, for a weight
  sync) stops the scheduler's loop before it batches, so the page's gauges freeze with the requests
  still counted; `GET /ready` answers 503 from then until `POST /continue_generation` (0.5.23's
  `TokenizerManager.is_ready`: `not is_pause and is_healthy()`; `/ping` stays 200 "so an intentional
  pause does not get the instance replaced"). The HTTP process answers it from a flag, so a hung
  scheduler still reads 200 there. It is the engine table's pause route: asked only as the verdict
  nears stuck, 503 is paused (it is also 503 while starting or shutting down, when nothing is owed
  or the process is going anyway), 200 is not. `num_paused_reqs` counts requests an async weight
  sync paused: owed work, `paused` with nothing moving (0.5.23 declares it and nothing in its source
  raises it above 0; read for the releases that do).
- Units: with `--dp-size` > 1 the scheduler series carry a `dp_rank` label, one scheduler each.
  Each rank can hang alone, so each is a `Unit` judged on its own steps and tokens; a page
  without `dp_rank` (or with one) skips that work.
- Loading: `/metrics` already answers 200 (24 static families) before the scheduler reports; no
  `num_running_reqs` yet reads `down` with a detail saying so.
"""

from __future__ import annotations

from llm_vitals.exporter.engines import Engine, EngineFacts, PageError, PageReading, Unit, signals
from llm_vitals.exporter.engines.scan import Sample, Scanner, by_label, finite_sum, snapshot_of, text_parse, total

RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
USED_TOKENS = "sglang:num_used_tokens"
REALTIME_TOKENS = "sglang:realtime_tokens_total"
STEPS = "sglang:cuda_graph_passes_total"
GENERATION_TOKENS = "sglang:generation_tokens_total"
PROMPT_TOKENS = "sglang:prompt_tokens_total"
FINISHED = "sglang:num_requests_total"
HTTP_ACTIVE = "sglang:http_requests_active"
# Disaggregation's queues of requests waiting on the peer server (see "Deferred work"), under every
# name a release has given them: 0.5.23 (the real pages) writes bootstrap, inflight, and the decode
# side's prealloc, transfer and host_receive; earlier 0.4/0.5 releases wrote prefill_prealloc and the
# misspelt prefill_infight for the prefill side's two.
DEFERRED = ("sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs",
            "sglang:num_prefill_prealloc_queue_reqs", "sglang:num_prefill_infight_queue_reqs",
            "sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs",
            "sglang:num_decode_host_receive_queue_reqs")
# Requests paused by an async weight sync ("The number of paused requests by async weight sync."):
# owed, and held on purpose, so with nothing moving the target is `paused`, not stuck.
PAUSED = "sglang:num_paused_reqs"

# Pace (llm_vitals/exporter/pace.py): the inter-token latency histogram's sum and count, seconds per
# output token (the tokenizer manager's: one per server, no dp_rank, so its ranks are not paced apart).
PACE = ("sglang:inter_token_latency_seconds_sum", "sglang:inter_token_latency_seconds_count")

# Routes whose requests are engine work (HTTP_ACTIVE also counts /metrics itself, /health, ...).
# An active request on any other route says nothing about the engine: counting it could make an
# idle server read busy with nothing moving, i.e. stuck.
WORK_ROUTES = frozenset({
    "/generate", "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
    "/v1/embeddings", "/encode", "/classify", "/v1/score", "/v1/rerank", "/invocations",
    "/v1/audio/transcriptions",
})

_SCANNER = Scanner((RUNNING, QUEUED, USED_TOKENS, REALTIME_TOKENS, STEPS, GENERATION_TOKENS, PROMPT_TOKENS,
                    FINISHED, HTTP_ACTIVE, PAUSED, *DEFERRED, *PACE))


def parse_text(text: str) -> PageReading:
    """Turn an SGLang `/metrics` page into a PageReading, summed over ranks and modes; raises PageError."""
    found = _SCANNER.scan(text)
    if RUNNING not in found or QUEUED not in found:
        missing = RUNNING if RUNNING not in found else QUEUED
        if "sglang:" in text:
            raise PageError("bad_metrics", f"no {missing} yet: SGLang's scheduler has not reported (still loading?)")
        raise PageError("bad_metrics", f"no {missing} on the page (not an SGLang /metrics page?)")

    active = finite_sum(HTTP_ACTIVE, (s for s in found.get(HTTP_ACTIVE, ()) if s.labels().get("endpoint") in WORK_ROUTES))
    used = total(found, USED_TOKENS)
    realtime = total(found, REALTIME_TOKENS)
    deferred = [sample for name in DEFERRED for sample in found.get(name, ())]
    pace_seconds, pace_tokens = (total(found, name) for name in PACE)
    return snapshot_of(
        found, running=RUNNING, waiting=QUEUED, steps=STEPS, generation_tokens=GENERATION_TOKENS,
        prompt_tokens=PROMPT_TOKENS, finished=FINISHED,
        more_counters=signals(realtime_tokens=realtime),
        more_gauges=signals(used_tokens=used),
        busy_signs=(("requests_active", active),),
        deferred=finite_sum("transfer queues", deferred),
        paused=total(found, PAUSED) or 0.0,
        # One scheduler writes one running line: the per-rank work only where several do (searching
        # the whole page for a dp_rank label instead cost a fifth of its parse).
        units=_units(found, deferred) if len(found[RUNNING]) > 1 else (),
        pace=(pace_seconds, pace_tokens) if pace_seconds is not None and pace_tokens is not None else None,
    )


def _units(found: dict[str, list[Sample]], deferred: list[Sample]) -> tuple[Unit, ...]:
    """Each data-parallel rank's own load and its own steps and tokens, by its `dp_rank` label."""
    running = by_label(found[RUNNING], "dp_rank")
    if len(running) < 2:
        return ()
    queued, held = by_label(found[QUEUED], "dp_rank"), by_label(deferred, "dp_rank")
    counters = [by_label(found.get(name, ()), "dp_rank") for name in (STEPS, REALTIME_TOKENS)]
    used = by_label(found.get(USED_TOKENS, ()), "dp_rank")
    return tuple(
        Unit(f'dp_rank="{rank}"', value, queued.get(rank, 0.0), held.get(rank, 0.0),
             tuple(values.get(rank) for values in counters), (used.get(rank),))
        for rank, value in running.items()
    )


parse = text_parse(parse_text)


def pause_answer(status: int, body: bytes) -> bool | None:
    """`GET /ready`'s answer: 503 paused (between /pause_generation and /continue_generation), 200 not."""
    return {503: True, 200: False}.get(status)


ENGINE = Engine(
    name="sglang",
    parse=parse,
    signature="sglang:",
    # None on purpose: see the module docstring ("Health").
    health_paths=(),
    pause_path="/ready",
    pause_answer=pause_answer,
    # The scheduler sets num_running_reqs and num_queue_reqs at its log points: every 40 decode
    # steps (decode_log_interval), or every 30 s when idle. For that long after work ends they can
    # still show it pending while nothing moves.
    facts=EngineFacts(
        stuck_after_floor=30.0,
        stuck_after_floor_reason="SGLang refreshes sglang:num_running_reqs and sglang:num_queue_reqs only every "
                                 "40 decode steps (decode_log_interval), or every 30s when idle, so they can show "
                                 "work pending for that long after it ended",
    ),
)
