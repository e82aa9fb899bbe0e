"""A real Triton 2.51 (nvidia-pytriton 0.7.0) serving the toy model, as a child process the drills fault.

Processes: the PyTriton Python process (our child; it runs the infer functions, so it is the
"worker") -> `tritonserver` (HTTP, gRPC and metrics ports, the scheduler and its queue) -> one
`triton_python_backend_stub` per model instance. Every one of them is remembered as a psutil handle
as soon as it appears (a SIGKILLed parent orphans its children) and stopped by its own PID.
The server runs in its own session at a lower priority than the exporter that judges it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from real_vllm.vllm_server import _signal, tail

from llm_vitals.demo.ports import free_port

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LLM_VITALS_CACHE", REPO / ".cache"))  # reports and logs, under the clone
if not CACHE.is_absolute():
    CACHE = REPO / CACHE
LOG_DIR = CACHE / "real-triton-logs"
SERVER_SCRIPT = Path(__file__).resolve().parent / "toy_lm_server.py"
SETUP = REPO / "tools" / "real-triton-setup.sh"

MODEL = "toy_lm"  # toy_lm_server.py's model: 2 instances, max_batch_size 1
INSTANCES = 2
VERSION = "nvidia-pytriton 0.7.0 (Triton 2.51.0)"
START_DEADLINE_S = 120.0  # measured: ready in ~6 s on an idle 2-core box
NICENESS = 10
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
    if override:
        return Path(override)
    out = subprocess.run(
        ["bash", str(REPO / "tools" / "cache-path.sh"), "triton", "2.51"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def setup_missing() -> str | None:
    """Why the tier cannot run here (None when the venv is installed)."""
    venv = venv_path()
    if not (venv / ".llm-vitals-installed").is_file() or not (venv / "bin" / "python").exists():
        return f"no PyTriton venv at {venv}; run `bash {SETUP.relative_to(REPO)}` (or `make test-triton`)"
    return None


def lower_priority(procs: list[psutil.Process]) -> None:
    """Best effort: put these processes, every thread of them, and their session behind everyone else.

    Done once the model is loaded, not at launch: PyTriton's model load waits only 1 s for its own
    handshake socket, and a server started niced on a loaded 2-core box missed it ("Timeout occurred
    while waiting for config file"). With autogroup scheduling nice only orders processes within a
    session, so the session's autogroup gets the niceness too, as in the vLLM tier.
    """
    for proc in procs:
        try:
            Path(f"/proc/{proc.pid}/autogroup").write_text(f"{NICENESS}\n")
        except OSError:
            pass  # no autogroup, or not allowed: the per-thread nice still applies
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
        except OSError:
            continue
        for tid in tids:  # setpriority on Linux is per thread
            try:
                os.setpriority(os.PRIO_PROCESS, tid, NICENESS)
            except OSError:
                pass


def infer_body(tokens: int) -> dict:
    """A KServe v2 infer request for the toy model: `tokens` units of work."""
    return {"inputs": [{"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [tokens]}]}


@dataclass
class TritonServer:
    """One server lifetime at a time on fixed loopback ports; `start()` again to restart on the same ports."""

    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    starts: list[dict] = field(default_factory=list)  # {"seconds", "pid", "log"} per start
    _proc: subprocess.Popen | None = None
    _known: dict[int, psutil.Process] = field(default_factory=dict)  # every process ever seen
    _log_file: object = None
    _workspace: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> float:
        """Launch and wait until the model is ready; the seconds it took, failed load attempts included.

        PyTriton's model load waits only 1 s for the handshake socket between its processes, so on a
        loaded 2-core box a load can fail ("Timeout occurred while waiting for config file",
        "Connection refused"): the server then exits, and is launched again, up to LOAD_ATTEMPTS times.
        """
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError(f"Triton already running as pid {self._proc.pid}")
        started = time.monotonic()
        failed: list[str] = []
        while True:
            log_path = LOG_DIR / f"triton-{self.http_port}-{len(self.starts) + 1}-{len(failed) + 1}.log"
            try:
                self._launch(log_path)
                break
            except LoadFailed as exc:
                failed.append(str(log_path))
                if len(failed) >= LOAD_ATTEMPTS:
                    raise RuntimeError(f"PyTriton failed to load the model {len(failed)} times; last: {exc}") from None
        lower_priority(self.leftovers())
        seconds = round(time.monotonic() - started, 1)
        self.starts.append({"seconds": seconds, "pid": self._proc.pid, "log": str(log_path), "failed_loads": failed})
        return seconds

    def _launch(self, log_path: Path) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self._close_log()
        self._log_file = open(log_path, "wb")  # noqa: SIM115 -- open for the child's whole life
        # PyTriton's workspaces (model store, sockets) go in a folder of this lifetime's own, removed
        # at stop, instead of piling up in ~/.cache/pytriton when a drill kills the server.
        # (Its `workspace=` argument made the model load time out waiting on its handshake socket.)
        self._drop_workspace()
        self._workspace = Path(tempfile.mkdtemp(prefix="llmv-triton-"))
        argv = [
            str(venv_path() / "bin" / "python"), str(SERVER_SCRIPT),
            "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
            "--metrics-port", str(self.metrics_port),
        ]
        self._proc = subprocess.Popen(
            argv,
            cwd=str(LOG_DIR),
            env={**os.environ, "PYTRITON_HOME": str(self._workspace), "TOY_DIM": str(TOY_DIM),
                 "TOY_TOKEN_SECONDS": str(TOY_TOKEN_SECONDS)},
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            # Its own session: SIGSTOP holds (see the recipe), and a Ctrl-C reaches only pytest, whose
            # teardown stops the server by PID.
            start_new_session=True,
        )
        self._known[self._proc.pid] = psutil.Process(self._proc.pid)
        try:
            self._wait_ready(time.monotonic(), log_path)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, started: float, log_path: Path) -> None:
        with httpx.Client(timeout=10.0) as client:
            while True:
                self.track_children()
                if self._proc.poll() is not None:
                    if "load failed for model" in tail(log_path, 200):
                        raise LoadFailed(f"{log_path}: {tail(log_path, 1)}")
                    raise RuntimeError(
                        f"Triton exited with status {self._proc.returncode} before it was ready; "
                        f"last lines of {log_path}:\n{tail(log_path)}"
                    )
                if time.monotonic() - started > START_DEADLINE_S:
                    raise TimeoutError(f"Triton not ready after {START_DEADLINE_S:.0f} s; see {log_path}:\n{tail(log_path)}")
                try:
                    if client.get(f"{self.url}/v2/models/{MODEL}/ready").status_code == 200:
                        self.track_children()
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                time.sleep(0.5)

    def track_children(self) -> None:
        """Remember every descendant of the PyTriton process seen so far."""
        if self._proc is None:
            return
        try:
            for child in psutil.Process(self._proc.pid).children(recursive=True):
                self._known.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def worker(self) -> psutil.Process:
        """The PyTriton Python process: it runs the infer functions, so stopping it freezes the work."""
        return self._known[self._proc.pid]

    def tritonserver(self) -> psutil.Process:
        """The live `tritonserver` process (HTTP, metrics, scheduler)."""
        self.track_children()
        for proc in self._known.values():
            try:
                if proc.is_running() and proc.name() == "tritonserver":
                    return proc
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        raise LookupError(f"no live tritonserver under PyTriton pid {self.pid}")

    def crash(self) -> str | None:
        """Why this lifetime's `tritonserver` died by itself (its log's crash lines), or None while it serves.

        Triton 2.51's Python backend sometimes dies under concurrent load with a SIGSEGV in
        TRITONBACKEND_ModelInstanceExecute and a boost::interprocess::lock_exception (reported
        upstream, triton-inference-server/server#8882 and #5949); here it came 15-60 s after a
        SIGSTOPped worker was resumed, in 2 runs of many.
        """
        try:
            self.tritonserver()
            return None
        except LookupError:
            pass
        log = self.starts[-1]["log"] if self.starts else None
        text = tail(Path(log), 400) if log else ""
        lines = [line.strip() for line in text.splitlines()
                 if line.startswith(("Signal (", "terminate called", "  what():", "Triton Inference Server exited"))]  # fmt: skip
        return "; ".join(lines) or f"tritonserver is gone; see {log}"

    def leftovers(self) -> list[psutil.Process]:
        """Processes of ours (any lifetime) still alive."""
        alive = []
        for proc in self._known.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                continue
        return alive

    def wait_gone(self, timeout: float) -> bool:
        """Wait until no process of ours is left; True when none is."""
        _, alive = psutil.wait_procs(self.leftovers(), timeout=timeout)
        if self._proc is not None:
            self._proc.poll()  # reap our child
        return not alive

    def stop(self) -> None:
        """Stop the PyTriton process and every process it ever spawned, each by PID; never raises."""
        self.track_children()
        for proc in self.leftovers():
            _signal(proc, signal.SIGCONT)  # a SIGSTOPped process would hold SIGTERM forever
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()  # PyTriton stops tritonserver and the stubs on SIGTERM (~5 s)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        rest = self.leftovers()
        for proc in rest:
            _signal(proc, signal.SIGTERM)
        _, still = psutil.wait_procs(rest, timeout=10)
        for proc in still:
            _signal(proc, signal.SIGKILL)
        psutil.wait_procs(still, timeout=10)
        self._close_log()
        self._drop_workspace()

    def _drop_workspace(self) -> None:
        if self._workspace is not None:
            shutil.rmtree(self._workspace, ignore_errors=True)
            self._workspace = None

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


if __name__ == "__main__":  # a manual look: start, print the URLs, stop on Enter
    server = TritonServer()
    print(f"ready in {server.start()} s: {server.url} metrics {server.metrics_url}", file=sys.stderr)
    try:
        input()
    finally:
        server.stop()
