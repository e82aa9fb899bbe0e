"""The GPU tier's drills: the real exporter (engine llamacpp, poll 1 s, stuck_after 6 s) judging llama-server on a GPU.

usage: PYTHONPATH=tests python tests/real_gpu/gpu_drills.py --bin BIN --model MODEL --out DIR [--hog HOG] [--cpu-flow]

Run by tools/real-gpu-test.sh (`make test-gpu`). In order: the server and the exporter up (the target
names `gpus: [0]`, so the exporter's NVML source reads the GPU all along), idle canaries, saturation
with a 1-token chat watchdog timed beside the exporter's own answers, a noisy neighbour on the same
GPU, the engine loop frozen (ptrace, HTTP alive), SIGSTOP, SIGKILL and a restart. Then, over every
sample of the run: the GPU read healthy by NVML, no fault, no error.

`--cpu-flow` checks this script's flow on a machine without a GPU: the llama.cpp tier's CPU build and
tiny model, a CPU hog as the neighbour, and the NVML source expected to say why it cannot read
(`nvml_unavailable` or `nvml_init`), never a fault. Each step's facts and outcome go to DIR/report.json
as soon as it ends, so a run cut short still reports. Exit status 1 if any step failed.

Reused from the llama.cpp tier (leaf tools, no fixtures): its load (long streamed generations
cancelled by closing their sockets) and its ptrace freeze of one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from real_engine.load import wait_page
from real_llamacpp.engine import long_generations, page_idle, slots_busy
from real_llamacpp.freeze_thread import frozen_thread

from llm_vitals.demo.ports import free_port

TARGET = "llama-gpu"
POLL_S, STUCK_AFTER_S, METRICS_TIMEOUT_S = 1.0, 6.0, 2.0
CANARY_INTERVAL_S, CANARY_TIMEOUT_S = 4.0, 10.0
# A frozen or stopped server is stuck within stuck_after plus two polls, each as long as its timeout
# when /metrics is accepted and never answered; the rest is slack for a loaded box.
STUCK_WITHIN_S = STUCK_AFTER_S + 2 * (POLL_S + METRICS_TIMEOUT_S) + 10
WINDOW_S = 20.0  # saturation: how long the verdict is sampled under load
HOG_S = 15.0
SAMPLE_EVERY_S = 0.25


@dataclass(frozen=True)
class Mode:
    """What differs between the GPU run and the flow check on the CPU."""

    gpu: bool
    slots: int  # -np
    server_args: tuple[str, ...]
    tokens: int  # per long generation: under the context of one slot (-c / -np)

    @classmethod
    def pick(cls, cpu_flow: bool) -> Mode:
        if cpu_flow:  # the llama.cpp tier's settings (tests/real_llamacpp/llamacpp_server.py), one thread
            return cls(False, 2, ("-np", "2", "-c", "16384", "-t", "1", "-b", "256", "--threads-http", "16"), 8000)
        # The earlier H200 run's settings; every layer on the GPU; 16 HTTP threads for 8 clients and the reads.
        return cls(True, 4, ("-ngl", "99", "-np", "4", "-c", "16384", "--threads-http", "16"), 3800)


def exporter_config(port: int, url: str) -> str:
    """The exporter's config: one llama.cpp target on GPU 0, read through NVML."""
    return f"""\
listen: "127.0.0.1:{port}"
poll_interval: {POLL_S:g}s
metrics_timeout: {METRICS_TIMEOUT_S:g}s
gpu_faults:
  nvml: {{interval: 1s}}
targets:
  - name: {TARGET}
    url: {url}
    engine: llamacpp
    stuck_after: {STUCK_AFTER_S:g}s
    startup_grace: 5m
    canary: {{interval: {CANARY_INTERVAL_S:g}s, timeout: {CANARY_TIMEOUT_S:g}s}}
    gpus: [0]
"""


@dataclass
class Sample:
    """One read of the exporter's TARGET JSON, and how long the exporter took to answer it."""

    t: float
    state: str | None
    reason: str | None
    since: float | None
    restarts: int
    canaries: dict
    gpu_fault: bool
    gpu_fault_detail: str | None
    gpu_fault_errors: dict
    poll_s: float | None
    answer_s: float


@dataclass
class Report:
    path: Path
    mode: dict
    steps: dict = field(default_factory=dict)

    def write(self) -> None:
        self.path.write_text(json.dumps({"mode": self.mode, "steps": self.steps}, indent=1))


