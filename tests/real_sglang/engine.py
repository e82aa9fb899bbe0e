"""The real-SGLang tier's engine for the shared drills: SGLang 0.5.23 on CPU torch serving the tiny model.

Its launcher is sglang_server.py; its fault hooks freeze and kill `sglang::scheduler` and, in its own
drill, stop `sglang::detokenizer`; its facts are below. Requests go to SGLang's native `/generate`,
which takes token ids, so a prompt's length is exact.
"""

from __future__ import annotations

import random

import httpx
import psutil
from real_engine.engine import Counted, Engine, Kit, Probe, openai_completion, sigstopped
from real_engine.harness import HTTP_TIMEOUT_S, ExporterSettings
from real_engine.launcher import ServerProcess, free_port
from real_engine.load import Load, Outcome, sample_sum
from real_tier import RealTier

from .sglang_server import (
    CHUNKED_PREFILL_SIZE,
    CONTEXT_LENGTH,
    MAX_RUNNING_REQUESTS,
    SCHEDULER,
    SERVED_MODEL,
    SGLANG_VERSION,
    SglangServer,
    setup_missing,
)

GENERATE = "/generate"
VOCAB = 2048  # the tiny model's (tests/real_vllm/make_tiny_model.py)
FIRST_ORDINARY_TOKEN = 4  # ids 0..3 are <unk> <s> </s> <pad>
RUNNING, QUEUED = "sglang:num_running_reqs", "sglang:num_queue_reqs"
# With --max-running-requests 2 the requests beyond two wait in SGLang's queue: ~10-20 s of load here.
SATURATION_REQUESTS = 4
SATURATION_TOKENS = 1000
# The fault drills keep the engine busy for up to a few minutes: 2 running, 1 queued.
FAULT_REQUESTS = 3
FAULT_TOKENS = 20000
# Sixteen chunks (the recipe, with 4096-token chunks on a quiet box: 12862 tokens in 3.8 s).
PREFILL_TOKENS = 16 * CHUNKED_PREFILL_SIZE - 100  # 8092
# SGLANG_HEALTH_CHECK_TIMEOUT (default 20 s): /health's own deadline for a frozen scheduler.
HEALTH_TIMEOUT_S = 20.0
# The tier's stuck_after: 2.5 times the worst prefill chunk expected under load, and the hang drill's
# detection bound (stuck_after + 2 polls). The liveness budget is the exporter's default, twice it.
STUCK_AFTER_S = 10.0


def generations(count: int, max_new_tokens: int) -> list[dict]:
    """`count` requests that each decode exactly `max_new_tokens` tokens (ignore_eos)."""
    body = {"text": "def main():", "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}}
    return [body] * count


def long_prompt(prompt_tokens: int, seed: int = 0) -> dict:
    """One request of `prompt_tokens` random token ids and one output token: a long chunked prefill."""
    assert prompt_tokens + 1 <= CONTEXT_LENGTH
    rng = random.Random(seed)
    ids = [rng.randrange(FIRST_ORDINARY_TOKEN, VOCAB) for _ in range(prompt_tokens)]
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "ignore_eos": True, "temperature": 0}}


