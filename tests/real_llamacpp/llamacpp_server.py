"""A real llama.cpp `llama-server` (CPU, the tiny GGUF) as a child process the drills can start, fault and stop.

One process does everything: its HTTP threads, the engine loop on the **main thread** (so the
main thread's id is the process id: the freeze drill stops exactly that thread) and the ggml
compute threads. The binary and the model come from tools/real-llamacpp-setup.sh, cached outside
the clone; tools/real-llamacpp-test.sh hands their paths over in LLM_VITALS_LLAMACPP_BIN and
LLM_VITALS_LLAMACPP_MODEL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from real_vllm.vllm_server import lower_priority, tail

REPO = Path(__file__).resolve().parents[2]
# Per-run output (logs, the report) stays in the clone's .cache/; only built parts live outside it.
OUT = Path(os.environ.get("LLM_VITALS_LLAMACPP_OUT", REPO / ".cache" / "real-llamacpp"))
LOG_DIR = OUT / "logs"
BIN = os.environ.get("LLM_VITALS_LLAMACPP_BIN", "")
MODEL = os.environ.get("LLM_VITALS_LLAMACPP_MODEL", "")

ALIAS = "tiny-llama"
SLOTS = 2  # -np: two requests decode together, a third is deferred
CONTEXT = 16384  # -c: shared by the slots, 8192 tokens each
# One thread, so no barriers: two meet at dozens of OpenMP barriers per token, and on a loaded box
# each waits for the other to be scheduled (3.5 s a token seen).
THREADS = 1
BATCH = 256  # -b: a prompt goes in as one decode call per this many tokens (timing.py says why not 2048)
# --threads-http: llama-server answers HTTP from a fixed pool, by default max(-np + 2, cores - 1) =
# 4 threads here, and every streaming or deferred request holds one until it ends. The drills' 8
# long generations took all 4: a fresh connection to /metrics (the drill's direct reads) waited for
# a request to end, up to the whole saturation window (its reads came back only when the load was
# cancelled). The exporter kept its keep-alive connection and its thread. 16 leaves room.
HTTP_THREADS = 16
START_DEADLINE_S = 120.0  # ready in ~1 s on an idle box; the shared box can be far slower


def setup_missing() -> str | None:
    """Why the tier cannot run here (None when the binary and the model are in place)."""
    if not BIN or not Path(BIN).is_file():
        return f"no llama-server binary (LLM_VITALS_LLAMACPP_BIN={BIN!r}); run `make test-llamacpp`"
    if not MODEL or not Path(MODEL).is_file():
        return f"no tiny GGUF (LLM_VITALS_LLAMACPP_MODEL={MODEL!r}); run `make test-llamacpp`"
    return None


@dataclass
class LlamaServer:
    """One `llama-server` lifetime at a time on one loopback port; `start()` again to restart."""

    port: int
    starts: list[dict] = field(default_factory=list)  # {"seconds", "pid", "log", "loading_answer"} per start
    _proc: subprocess.Popen | None = None
    _log_file: object = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("llama-server not started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def argv(self) -> list[str]:
        return [
            "nice", "-n", "10", BIN, "-m", MODEL, "--host", "127.0.0.1", "--port", str(self.port),
            "--metrics", "-np", str(SLOTS), "-c", str(CONTEXT), "-t", str(THREADS), "-b", str(BATCH),
            "--threads-http", str(HTTP_THREADS),
            "-a", ALIAS,
        ]  # fmt: skip

    def start(self) -> float:
        """Launch and wait until /health answers 200; return the seconds it took."""
        if self.running:
            raise RuntimeError(f"llama-server already running as pid {self.pid}")
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        log_path = LOG_DIR / f"llama-server-{self.port}-{len(self.starts) + 1}.log"
        self._close_log()
        self._log_file = open(log_path, "wb")  # noqa: SIM115 -- open for the child's whole life
        began = time.monotonic()
        # `nice` execs llama-server, so the child's pid is the server's (and its main thread's) id.
        self._proc = subprocess.Popen(
            self.argv(), stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C reaches pytest, whose teardown stops the server by PID.
            start_new_session=True,
        )  # fmt: skip
        lower_priority(self._proc.pid)
        loading_answer = None
        with httpx.Client(timeout=5.0) as client:
            while True:
                if self._proc.poll() is not None:
                    self._close_log()
                    raise RuntimeError(f"llama-server exited with {self._proc.returncode}:\n{tail(log_path)}")
                if time.monotonic() - began > START_DEADLINE_S:
                    self.stop()
                    raise TimeoutError(f"llama-server not ready in {START_DEADLINE_S:.0f} s:\n{tail(log_path)}")
                try:
                    answer = client.get(f"{self.url}/health")
                    if answer.status_code == 200:
                        break
                    loading_answer = loading_answer or f"{answer.status_code} {answer.text[:200]}"
                except httpx.HTTPError:
                    pass  # not listening yet
                time.sleep(0.1)
        seconds = round(time.monotonic() - began, 2)
        self.starts.append({"seconds": seconds, "pid": self._proc.pid, "log": str(log_path),
                            "loading_answer": loading_answer})  # fmt: skip
        return seconds

    def signal(self, sig: int) -> None:
        """Send `sig` to the server process (by its PID)."""
        os.kill(self.pid, sig)

    def state(self) -> str:
        """The process state letter from /proc (R, S, T stopped, t traced, Z zombie), or '-' when gone."""
        try:
            return Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, RuntimeError):
            return "-"

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self._proc.wait(timeout=timeout) if self._proc else None
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """Stop the server by PID (a stopped one is continued first); never raises."""
        if self.running:
            try:
                os.kill(self._proc.pid, signal.SIGCONT)  # a SIGSTOPped process would hold SIGTERM forever
                self._proc.terminate()
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
