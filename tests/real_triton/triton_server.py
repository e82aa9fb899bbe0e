"""A real Triton 2.51 (nvidia-pytriton 0.7.0) serving the toy model: the Triton tier's launcher on the kit's ServerProcess.

Processes: the PyTriton Python process (our child; it runs the infer functions, so it is the
"worker") -> `tritonserver` (HTTP, gRPC and metrics ports, the scheduler and its queue) -> one
`triton_python_backend_stub` per model instance.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from real_engine.launcher import ServerProcess, free_port, tail
from real_engine.places import REPO, cache_path, missing

SERVER_SCRIPT = Path(__file__).resolve().parent / "toy_lm_server.py"
SETUP = REPO / "tools" / "real-triton-setup.sh"
MODEL = "toy_lm"  # toy_lm_server.py's model: 2 instances, max_batch_size 1
# toy_lm_server.py's EXTRA: loaded in turn on SIGUSR1, the last one loaded unloaded on SIGUSR2
EXTRA_MODELS = ("toy_lm_b", "toy_lm_c", "toy_lm_d")
INSTANCES = 2
# toy_lm_server.py's hold of toy_lm (its infer functions wait before their next token) and release.
HOLD_SIGNAL = signal.SIGRTMIN
RELEASE_SIGNAL = signal.SIGRTMIN + 1
# toy_lm_server.py's decoupled model (issue 38): bound on STREAM_BIND_SIGNAL, held and let go.
STREAM = "toy_lm_stream"
STREAM_BIND_SIGNAL = signal.SIGRTMIN + 2
STREAM_HOLD_SIGNAL = signal.SIGRTMIN + 3
STREAM_RELEASE_SIGNAL = signal.SIGRTMIN + 4
VERSION = "nvidia-pytriton 0.7.0 (Triton 2.51.0)"
# The toy model's cost per "token": a fixed wait plus a little matmul work. A request's length must
# not hang on the box's speed: with matmul work alone (TOY_DIM 128, 150 tokens) requests finished
# before any queued on a quiet box, so Triton (which counts queued requests only) never read busy,
# while 15 tokens at 256 once took 9 s on a box loaded many times over. The wait sets the length
# (20 ms a token on any box); the 32-wide work is microseconds, so a loaded box adds only the
# thread's wake-up latency per token.
TOY_DIM = 32
TOY_TOKEN_SECONDS = 0.02
LOAD_ATTEMPTS = 4


class LoadFailed(RuntimeError):
    """PyTriton exited because Triton failed to load the model (a race of its own under load)."""


def venv_path() -> Path:
    """The tier's venv, where tools/cache-path.sh says (outside the clone)."""
    override = os.environ.get("LLM_VITALS_TRITON_VENV")
    return Path(override) if override else cache_path("triton", "2.51")


def setup_missing() -> str | None:
    """Why the tier cannot run here (None when the venv is installed)."""
    return missing([("PyTriton venv", venv_path(), (".llm-vitals-installed", "bin/python"))],
                   f"`bash {SETUP.relative_to(REPO)}` (or `make test-triton`)")


