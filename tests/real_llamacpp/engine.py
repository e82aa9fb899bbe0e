"""The real-llama.cpp tier's engine for the shared drills: llama.cpp's `llama-server` (CPU, a tiny GGUF).

Its launcher is llamacpp_server.py; its fault hooks freeze the engine loop alone (ptrace of the main
thread, freeze_thread.py: HTTP stays alive), freeze the whole process (SIGSTOP) and kill it; its
facts are below. Its loads are long streamed generations that run until the drill cancels them:
llama-server writes every token as it comes, a write to a shut socket fails, and the request is
cancelled within a token (a request not streamed was cancelled only ~100 s after its client left).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psutil
from real_engine.engine import Counted, Engine, Fault, Kit, Probe, has_family, sigstopped
from real_engine.harness import ExporterSettings
from real_engine.launcher import ServerProcess, free_port
from real_engine.load import Load, Outcome, sample_sum
from real_tier import RealTier

from .freeze_thread import frozen_thread, thread_state
from .llamacpp_server import BATCH, CONTEXT, SLOTS, LlamaServer, setup_missing

PROCESSING, DEFERRED = "llamacpp:requests_processing", "llamacpp:requests_deferred"
DECODES = "llamacpp:n_decode_total"
PREDICTED = "llamacpp:tokens_predicted_total"
LONG_GENERATION_TOKENS = 8000  # under the 8192-token slot context
# Every slot busy and the rest deferred: on an idle box the tiny model makes ~1,000 tokens/s, so
# 8 x 8,000 tokens last over a minute; each drill cancels its load when it is done.
LOAD_REQUESTS = SLOTS + 6
SATURATION_WINDOW_S = 15.0

EXPORTER = ExporterSettings(
    target="real-llamacpp",
    engine="llamacpp",
    # As the vLLM drills. It must cover one prefill batch: a long prompt moves n_decode_total once
    # per `-b` tokens (llamacpp_server.BATCH says why that batch is small).
    stuck_after=6.0,
    # llama-server answers /metrics in under 40 ms even while busy, and a read it accepts but never
    # answers (the process stopped, or its loop wedged outside a decode) is the fact the verdict
    # judges as `metrics_unanswered`; a short timeout keeps each such poll short.
    metrics_timeout=2.0,
)


class LlamacppEngine(Engine):
    key = "llamacpp"
    name = "llama.cpp"
    tier = RealTier("llama.cpp", enable="LLM_VITALS_REAL_LLAMACPP", require="LLM_VITALS_REQUIRE_REAL_LLAMACPP")
    drills = ("smoke", "idle", "saturation", "frozen", "flaky_reads", "sigstop", "kill", "restart", "starved")
    exporter = EXPORTER
    families = (PROCESSING, DEFERRED, DECODES, PREDICTED)
    openai_model = "tiny-llama"
    # Each canary is a real request the engine ran: at least one decode call each.
    answered = Counted(DECODES, "n_decode_delta", exact=False)
    saturation_hold_s = SATURATION_WINDOW_S
    saturation_on_page = True
    # Inside a decode /metrics answers with frozen counters (no_progress); frozen between decodes,
    # /metrics is accepted and never answered (metrics_unanswered). Both are stuck.
    hang_reasons = ("no_progress", "metrics_unanswered")
    hang_when_owed = True  # frozen between decodes, its /metrics is never answered
    recovered_states = ("busy",)  # the load is still in flight when the freeze ends
    frozen_probe = Probe(("/health",), 200, timeout=EXPORTER.metrics_timeout)  # /health stays 200, loop frozen
    kill_reason = "refused"  # refused at once: `down` at the first refused read
    kill_exits = True
    kill_exit_status = -9
    kill_failed = frozenset({None})  # in-flight requests lose their connection
    kill_fails_all = True
    restart_waits_for_idle = True

    def facts(self) -> dict:
        return {"version": "llama.cpp llama-server 0c1e570 (llama-cpp-python 0.3.36 sdist), portable x86-64-v2 (GGML_NATIVE=OFF)",
                "slots": SLOTS, "context": CONTEXT, "batch": BATCH}

    def setup_missing(self) -> str | None:
        return setup_missing()

    def launcher(self) -> LlamaServer:
        return LlamaServer(port=free_port(), log_dir=self.log_dir)

    def smoke(self, kit: Kit) -> dict:
        """A native completion of 8 tokens, and the restart header the exporter compares."""
        answer = httpx.get(kit.server.metrics_url, timeout=20)
        assert answer.headers.get("Process-Start-Time-Unix", "").isdigit(), answer.headers
        done = httpx.post(f"{kit.server.url}/completion", json={"prompt": "Hello", "n_predict": 8, "ignore_eos": True}, timeout=60)
        assert done.status_code == 200, done.text
        return {"tokens_per_second_one_slot": round(done.json()["timings"]["predicted_per_second"], 1)}

    def working(self, page: str) -> bool:
        return slots_busy(page)

    def saturation_load(self, server: ServerProcess) -> Load:
        return long_generations(server.url, LOAD_REQUESTS)

    def saturation_facts(self, pages: dict[str, str]) -> dict:
        busy, end = pages["busy"], pages["end"]
        return {
            "processing_deferred_seen": [sample_sum(busy, PROCESSING), sample_sum(busy, DEFERRED)],
            "n_decode_during": sample_sum(end, DECODES) - sample_sum(busy, DECODES),
            "tokens_predicted_during": sample_sum(end, PREDICTED) - sample_sum(busy, PREDICTED),
        }

    def check_saturation(self, facts: dict) -> None:
        # The live progress signal moved the whole time; the token counters move only at request end.
        assert facts["n_decode_during"] > 0, facts
        # ignore_eos: a request that ended in the window added exactly its LONG_GENERATION_TOKENS.
        assert facts["tokens_predicted_during"] % LONG_GENERATION_TOKENS == 0, facts

    def fault_load(self, server: ServerProcess) -> Load:
        return long_generations(server.url, LOAD_REQUESTS)

    def finish_load(self, kit: Kit, load: Load) -> list[Outcome]:
        """Cancel the generations (they would run for minutes) and wait until the server reads idle."""
        outcomes = load.cancel()
        kit.wait_page(page_idle, "the server idle after the load was cancelled", timeout=180)
        return outcomes

    @contextmanager
    def freeze_engine(self, kit: Kit, load: Load) -> Iterator[Fault]:
        """ptrace-stop the main thread (the engine loop); the HTTP threads keep running. SIGSTOP cannot do that."""
        pid = kit.server.pid
        assert pid is not None
        with frozen_thread(pid, max_seconds=120) as t:
            state = thread_state(pid, pid)
            assert state == "t", f"the engine thread was not ptrace-stopped ({state})"
            yield Fault(t, "freeze", {"thread_state": state})

    def freeze_server(self, kit: Kit, load: Load):
        return sigstopped(kit.server.main_process())

    def kill_target(self, server: ServerProcess) -> psutil.Process:
        return server.main_process()


def slots_busy(page: str, slots: int = SLOTS, deferred: int = 1) -> bool:
    """llama-server's own page: every slot busy and at least `deferred` requests waiting for one."""
    return sample_sum(page, PROCESSING) >= slots and sample_sum(page, DEFERRED) >= deferred


def page_idle(page: str) -> bool:
    """llama-server's own page: nothing processing, nothing deferred (and both said, not missing)."""
    return has_family(page, PROCESSING) and has_family(page, DEFERRED) and sample_sum(page, (PROCESSING, DEFERRED)) == 0


def long_generations(url: str, count: int, tokens: int = LONG_GENERATION_TOKENS) -> Load:
    """`count` streamed generations of `tokens` tokens each, all at once (ignore_eos: they never end early)."""
    bodies = [{"prompt": f"Once upon a time {k}", "n_predict": tokens, "ignore_eos": True, "cache_prompt": False, "stream": True}
              for k in range(count)]
    return Load.batch(url, "/completion", bodies, concurrency=count, timeout=600.0)


ENGINE = LlamacppEngine()
