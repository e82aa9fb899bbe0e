"""The real-Triton tier: a real Triton 2.51 (nvidia-pytriton 0.7.0) serving a toy model, judged by the real exporter.

Collected only under LLM_VITALS_REAL_TRITON=1, which `make test-triton` (tools/real-triton-test.sh)
sets: the main `pytest -n 2` run of tests/ never starts Triton. When the PyTriton venv is missing
the tier skips with one line; under LLM_VITALS_REQUIRE_REAL_TRITON=1 (CI) that is a failure.

One server and one exporter serve the whole module; the drills run in file order (smoke, idle,
saturation, frozen worker, kill, restart), so the kill and restart drills come last.
"""

from __future__ import annotations

import pytest
from real_tier import DrillRecords, RealTier
from real_tier import keep_call_report as pytest_runtest_makereport  # noqa: F401 -- a hook: pytest finds it by name
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

TIER = RealTier("Triton", enable="LLM_VITALS_REAL_TRITON", require="LLM_VITALS_REQUIRE_REAL_TRITON")
REPORT_PATH = CACHE / "real-triton-report.json"
# Not part of the normal suite: `make test-triton` runs the drills on their own.
collect_ignore = TIER.left_out("test_real_triton_drills.py")

DRILLS = ("smoke", "idle", "saturation", "frozen_worker", "frozen_tritonserver", "kill", "restart")
RECORDS = DrillRecords("Triton", DRILLS, "Triton start: model ready in", LOG_DIR)


def pytest_configure(config):
    TIER.stop_on_sigterm()


@pytest.fixture(scope="session")
def report() -> Report:
    report = RECORDS.keep(Report(path=REPORT_PATH, engine="triton"))
    report.exporter = {
        "poll_interval": POLL_INTERVAL_S,
        "stuck_after": STUCK_AFTER_S,
        "liveness_budget": LIVENESS_BUDGET_S,
        "canary_interval": CANARY_INTERVAL_S,
        "canary_timeout": CANARY_TIMEOUT_S,
    }
    report.vllm = {"version": VERSION, "model": MODEL, "instances": INSTANCES, "starts": []}
    yield report
    report.write()


@pytest.fixture(scope="module")
def triton(report: Report) -> TritonServer:
    """A real Triton on free loopback ports (HTTP, gRPC, metrics), stopped with all its children by PID."""
    missing = setup_missing()
    if missing:
        TIER.skip_or_fail(missing)
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
    yield from RECORDS.record(request, report)


def pytest_terminal_summary(terminalreporter):
    RECORDS.summarize(terminalreporter)