class SglangEngine(Engine):
    key = "sglang"
    name = "SGLang"
    tier = RealTier("SGLang", enable="LLM_VITALS_REAL_SGLANG", require="LLM_VITALS_REQUIRE_REAL_SGLANG")
    drills = ("smoke", "idle", "saturation", "prefill", "detokenizer", "pause", "hang", "kill", "restart")
    exporter = ExporterSettings(target="real-sglang", engine="sglang", stuck_after=STUCK_AFTER_S)
    families = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:realtime_tokens_total",
                "sglang:cuda_graph_passes_total", "sglang:num_used_tokens", "sglang:http_requests_active")
    openai_model = SERVED_MODEL
    answered = Counted("sglang:num_requests_total", "num_requests_total_delta", exact=True)
    saturation_requests = SATURATION_REQUESTS
    saturation_on_page = True
    queue_histogram = "sglang:queue_time_seconds"
    min_queued = 1
    # While SGLang chunks a long prompt, running and queued read 0: the other signs must say busy.
    long_prompt_tokens = PREFILL_TOKENS
    long_prompt_reads = True
    long_prompt_busy_throughout = True
    long_prompt_no_canary = True
    # SIGSTOP of the scheduler: /metrics answers with frozen counters; SGLang's own /health turns
    # 503 once its 20 s deadline passes.
    frozen_probe = Probe(("/health",), 503, after_s=HEALTH_TIMEOUT_S - 1, timeout=HEALTH_TIMEOUT_S + 10)
    # SIGKILL of the scheduler: for ~0.5 s the launcher still serves /metrics from the dead
    # scheduler's files; then it waits 5 s "before crash diagnostics" and kills its whole tree.
    down_within_s = 60.0
    kill_exits = True
    kill_fails_all = True  # in-flight requests get no answer

    def facts(self) -> dict:
        return {"version": f"sglang {SGLANG_VERSION} on torch 2.13.0+cpu, sgl_kernel stand-in",
                "max_running_requests": MAX_RUNNING_REQUESTS, "context_length": CONTEXT_LENGTH,
                "chunked_prefill_size": CHUNKED_PREFILL_SIZE}

    def setup_missing(self) -> str | None:
        return setup_missing()

    def launcher(self) -> SglangServer:
        return SglangServer(port=free_port(), log_dir=self.log_dir)

    def smoke(self, kit: Kit) -> dict:
        return openai_completion(kit.server.url, SERVED_MODEL, tokens=4)

    def working(self, page: str) -> bool:
        """Both running slots busy and one queued."""
        return sample_sum(page, (RUNNING, QUEUED)) >= MAX_RUNNING_REQUESTS + 1

    def saturation_load(self, server: ServerProcess) -> Load:
        return Load.batch(server.url, GENERATE, generations(SATURATION_REQUESTS, SATURATION_TOKENS), SATURATION_REQUESTS)

    def long_prompt_load(self, server: ServerProcess) -> Load:
        return Load.batch(server.url, GENERATE, [long_prompt(PREFILL_TOKENS)], 1)

    def long_prompt_reading(self, page: str) -> dict:
        used = sample_sum(page, "sglang:num_used_tokens")
        pending = sample_sum(page, (RUNNING, QUEUED))
        active = sample_sum(page, "sglang:http_requests_active", {"endpoint": GENERATE})
        return {"used": used, "running_plus_queued": pending, "active": active, "in_flight": active >= 1,
                "trap": used > 0 and pending == 0}

    def check_long_prompts(self, facts: dict, readings: list[dict]) -> None:
        facts["pages_with_running_0_and_used_tokens"] = sum(r["trap"] for r in readings)
        # The trap this drill exists for: SGLang itself shows running 0 and queued 0 while it works.
        assert facts["pages_with_running_0_and_used_tokens"] >= 1, readings

    def fault_load(self, server: ServerProcess) -> Load:
        return Load.batch(server.url, GENERATE, generations(FAULT_REQUESTS, FAULT_TOKENS), FAULT_REQUESTS)

    def finish_load(self, kit: Kit, load: Load) -> list[Outcome]:
        """End the long requests at once: SGLang's /abort_request with abort_all."""
        load.stop()
        httpx.post(f"{kit.server.url}/abort_request", json={"rid": "", "abort_all": True}, timeout=HTTP_TIMEOUT_S)
        return load.wait(timeout=120)

    def freeze_engine(self, kit: Kit, load: Load):
        return sigstopped(kit.server.find(SCHEDULER))

    def kill_target(self, server: ServerProcess) -> psutil.Process:
        return server.find(SCHEDULER)


ENGINE = SglangEngine()
