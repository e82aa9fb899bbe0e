"""A real llama.cpp `llama-server` (CPU, the tiny GGUF): the llama.cpp tier's launcher on the kit's ServerProcess.

One process does everything: its HTTP threads, the engine loop on the **main thread** (so the
main thread's id is the process id: the freeze drill stops exactly that thread) and the ggml
compute threads. The binary and the model come from tools/real-llamacpp-setup.sh, cached outside
the clone; tools/real-llamacpp-test.sh hands their paths over in LLM_VITALS_LLAMACPP_BIN and
LLM_VITALS_LLAMACPP_MODEL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import httpx
from real_engine.launcher import ServerProcess

BIN = os.environ.get("LLM_VITALS_LLAMACPP_BIN", "")
MODEL = os.environ.get("LLM_VITALS_LLAMACPP_MODEL", "")

ALIAS = "tiny-llama"
SLOTS = 2  # -np: two requests decode together, a third is deferred
CONTEXT = 16384  # -c: shared by the slots, 8192 tokens each
# One thread, so no barriers: two meet at dozens of OpenMP barriers per token, and on a loaded box
# each waits for the other to be scheduled (3.5 s a token seen).
THREADS = 1
# -b: a prompt goes in as one decode call per this many tokens, and stuck_after must cover one such
# call. The recipe's 86M model prefilled ~140 tokens/s on the 2-core box (~15 s per 2048-token batch,
# which would need stuck_after >= 30 s); the tier's 3.4M model is far faster, and -b 256 keeps one
# batch well under stuck_after even on a box loaded by other work.
BATCH = 256
# --threads-http: llama-server answers HTTP from a fixed pool, by default max(-np + 2, cores - 1) =
# 4 threads here, and every streaming or deferred request holds one until it ends. The drills' 8
# long generations took all 4: a fresh connection to /metrics (the drill's direct reads) waited for
# a request to end, up to the whole saturation window (its reads came back only when the load was
# cancelled). The exporter kept its keep-alive connection and its thread. 16 leaves room.
HTTP_THREADS = 16


def setup_missing() -> str | None:
    """Why the tier cannot run here (None when the binary and the model are in place)."""
    if not BIN or not Path(BIN).is_file():
        return f"no llama-server binary (LLM_VITALS_LLAMACPP_BIN={BIN!r}); run `make test-llamacpp`"
    if not MODEL or not Path(MODEL).is_file():
        return f"no tiny GGUF (LLM_VITALS_LLAMACPP_MODEL={MODEL!r}); run `make test-llamacpp`"
    return None


@dataclass
class LlamaServer(ServerProcess):
    """One `llama-server` lifetime at a time on one loopback port; `start()` again to restart.

    Niced from the launch by its command line (`nice` execs llama-server, so the child's pid is the
    server's, and its main thread's, id), its session's autogroup behind the judge as well.
    """

    name: str = "llama-server"
    start_deadline_s: float = 120.0  # ready in ~1 s on an idle box; the shared box can be far slower
    ready_every_s: float = 0.1
    niceness: int | None = None
    autogroup_at_launch: int | None = 3
    loading_answer: str | None = None  # what /health said while the model loaded, in this start
    http_threads: int = HTTP_THREADS  # --threads-http (the starved-threads drill gives it 2)

    def command(self) -> list[str]:
        return [
            "nice", "-n", "10", BIN, "-m", MODEL, "--host", "127.0.0.1", "--port", str(self.port),
            "--metrics", "-np", str(SLOTS), "-c", str(CONTEXT), "-t", str(THREADS), "-b", str(BATCH),
            "--threads-http", str(self.http_threads), "-a", ALIAS,
        ]

    def launch(self, log_path: Path) -> None:
        self.loading_answer = None
        super().launch(log_path)

    def ready(self, client: httpx.Client) -> bool:
        """/health 200; it answers 503 while the model loads (kept, the first time, as a fact)."""
        answer = client.get(f"{self.url}/health", timeout=5.0)
        if answer.status_code != 200:
            self.loading_answer = self.loading_answer or f"{answer.status_code} {answer.text[:200]}"
        return answer.status_code == 200

    def start_facts(self) -> dict:
        return {"loading_answer": self.loading_answer}