def infer_body(tokens: int) -> dict:
    """A KServe v2 infer request for the toy model: `tokens` units of work."""
    return {"inputs": [{"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [tokens]}]}


@dataclass
class TritonServer(ServerProcess):
    """One server lifetime at a time on fixed loopback ports (`port` is HTTP's); `start()` again to restart on them.

    Started at normal priority and lowered once the model is loaded, not at launch: PyTriton's model
    load waits only 1 s for its own handshake socket, and a server started niced on a loaded 2-core
    box missed it ("Timeout occurred while waiting for config file").
    """

    grpc_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    name: str = "Triton"
    start_deadline_s: float = 120.0  # measured: ready in ~6 s on an idle 2-core box
    ready_every_s: float = 0.5
    niceness: int | None = 10
    stop_wait_s: float = 30.0  # PyTriton stops tritonserver and the stubs on SIGTERM (~5 s)
    _failed: list[str] = field(default_factory=list)  # this start's failed load attempts (their logs)
    _workspace: Path | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        return [
            str(venv_path() / "bin" / "python"), str(SERVER_SCRIPT),
            "--http-port", str(self.port), "--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port),
        ]

    def ready(self, client: httpx.Client) -> bool:
        """The metrics page is up before the model is loaded: the model's own ready route is the one."""
        return client.get(f"{self.url}/v2/models/{MODEL}/ready").status_code == 200

    def start(self) -> float:
        """Launch and wait until the model is ready; the seconds it took, failed load attempts included.

        PyTriton's model load waits only 1 s for the handshake socket between its processes, so on a
        loaded 2-core box a load can fail ("Timeout occurred while waiting for config file",
        "Connection refused"): the server then exits, and is launched again, up to LOAD_ATTEMPTS times.
        """
        began = time.monotonic()
        self._failed = []
        while True:
            log_path = self.log_dir / f"triton-{self.port}-{len(self.starts) + 1}-{len(self._failed) + 1}.log"
            try:
                self.launch(log_path)
                return self.started(began)
            except LoadFailed as exc:
                self._failed.append(str(log_path))
                if len(self._failed) >= LOAD_ATTEMPTS:
                    raise RuntimeError(f"PyTriton failed to load the model {len(self._failed)} times; last: {exc}") from None

    def start_facts(self) -> dict:
        return {"failed_loads": self._failed}

    def launch(self, log_path: Path) -> None:
        # PyTriton's workspaces (model store, sockets) go in a folder of this lifetime's own, removed
        # at stop, instead of piling up in ~/.cache/pytriton when a drill kills the server.
        # (Its `workspace=` argument made the model load time out waiting on its handshake socket.)
        self._drop_workspace()
        self._workspace = Path(tempfile.mkdtemp(prefix="llmv-triton-"))
        self.env = {"PYTRITON_HOME": str(self._workspace), "TOY_DIM": str(TOY_DIM), "TOY_TOKEN_SECONDS": str(TOY_TOKEN_SECONDS)}
        super().launch(log_path)

    def exited_early(self, log_path: Path) -> Exception:
        if "load failed for model" in tail(log_path, 200):
            return LoadFailed(f"{log_path}: {tail(log_path, 1)}")
        return super().exited_early(log_path)

    def crash(self) -> str | None:
        """Why this lifetime's `tritonserver` died by itself (its log's crash lines), or None while it serves.

        Triton 2.51's Python backend sometimes dies under concurrent load with a SIGSEGV in
        TRITONBACKEND_ModelInstanceExecute and a boost::interprocess::lock_exception (reported
        upstream, triton-inference-server/server#8882 and #5949); here it came 15-60 s after a
        SIGSTOPped worker was resumed, in 2 runs of many.
        """
        try:
            self.find("tritonserver")
            return None
        except LookupError:
            pass
        log = self.starts[-1]["log"] if self.starts else None
        text = tail(Path(log), 400) if log else ""
        lines = [line.strip() for line in text.splitlines()
                 if line.startswith(("Signal (", "terminate called", "  what():", "Triton Inference Server exited"))]
        return "; ".join(lines) or f"tritonserver is gone; see {log}"

    def stop(self) -> None:
        super().stop()
        self._drop_workspace()

    def _drop_workspace(self) -> None:
        if self._workspace is not None:
            shutil.rmtree(self._workspace, ignore_errors=True)
            self._workspace = None


if __name__ == "__main__":  # a manual look: start, print the URLs, stop on Enter
    server = TritonServer(port=free_port(), log_dir=Path(tempfile.mkdtemp(prefix="llmv-triton-logs-")))
    print(f"ready in {server.start()} s: {server.url} metrics {server.metrics_url}", file=sys.stderr)
    try:
        input()
    finally:
        server.stop()
