"""A real SGLang 0.5.23 server (CPU torch, tiny model): the SGLang tier's launcher on the kit's ServerProcess.

SGLang with TP 1 runs three processes: the launcher (our child: FastAPI/uvicorn and the tokenizer
manager; it owns the port and serves `/metrics` from prometheus-client's multiprocess files), the
`sglang::scheduler` (scheduler and model forward in one process: the one to freeze) and the
`sglang::detokenizer`, plus a `multiprocessing.resource_tracker`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from real_engine.launcher import ServerProcess
from real_engine.places import cache_path, venv_and_model_missing

SGLANG_VERSION = "0.5.23"
# Where tools/real-sglang-setup.sh put the venv and the model (outside the clone).
CACHE = Path(os.environ.get("LLM_VITALS_SGLANG_CACHE") or cache_path("sglang", SGLANG_VERSION))
SGLANG_VENV = CACHE / "venv"
SGLANG_PYTHON = SGLANG_VENV / "bin" / "python"
TINY_MODEL = CACHE / "tiny-llama"

SERVED_MODEL = "tiny-llama"
MAX_RUNNING_REQUESTS = 2
CONTEXT_LENGTH = 32768
# SGLang chunks a long prompt into pieces of this many tokens, one scheduler step each, and nothing
# moves within a step: a chunk must take less than stuck_after. A chunk's cost grows with the prefix
# before it (torch_native attention): on this box loaded by other work a 1024-token chunk after 15k
# tokens took 3-15 s. So small chunks and a prompt of 8k tokens here (SGLang's default chunk: 4096).
CHUNKED_PREFILL_SIZE = 512
SCHEDULER = "sglang::scheduler"
DETOKENIZER = "sglang::detokenizer"

# Below the exporter and the drills' watcher, as the vLLM tier's engine is, but less far: at 10 on a
# box loaded 10-20 times over by other work, one decode step took 0.26 s instead of ~6 ms and a
# 16k-token prefill chunk 35-75 s. At 3 the drills passed under that load with the watcher's reads
# at most 0.22 s and the exporter's verdicts at most 1.1 s old (SGLang's scheduler busy-polls one
# core; the judge has the other). Importing SGLang takes ~30 s of CPU; at nice 10 on a box loaded by
# others it got 5% of a core and was not ready in 5 min: so lowered once ready, before any drill.
# LLM_VITALS_SGLANG_NICENESS overrides it.
NICENESS = int(os.environ.get("LLM_VITALS_SGLANG_NICENESS", "3"))

_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    # One thread per process: the scheduler already busy-polls one of the two cores when idle.
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
}


def setup_missing() -> str | None:
    """Why the tier cannot run here (None when the venv and the model are built)."""
    return venv_and_model_missing("SGLang", SGLANG_VENV, TINY_MODEL, "sglang")


@dataclass
class SglangServer(ServerProcess):
    """One `sglang.launch_server` lifetime at a time on a fixed loopback port; `start()` again to restart."""

    name: str = "SGLang"
    main_title: str = "launcher"
    env: dict[str, str] = field(default_factory=lambda: dict(_ENV))
    niceness: int | None = NICENESS

    def command(self) -> list[str]:
        # --attention-backend torch_native: the default on x86 CPU (intel_amx) needs the real CPU
        # kernels, which the stand-in does not have. Overlap scheduling and CUDA graphs are GPU features.
        return [
            str(SGLANG_PYTHON), "-m", "sglang.launch_server",
            "--model-path", str(TINY_MODEL), "--served-model-name", SERVED_MODEL,
            "--device", "cpu", "--attention-backend", "torch_native", "--disable-overlap-schedule",
            "--enable-metrics", "--host", "127.0.0.1", "--port", str(self.port),
            "--max-running-requests", str(MAX_RUNNING_REQUESTS), "--max-total-tokens", "131072",
            "--context-length", str(CONTEXT_LENGTH), "--chunked-prefill-size", str(CHUNKED_PREFILL_SIZE),
            "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
        ]

    def ready(self, client: httpx.Client) -> bool:
        """Ready once /health is 200: it runs a 1-token generation through the whole engine.

        `/v1/models` and `/metrics` already answer 200 while SGLang loads, so they say nothing here.
        """
        return client.get(f"{self.url}/health", timeout=30.0).status_code == 200
