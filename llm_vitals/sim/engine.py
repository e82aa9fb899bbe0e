"""A pure model of vLLM V1's engine core: continuous batching, chunked prefill, and its statistics.

No I/O and no clock of its own: `step(now)` advances exactly one engine step at time `now`, so tests
drive it directly. `simulator.driver` steps it in real time.

What it reproduces, because the exporter's verdict depends on it:
- `max_num_seqs` running slots and a FIFO waiting queue;
- each step has a token budget of `max_num_batched_tokens`: every decoding request gets one token,
  prefills get chunks of what is left; a prompt longer than the budget takes several steps;
- a step "returns output" only when some request produced a token (a decode, or the last chunk of a
  prefill, which samples the first token). Only those steps are observed in
  `iteration_tokens_total`, and the prompt counters move when a prefill completes, exactly as in
  vLLM. The KV-cache usage, however, grows with every chunk.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field

from llm_vitals.sim.config import SimConfig

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def buckets_1_2_5(upper: int) -> list[float]:
    """vLLM's `build_1_2_5_buckets`: 1, 2, 5, 10, 20, 50, ... up to and including `upper`."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > upper:
                return out
            out.append(float(value))
        exponent += 1


# Bucket bounds as on the real vLLM 0.32 page (tests/fixtures/vllm/).
ITERATION_TOKENS_BUCKETS = [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0]
PARAMS_N_BUCKETS = [1.0, 2.0, 5.0, 10.0, 20.0]
NUM_PREEMPTIONS_BUCKETS = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0]
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TOKEN_LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


class Histogram:
    """A cumulative-at-render histogram: per-bucket counts, sum and count (no +Inf in `bounds`)."""

    def __init__(self, bounds: list[float]):
        self.bounds = list(bounds)
        self.bucket_counts = [0] * (len(self.bounds) + 1)  # last slot is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.bucket_counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """[(upper bound, cumulative count)], the last bound being +Inf, as the exposition wants."""
        out, running = [], 0
        for bound, count in zip([*self.bounds, math.inf], self.bucket_counts, strict=True):
            running += count
            out.append((bound, running))
        return out


@dataclass
class EngineStats:
    """Everything the /metrics page reports, as plain numbers. A new engine (a restart) starts at 0."""

    max_model_len: int
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    num_preemptions: int = 0
    # Per step, as SGLang's page counts them: prompt tokens computed (chunks included) and forward
    # passes with decodes / with prefill work.
    prefill_tokens_computed: int = 0
    decode_passes: int = 0
    prefill_passes: int = 0
    request_success: dict[str, int] = field(default_factory=lambda: {r: 0 for r in FINISHED_REASONS})
    histograms: dict[str, Histogram] = field(default_factory=dict)

    def __post_init__(self) -> None:
        by_len = buckets_1_2_5(self.max_model_len)
        self.histograms = {
            "request_prompt_tokens": Histogram(by_len),
            "request_generation_tokens": Histogram(by_len),
            "iteration_tokens_total": Histogram(ITERATION_TOKENS_BUCKETS),
            "request_max_num_generation_tokens": Histogram(by_len),
            "request_params_n": Histogram(PARAMS_N_BUCKETS),
            "request_params_max_tokens": Histogram(by_len),
            "time_to_first_token_seconds": Histogram(TTFT_BUCKETS),
            "inter_token_latency_seconds": Histogram(TOKEN_LATENCY_BUCKETS),
            "request_time_per_output_token_seconds": Histogram(TOKEN_LATENCY_BUCKETS),
            "e2e_request_latency_seconds": Histogram(REQUEST_LATENCY_BUCKETS),
            "request_queue_time_seconds": Histogram(REQUEST_LATENCY_BUCKETS),
            "request_inference_time_seconds": Histogram(REQUEST_LATENCY_BUCKETS),
            "request_prefill_time_seconds": Histogram(REQUEST_LATENCY_BUCKETS),
            "request_decode_time_seconds": Histogram(REQUEST_LATENCY_BUCKETS),
            "request_num_preemptions": Histogram(NUM_PREEMPTIONS_BUCKETS),
            "request_prefill_kv_computed_tokens": Histogram(by_len),
        }

    @property
    def iteration_steps(self) -> int:
        """Steps that returned output: what `vllm:iteration_tokens_total_count` shows."""
        return self.histograms["iteration_tokens_total"].count

    @property
    def finished(self) -> int:
        return sum(self.request_success.values())