class Run:
    """The server, the exporter, a sampler of the exporter's verdicts, and the report; everything stopped by PID."""

    def __init__(self, args: argparse.Namespace, mode: Mode) -> None:
        self.args, self.mode = args, mode
        self.out = Path(args.out)
        self.logs = self.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.report = Report(self.out / "report.json", {**asdict(mode), "bin": args.bin, "model": args.model})
        self.port, self.exporter_port = free_port(), free_port()
        self.url, self.exporter_url = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.exporter_port}"
        self.server: subprocess.Popen | None = None
        self.exporter: subprocess.Popen | None = None
        self.others: list[subprocess.Popen] = []
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._starts = 0
        self.failed = 0

    # -- processes ---------------------------------------------------------------------------------

    def _popen(self, argv: list[str], log: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(argv, stdout=open(self.logs / log, "wb"), stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, **kwargs)  # fmt: skip

    def start_server(self) -> float:
        self._starts += 1
        nice = [] if self.mode.gpu else ["nice", "-n", "10"]  # the CPU flow shares a small box
        argv = [*nice, self.args.bin, "-m", self.args.model, "--host", "127.0.0.1", "--port", str(self.port),
                "--metrics", "-a", "tiny-llama", *self.mode.server_args]  # fmt: skip
        began = time.monotonic()
        self.server = self._popen(argv, f"llama-server-{self._starts}.log")
        while True:
            if self.server.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.server.returncode}; see {self.logs}")
            if time.monotonic() - began > 180:
                raise TimeoutError("llama-server not ready in 180 s")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return round(time.monotonic() - began, 2)
            except httpx.HTTPError:
                pass
            time.sleep(0.1)

    def start_exporter(self) -> None:
        config = self.out / "exporter.yaml"
        config.write_text(exporter_config(self.exporter_port, self.url))
        self.exporter = self._popen([sys.executable, "-m", "llm_vitals.exporter.cli", "--config", str(config)], "exporter.log")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.exporter.poll() is not None:
                raise RuntimeError(f"the exporter exited with {self.exporter.returncode}; see {self.logs}/exporter.log")
            try:
                if httpx.get(f"{self.exporter_url}/healthz", timeout=2).status_code == 200:
                    threading.Thread(target=self._sample, name="sampler", daemon=True).start()
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("the exporter did not answer /healthz in 60 s")

    def stop(self) -> None:
        self._stop.set()
        for proc in [*self.others, self.server, self.exporter]:
            if proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGCONT)  # a stopped process would hold SIGKILL's reaping
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=20)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass

    # -- the exporter's verdicts -------------------------------------------------------------------

    def _sample(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    view = client.get(f"{self.exporter_url}/api/v1/targets/{TARGET}").json()
                except (httpx.HTTPError, ValueError):
                    time.sleep(SAMPLE_EVERY_S)
                    continue
                self.samples.append(Sample(
                    time.time(), view.get("state"), view.get("reason"), view.get("since"), view.get("restarts", 0),
                    dict((view.get("canary") or {}).get("results") or {}), bool(view.get("gpu_fault")),
                    view.get("gpu_fault_detail"), dict(view.get("gpu_fault_errors") or {}),
                    view.get("poll_duration_seconds"), round(time.monotonic() - began, 4)))  # fmt: skip
                time.sleep(SAMPLE_EVERY_S)

    def latest(self) -> Sample:
        return self.wait_for(lambda s: True, 30, "a sample")

    def since(self, t: float) -> list[Sample]:
        return [s for s in list(self.samples) if s.t >= t]

    def wait_for(self, condition: Callable[[Sample], bool], timeout: float, what: str, after: float | None = None) -> Sample:
        after = time.time() if after is None else after
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = next((s for s in self.since(after) if condition(s)), None)
            if found:
                return found
            time.sleep(0.05)
        last = self.samples[-1] if self.samples else None
        raise AssertionError(f"no {what} within {timeout:.0f} s; last sample: {last}")

    def probe(self, kind: str) -> int:
        return httpx.get(f"{self.exporter_url}/probe/{TARGET}/{kind}", timeout=2).status_code

    # -- steps -------------------------------------------------------------------------------------

    @contextmanager
    def step(self, name: str) -> Iterator[dict]:
        facts: dict = {}
        began = time.monotonic()
        outcome = "passed"
        try:
            yield facts
        except AssertionError as exc:
            outcome, facts["failure"] = "failed", str(exc)[:1000]
        except Exception as exc:
            outcome, facts["failure"] = "error", f"{type(exc).__name__}: {exc}"[:1000]
            facts["traceback"] = traceback.format_exc()[-2000:]
        self.failed += outcome != "passed"
        facts["seconds"], facts["outcome"] = round(time.monotonic() - began, 1), outcome
        self.report.steps[name] = facts
        self.report.write()
        print(f"{name}: {outcome} {json.dumps({k: v for k, v in facts.items() if k != 'traceback'})[:400]}", flush=True)

    @contextmanager
    def load(self) -> Iterator[None]:
        """Every slot busy and as many requests deferred, seen on /metrics; cancelled however the block ends."""
        with long_generations(self.url, 2 * self.mode.slots, tokens=self.mode.tokens):
            wait_page(f"{self.url}/metrics", lambda p: slots_busy(p, self.mode.slots), timeout=90, what="every slot busy, one deferred")
            yield
        wait_page(f"{self.url}/metrics", page_idle, timeout=120, what="the server idle after the load")

    def neighbour(self) -> subprocess.Popen:
        if self.mode.gpu:
            return self._popen([self.args.hog, str(HOG_S)], "gpu_hog.log")
        # The CPU flow: a busy loop in another process, as another tenant's job would be.
        loop = f"import time\nt = time.time()\nwhile time.time() - t < {HOG_S}:\n    pass\n"
        return self._popen(["nice", "-n", "5", sys.executable, "-c", loop], "cpu_hog.log")


def detected(sample: Sample, t_event: float) -> float:
    """Seconds from the event to the verdict: the exporter's own `since` when it is after the event."""
    return round((sample.since if sample.since and sample.since >= t_event else sample.t) - t_event, 2)


def drills(run: Run) -> None:
    mode = run.mode
    with run.step("server_up") as facts:
        facts["ready_s"] = run.start_server()
        log = (run.logs / "llama-server-1.log").read_text(errors="replace").splitlines()
        facts["offload"] = [line.strip()[:200] for line in log if "offloaded" in line or "CUDA0" in line][:4]
        if mode.gpu:
            assert any("offloaded" in line for line in facts["offload"]), "llama-server did not offload to the GPU"
    with run.step("exporter_up") as facts:
        run.start_exporter()
        facts["first_state"] = run.wait_for(lambda s: s.state in ("idle", "busy"), 60, "a first verdict").state

    with run.step("idle") as facts:
        first = run.wait_for(lambda s: s.state == "idle", 60, "idle")
        end = run.wait_for(lambda s: True, 30, "the end of the window", after=first.t + 3 * CANARY_INTERVAL_S)
        window = [s for s in run.since(first.t) if s.t <= end.t]
        facts.update(canaries=sum(end.canaries.values()) - sum(first.canaries.values()), window_s=round(end.t - first.t, 1),
                     canary_results=end.canaries, states=sorted({s.state for s in window}))  # fmt: skip
        assert facts["canaries"] >= 2, facts
        assert end.canaries.get("error", 0) == first.canaries.get("error", 0), "an idle canary failed"

    with run.step("saturation") as facts, run.load():
        first = run.wait_for(lambda s: s.state == "busy", 30, "busy")
        watchdog: list[float] = []

        def chat_watchdog() -> None:  # what the incident's watchdog sent: 1 token, a 45 s timeout
            for _ in range(3):
                began = time.monotonic()
                try:
                    httpx.post(f"{run.url}/v1/chat/completions", timeout=45, json={
                        "model": "tiny-llama", "max_tokens": 1, "temperature": 0,
                        "messages": [{"role": "user", "content": "ping"}]})  # fmt: skip
                except httpx.HTTPError:
                    pass
                watchdog.append(round(time.monotonic() - began, 2))

        thread = threading.Thread(target=chat_watchdog, daemon=True)
        thread.start()
        probes: list[float] = []
        t_end = first.t + WINDOW_S
        while time.time() < t_end:
            began = time.monotonic()
            run.probe("ready")
            probes.append(time.monotonic() - began)
            time.sleep(0.5)
        thread.join(150)
        window = [s for s in run.since(first.t) if s.t <= t_end]
        facts.update(
            busy_s=detected(first, first.t), samples=len(window), not_busy=[s.state for s in window if s.state != "busy"],
            canaries=sum(window[-1].canaries.values()) - sum(window[0].canaries.values()), watchdog_1token_s=watchdog,
            exporter_answer_s_max=round(max(s.answer_s for s in window), 4),
            ready_probe_s_max=round(max(probes), 4), poll_s_max=max((s.poll_s or 0) for s in window))  # fmt: skip
        assert not facts["not_busy"], facts
        assert facts["canaries"] == 0, "a canary went to a saturated server"

    with run.step("noisy_neighbour") as facts, run.load():
        run.wait_for(lambda s: s.state == "busy", 30, "busy")
        hog = run.neighbour()
        run.others.append(hog)
        t0 = time.time()
        rc = hog.wait(timeout=HOG_S + 60)
        window = run.since(t0)
        facts.update(samples=len(window), states=sorted({s.state for s in window}), hog_rc=rc,
                     hog=(run.logs / ("gpu_hog.log" if mode.gpu else "cpu_hog.log")).read_text(errors="replace")[-200:])  # fmt: skip
        assert rc == 0, facts
        assert set(facts["states"]) == {"busy"}, facts

    def pid() -> int:  # the server of the moment (the kill drill replaces it)
        assert run.server is not None
        return run.server.pid

    with run.step("frozen_loop") as facts, run.load():
        restarts = run.wait_for(lambda s: s.state == "busy" and s.reason == "progress", 30, "busy with progress").restarts
        with frozen_thread(pid(), max_seconds=STUCK_WITHIN_S + 30) as t_freeze:
            stuck = run.wait_for(lambda s: s.state == "stuck", STUCK_WITHIN_S, "stuck", after=t_freeze)
            facts.update(stuck_after_s=detected(stuck, t_freeze), reason=stuck.reason, ready=run.probe("ready"),
                         live=run.probe("live"))  # fmt: skip
            t_release = time.time()
        back = run.wait_for(lambda s: s.state == "busy", 30, "busy after the release", after=t_release)
        facts.update(back_s=round(back.t - t_release, 2), restarts_added=back.restarts - restarts)
        assert facts["reason"] in ("no_progress", "metrics_unanswered"), facts
        assert facts["ready"] == 503 and facts["live"] == 200, facts
        assert facts["restarts_added"] == 0, "a freeze is no restart"

    with run.step("sigstop") as facts, run.load():
        restarts = run.wait_for(lambda s: s.state == "busy", 30, "busy").restarts
        t_stop = time.time()
        os.kill(pid(), signal.SIGSTOP)
        try:
            stuck = run.wait_for(lambda s: s.state == "stuck", STUCK_WITHIN_S, "stuck", after=t_stop)
        finally:
            t_cont = time.time()
            os.kill(pid(), signal.SIGCONT)
        back = run.wait_for(lambda s: s.state == "busy", 30, "busy after SIGCONT", after=t_cont)
        facts.update(stuck_after_s=detected(stuck, t_stop), reason=stuck.reason, back_s=round(back.t - t_cont, 2),
                     restarts_added=back.restarts - restarts)  # fmt: skip
        assert facts["reason"] == "metrics_unanswered", facts
        assert facts["restarts_added"] == 0, "SIGSTOP/SIGCONT is no restart"

    with run.step("kill_restart") as facts:
        with long_generations(run.url, 2 * mode.slots, tokens=mode.tokens):
            restarts = run.wait_for(lambda s: s.state == "busy", 30, "busy").restarts
            t_kill = time.time()
            run.server.kill()
            down = run.wait_for(lambda s: s.state == "down", 30, "down", after=t_kill)
            run.server.wait(timeout=30)
        facts.update(down_s=detected(down, t_kill), reason=down.reason, restart_ready_s=run.start_server())
        t_up = time.time()
        counted = run.wait_for(lambda s: s.restarts > restarts, 60, "a restart counted", after=t_up - 1)
        ok = run.wait_for(lambda s: s.state == "idle" and s.canaries.get("ok", 0) > down.canaries.get("ok", 0),
                          60, "idle with a good canary after the restart", after=t_up)  # fmt: skip
        facts.update(counted_s=round(max(0.0, counted.t - t_up), 2), restarts_added=ok.restarts - restarts)
        assert facts["reason"] == "refused", facts  # no process listens: down at the first refused read
        assert facts["restarts_added"] == 1, facts

    with run.step("nvml_during_drills") as facts:
        samples = list(run.samples)
        faults = sorted({s.gpu_fault_detail for s in samples if s.gpu_fault})
        errors = sorted({s.gpu_fault_errors.get("nvml", "") for s in samples} - {""})
        facts.update(samples=len(samples), faults=faults, errors=[e[:200] for e in errors[:5]])
        assert not faults, "a GPU fault was flagged"
        if mode.gpu:
            assert not errors, "the NVML source could not read the GPU"
        else:  # no GPU here: the source must say why, and never flag
            assert errors and all(e.startswith(("nvml_unavailable", "nvml_init")) for e in errors), errors


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--hog", help="the CUDA neighbour (tools/real-gpu-setup.sh builds it)")
    parser.add_argument("--cpu-flow", action="store_true", help="check the flow on the CPU (no GPU here)")
    args = parser.parse_args()
    mode = Mode.pick(args.cpu_flow)
    if mode.gpu and not args.hog:
        parser.error("--hog is needed on a GPU")
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout` ends a run with SIGTERM: stop every process all the same
    run = Run(args, mode)
    try:
        drills(run)
    finally:
        run.stop()
        run.report.write()
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main())
