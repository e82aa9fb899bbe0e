"""A real engine server as a child process the drills can start, fault and stop: the part every launcher shares.

An engine's launcher subclasses `ServerProcess` with its command line and its readiness check. The
process handling is the same for all: the server runs in a session of its own (a Ctrl-C reaches
pytest, whose teardown stops it by PID), every descendant is remembered as a psutil handle as soon
as it appears (a SIGKILLed parent orphans its children, where `children()` no longer finds them),
and every one of them is stopped by its own PID; psutil handles refuse to signal a recycled PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import psutil

from llm_vitals.demo.ports import free_port  # noqa: F401 -- the engines' launchers take it from here


def lower_priority(procs: list[psutil.Process], niceness: int) -> None:
    """Best effort: put these processes, every thread of them, and their session behind the judge for the CPU.

    With the kernel's autogroup scheduling (on by default) nice only orders threads within a
    session, and an engine runs in a session of its own, so the session's autogroup gets the
    niceness too; setpriority on Linux is per thread, so each thread gets it for kernels without
    autogroup.
    """
    for proc in procs:
        try:
            Path(f"/proc/{proc.pid}/autogroup").write_text(f"{niceness}\n")
        except OSError:
            pass  # no autogroup, or not allowed: the per-thread nice still applies
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
            except OSError:
                pass


@dataclass
class ServerProcess:
    """One server lifetime at a time on a fixed loopback port; `start()` again to restart on the same port.

    A subclass gives `command()` and `ready()`; `start_facts()` adds to the record of each start.
    """

    port: int
    log_dir: Path
    name: str = "server"  # in messages and log file names
    env: dict[str, str] = field(default_factory=dict)  # on top of the caller's environment
    start_deadline_s: float = 600.0
    ready_every_s: float = 1.0
    # Once ready, every process (each thread, and the session's autogroup) gets this niceness: the
    # drills need the engine behind the judge only while they run, and a start niced from the launch
    # crawled on a box loaded by others. None leaves the priority alone.
    niceness: int | None = 3
    # The session's autogroup only, at launch (for a server whose process is niced by its command line).
    autogroup_at_launch: int | None = None
    stop_wait_s: float = 20.0  # for the main process to exit on SIGTERM
    main_title: str = "main process"  # the main process's title in `gone_titles`
    starts: list[dict] = field(default_factory=list)  # {"seconds", "pid", "log", **start_facts()} per start
    _proc: subprocess.Popen | None = None
    _known: dict[int, psutil.Process] = field(default_factory=dict)  # every process ever seen
    _titles: dict[int, str] = field(default_factory=dict)  # their titles, readable once they are gone
    _log_path: Path | None = None  # this lifetime's log
    _log_file: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """The engine's own /metrics page (where the exporter reads it)."""
        return f"{self.url}/metrics"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self, client: httpx.Client) -> bool:
        """One readiness check (a refused connection counts as not yet)."""
        raise NotImplementedError

    def start_facts(self) -> dict:
        """What this start's record says beyond its time, PID and log."""
        return {}

    def start(self) -> float:
        """Launch and wait until `ready`; return the seconds it took."""
        began = time.monotonic()
        self.launch(self.log_dir / f"{self.name.lower()}-{self.port}-{len(self.starts) + 1}.log")
        return self.started(began)

    def started(self, began: float) -> float:
        """Once ready: lower the priority and record the start."""
        seconds = round(time.monotonic() - began, 2)
        if self.niceness is not None:
            lower_priority(self.leftovers(), self.niceness)
        self.starts.append({"seconds": seconds, "pid": self.pid, "log": str(self._log_path), **self.start_facts()})
        return seconds

    def launch(self, log_path: Path) -> None:
        """Start one lifetime and wait until it is ready; stopped again (by PID) if it is not."""
        if self.running:
            raise RuntimeError(f"{self.name} already running as pid {self.pid}")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._close_log()
        self._log_path = log_path
        self._log_file = open(log_path, "wb")  # noqa: SIM115 -- open for the child's whole life
        self._proc = subprocess.Popen(
            self.command(),
            env={**os.environ, **self.env},
            cwd=str(self.log_dir),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._known[self._proc.pid] = psutil.Process(self._proc.pid)
        if self.autogroup_at_launch is not None:
            try:
                Path(f"/proc/{self._proc.pid}/autogroup").write_text(f"{self.autogroup_at_launch}\n")
            except OSError:
                pass
        try:
            self._wait_ready(time.monotonic(), log_path)
        except BaseException:
            self.stop()
            raise

    def exited_early(self, log_path: Path) -> Exception:
        """The error for a server that exited before it was ready (a launcher may tell a known cause apart)."""
        return RuntimeError(f"{self.name} exited with status {self.returncode} before it was ready; "
                            f"last lines of {log_path}:\n{tail(log_path)}")

    def _wait_ready(self, began: float, log_path: Path) -> None:
        with httpx.Client(timeout=10.0) as client:
            while True:
                self.track_children()
                if not self.running:
                    raise self.exited_early(log_path)
                if time.monotonic() - began > self.start_deadline_s:
                    raise TimeoutError(f"{self.name} not ready after {self.start_deadline_s:.0f} s; see {log_path}:\n{tail(log_path)}")
                try:
                    if self.ready(client):
                        self.track_children()
                        return
                except httpx.HTTPError:
                    pass  # not listening yet: loading
                time.sleep(self.ready_every_s)

    def track_children(self) -> None:
        """Remember every descendant of the server seen so far, and their titles while they live."""
        main = self._known.get(self.pid) if self.pid else None
        if main is None:
            return
        try:
            for child in main.children(recursive=True):
                self._known.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass
        for pid, proc in self._known.items():
            try:  # refreshed while alive: engines retitle their processes a moment after the spawn
                self._titles[pid] = self.main_title if proc is main else title(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass

    def main_process(self) -> psutil.Process:
        """The server's own process (our child) of the current lifetime."""
        if self.pid is None:
            raise RuntimeError(f"{self.name} not started")
        return self._known[self.pid]

    def find(self, name: str) -> psutil.Process:
        """The live descendant whose process name or title is `name` (e.g. `VLLM::EngineCore`, `tritonserver`)."""
        self.track_children()
        for proc in self._known.values():
            try:
                if proc.is_running() and (proc.name() == name or " ".join(proc.cmdline()).startswith(name)):
                    return proc
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        raise LookupError(f"no live {name} process under {self.name} pid {self.pid}")

    def gone_titles(self) -> list[str]:
        """The titles of the processes of ours that are gone."""
        self.track_children()
        alive = self.leftovers()
        return sorted({self._titles.get(p.pid, str(p.pid)) for p in self._known.values() if p not in alive})

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

    def wait_exit(self, timeout: float) -> int | None:
        """Wait for the main process to exit; its status, or None when still running."""
        try:
            return self._proc.wait(timeout=timeout) if self._proc else None
        except subprocess.TimeoutExpired:
            return None

    def log_text(self) -> str:
        """This lifetime's log so far."""
        return read_text(self._log_path)

    def stop(self) -> None:
        """Stop the main process and every process it ever spawned, each by PID; never raises."""
        self.track_children()
        for proc in self.leftovers():
            send_signal(proc, signal.SIGCONT)  # a SIGSTOPped process would hold SIGTERM forever
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=self.stop_wait_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        rest = self.leftovers()
        for proc in rest:
            send_signal(proc, signal.SIGTERM)
        _, still = psutil.wait_procs(rest, timeout=10)
        for proc in still:
            send_signal(proc, signal.SIGKILL)
        psutil.wait_procs(still, timeout=10)
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def send_signal(proc: psutil.Process, sig: int) -> None:
    """Signal one process by its psutil handle; a process already gone is no error."""
    try:
        proc.send_signal(sig)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


def title(proc: psutil.Process) -> str:
    """`VLLM::Worker`, `sglang::scheduler` for a retitled process; the executable's name for the others."""
    words = proc.cmdline()
    return words[0] if words and "::" in words[0] else proc.name()


def read_text(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
