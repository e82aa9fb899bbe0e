"""The real-Triton tier: a real Triton 2.51 (nvidia-pytriton 0.7.0) serving a toy model, judged by the real exporter.

Collected only under LLM_VITALS_REAL_TRITON=1, which `make test-triton` (tools/real-triton-test.sh)
sets: the main `pytest -n 2` run of tests/ never starts Triton. When the PyTriton venv is missing
the tier skips with one line; under LLM_VITALS_REQUIRE_REAL_TRITON=1 (CI) that is a failure.

One server and one exporter serve the whole module; the drills run in file order (smoke, idle,
saturation, frozen worker, kill, restart), so the kill and restart drills come last.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from real_vllm.drill_report import Report
from real_vllm.exporter_process import ExporterProcess, Watcher

from .drill_config import (
    CANARY_INTERVAL_S,
    CANARY_TIMEOUT_S,
    LIVENESS_BUDGET_S,
    POLL_INTERVAL_S,
    STUCK_AFTER_S,
    TARGET,
    exporter_config,
)
from .triton_server import CACHE, INSTANCES, LOG_DIR, MODEL, VERSION, TritonServer, setup_missing

ENABLED = os.environ.get("LLM_VITALS_REAL_TRITON") == "1"
REQUIRED = os.environ.get("LLM_VITALS_REQUIRE_REAL_TRITON") == "1"
REPORT_PATH = CACHE / "real-triton-report.json"

if not ENABLED:
    # Not part of the normal suite: `make test-triton` runs the drills on their own.
    collect_ignore = ["test_real_triton_drills.py"]


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    if ENABLED:
        # `timeout` or CI ends a run with SIGTERM: pytest then tears fixtures down, stopping Triton by PID.
        signal.signal(signal.SIGTERM, _interrupt)


DRILLS = ("smoke", "idle", "saturation", "frozen_worker", "frozen_tritonserver", "kill", "restart")
_report: Report | None = None


def _skip_or_fail(why: str) -> None:
    message = f"SKIPPED: real-Triton tier: {why}"
    if REQUIRED:
        pytest.fail(message + " [LLM_VITALS_REQUIRE_REAL_TRITON=1 makes this a failure]", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def report() -> Report:
    global _report
    _report = Report(path=REPORT_PATH, engine="triton")
    _report.exporter = {
        "poll_interval": POLL_INTERVAL_S,
        "stuck_after": STUCK_AFTER_S,
        "liveness_budget": LIVENESS_BUDGET_S,
        "canary_interval": CANARY_INTERVAL_S,
        "canary_timeout": CANARY_TIMEOUT_S,
    }
    _report.vllm = {"version": VERSION, "model": MODEL, "instances": INSTANCES, "starts": []}
    yield _report
    _report.write()


@pytest.fixture(scope="module")
def triton(report: Report) -> TritonServer:
    """A real Triton on free loopback ports (HTTP, gRPC, metrics), stopped with all its children by PID."""
    missing = setup_missing()
    if missing:
        _skip_or_fail(missing)
    server = TritonServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()
        report.vllm["starts"] = server.starts
        report.vllm["leftover_pids_after_stop"] = [p.pid for p in server.leftovers()]
        report.write()


@pytest.fixture(scope="module")
def exporter(triton: TritonServer) -> ExporterProcess:
    """The real exporter polling `triton` every second, stopped by PID at the end."""
    proc = ExporterProcess(
        vllm_url=triton.url,
        target=TARGET,
        config=lambda port: exporter_config(port, triton.url, triton.metrics_url),
        log_dir=LOG_DIR,
    )
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def watcher(exporter: ExporterProcess) -> Watcher:
    with Watcher(exporter) as w:
        yield w


@pytest.fixture
def drill(request, report: Report):
    """This test's record in the report: outcome and duration are filled in here."""
    test = request.node.name.removeprefix("test_")
    record = report.drill(next((d for d in DRILLS if test.startswith(d)), test))
    began = time.monotonic()
    yield record
    record.seconds = round(time.monotonic() - began, 1)
    if "watcher" in request.fixturenames:
        record.facts.update(request.getfixturevalue("watcher").health(record.started))
    rep = getattr(request.node, "rep_call", None)
    record.outcome = rep.outcome if rep is not None else "error"
    report.write()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep


def pytest_terminal_summary(terminalreporter):
    if _report is None or not _report.drills:
        return
    terminalreporter.section("real-Triton drills")
    for start in _report.vllm.get("starts", []):
        terminalreporter.write_line(f"Triton start: model ready in {start['seconds']:.1f} s (pid {start['pid']})")
    for record in _report.drills.values():
        terminalreporter.write_line(record.line())
    terminalreporter.write_line(f"report: {_report.path}; logs: {LOG_DIR}")