@dataclass
class SimRequest:
    """One request inside the engine. `max_tokens` is exactly how many tokens it will generate."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    # The reason it finishes with once max_tokens are out: "length" when the client asked for that
    # many tokens, "stop" when the simulator stands in for an end-of-sequence token.
    finish_reason: str = "length"
    arrival: float = 0.0
    computed_prompt: int = 0
    generated: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_reason: str | None = None

    @property
    def prefilling(self) -> bool:
        return self.computed_prompt < self.prompt_tokens


@dataclass
class StepOutput:
    """What one step did. `new_tokens` maps request id to tokens produced (0 or 1)."""

    new_tokens: dict[str, int]
    finished: list[SimRequest]
    prefill_tokens: int  # prompt tokens computed in this step (chunks, complete or not)
    decode_tokens: int
    returned_output: bool
    cost_seconds: float  # how long this step takes on the simulated hardware


class Engine:
    """The engine core. Not thread-safe, no I/O; `now` is whatever clock the caller uses."""

    def __init__(self, config: SimConfig):
        self.config = config
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats = EngineStats(max_model_len=config.max_model_len)
        self.steps = 0  # every step taken, with or without output
        # A disaggregated decode engine whose prefill peer is gone (the `peer` fault): a waiting
        # request's KV never arrives, so none is admitted, and vLLM 0.32 counts them as deferred
        # (`num_requests_waiting_by_reason{reason="deferred"}`). Running ones finish as usual.
        self.peer_down = False

    # -- requests ---------------------------------------------------------------------------------
    def add_request(self, request: SimRequest, now: float) -> None:
        """Queue a request (FIFO). Length limits are the API's job; this only asserts them."""
        if request.prompt_tokens < 1 or request.max_tokens < 1:
            raise ValueError("a request needs at least one prompt token and one output token")
        if request.prompt_tokens + request.max_tokens > self.config.max_model_len:
            raise ValueError("request longer than max_model_len")
        request.arrival = now
        self.waiting.append(request)

    def abort(self, request_id: str, now: float) -> SimRequest | None:
        """Drop a request (client went away); counted as finished_reason="abort" like vLLM."""
        for queue in (self.waiting, self.running):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    self._finish(request, "abort", now)
                    return request
        return None

    # -- state ------------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_deferred(self) -> int:
        """Waiting requests the engine defers on its peer (all of them while the peer is down)."""
        return len(self.waiting) if self.peer_down else 0

    @property
    def has_work(self) -> bool:
        # Deferred requests are no work the engine can step: it waits, steps nothing, moves nothing.
        return bool(self.running or (self.waiting and not self.peer_down))

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of KV blocks held by running requests (vllm:kv_cache_usage_perc)."""
        block = self.config.block_size
        used = sum(math.ceil((r.computed_prompt + r.generated) / block) for r in self.running)
        return min(1.0, used / self.config.num_gpu_blocks)

    # -- the step ---------------------------------------------------------------------------------
    def step(self, now: float) -> StepOutput:
        """Advance one engine step at time `now`."""
        budget = self.config.max_num_batched_tokens
        prefill_tokens = 0
        completes_prefill: list[SimRequest] = []
        decoding: list[SimRequest] = []

        # Running requests first (vLLM V1 schedules RUNNING before WAITING): decodes take one token
        # each, unfinished prefills take a chunk of what is left.
        for request in self.running:
            if budget <= 0:
                break
            if request.prefilling:
                budget, chunk = self._prefill_chunk(request, budget)
                prefill_tokens += chunk
                if not request.prefilling:
                    completes_prefill.append(request)
            else:
                decoding.append(request)
                budget -= 1

        # Then admit waiting requests, FIFO, while there is a free slot and token budget.
        while self.waiting and not self.peer_down and len(self.running) < self.config.max_num_seqs and budget > 0:
            request = self.waiting.popleft()
            request.scheduled_at = now
            self.running.append(request)
            budget, chunk = self._prefill_chunk(request, budget)
            prefill_tokens += chunk
            if not request.prefilling:
                completes_prefill.append(request)

        new_tokens: dict[str, int] = {}
        iteration_prompt_tokens = 0
        for request in completes_prefill:
            # The last prefill chunk samples the first token; vLLM counts the prompt tokens now.
            iteration_prompt_tokens += request.prompt_tokens
            self.stats.prompt_tokens += request.prompt_tokens
            self.stats.prefix_cache_queries += request.prompt_tokens
            request.first_token_at = now
            self.stats.histograms["time_to_first_token_seconds"].observe(now - request.arrival)
            self._emit_token(request, now, new_tokens)
        for request in decoding:
            self.stats.histograms["inter_token_latency_seconds"].observe(now - (request.last_token_at or now))
            self._emit_token(request, now, new_tokens)

        finished = [r for r in self.running if r.generated >= r.max_tokens]
        for request in finished:
            self.running.remove(request)
            self._finish(request, request.finish_reason, now)

        generated = len(new_tokens)
        returned_output = generated > 0
        if returned_output:
            self.stats.histograms["iteration_tokens_total"].observe(iteration_prompt_tokens + generated)
        self.steps += 1
        self.stats.prefill_tokens_computed += prefill_tokens
        self.stats.decode_passes += 1 if decoding else 0
        self.stats.prefill_passes += 1 if prefill_tokens else 0
        cost = (1.0 / self.config.tokens_per_second if decoding or not prefill_tokens else 0.0) + (
            prefill_tokens / self.config.prefill_tokens_per_second
        )
        return StepOutput(new_tokens, finished, prefill_tokens, len(decoding), returned_output, cost)

    # -- helpers ----------------------------------------------------------------------------------
    @staticmethod
    def _prefill_chunk(request: SimRequest, budget: int) -> tuple[int, int]:
        chunk = min(request.prompt_tokens - request.computed_prompt, budget)
        request.computed_prompt += chunk
        return budget - chunk, chunk

    def _emit_token(self, request: SimRequest, now: float, new_tokens: dict[str, int]) -> None:
        request.generated += 1
        request.last_token_at = now
        self.stats.generation_tokens += 1
        new_tokens[request.request_id] = 1

    def _finish(self, request: SimRequest, reason: str, now: float) -> None:
        request.finished_reason = reason
        stats = self.stats
        stats.request_success[reason] += 1
        h = stats.histograms
        h["e2e_request_latency_seconds"].observe(now - request.arrival)
        h["request_prompt_tokens"].observe(request.prompt_tokens)
        h["request_generation_tokens"].observe(request.generated)
        h["request_max_num_generation_tokens"].observe(request.max_tokens)
        h["request_params_max_tokens"].observe(request.max_tokens)
        h["request_params_n"].observe(1)
        h["request_num_preemptions"].observe(0)
        h["request_prefill_kv_computed_tokens"].observe(request.computed_prompt)
        if request.scheduled_at is not None:
            h["request_queue_time_seconds"].observe(request.scheduled_at - request.arrival)
            h["request_inference_time_seconds"].observe(now - request.scheduled_at)
        if request.first_token_at is not None and request.scheduled_at is not None:
            h["request_prefill_time_seconds"].observe(request.first_token_at - request.scheduled_at)
            decode_time = now - request.first_token_at
            h["request_decode_time_seconds"].observe(decode_time)
            if request.generated > 1:
                h["request_time_per_output_token_seconds"].observe(decode_time / (request.generated - 1))
