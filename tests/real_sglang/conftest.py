"""The real-SGLang tier: a real SGLang 0.5.23 server (CPU torch, tiny model) judged by the real exporter.

Collected only under LLM_VITALS_REAL_SGLANG=1, which `make test-sglang` (tools/real-sglang-test.sh)
sets: the main `pytest -n 2` run of tests/ never starts SGLang. When the venv or the tiny model is
missing the tier skips with one line; under LLM_VITALS_REQUIRE_REAL_SGLANG=1 (CI) that is a failure.

One server and one exporter serve the whole module; the drills run in file order, kill and restart
last. The fixtures and the report are the vLLM tier's (tests/real_vllm/), pointed at SGLang.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from real_vllm.drill_report import Report
from real_vllm.exporter_process import (
    CANARY_INTERVAL_S,
    CANARY_TIMEOUT_S,
    POLL_INTERVAL_S,
    ExporterProcess,
    Watcher,
)
from real_vllm.vllm_server import free_port

from .sglang_server import (
    CHUNKED_PREFILL_SIZE,
    CONTEXT_LENGTH,
    LIVENESS_BUDGET_S,
    LOG_DIR,
    MAX_RUNNING_REQUESTS,
    RUN_DIR,
    SGLANG_VERSION,
    STUCK_AFTER_S,
    SglangServer,
    setup_missing,
)

ENABLED = os.environ.get("LLM_VITALS_REAL_SGLANG") == "1"
REQUIRED = os.environ.get("LLM_VITALS_REQUIRE_REAL_SGLANG") == "1"
TARGET = "real-sglang"
REPORT_PATH = RUN_DIR / "real-sglang-report.json"

if not ENABLED:
    # Not part of the normal suite: `make test-sglang` runs the drills on their own.
    collect_ignore = ["test_real_sglang_drills.py"]


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    if ENABLED:
        # `timeout` (tools/real-sglang-test.sh) or CI ends a run with SIGTERM: turn it into the
        # KeyboardInterrupt pytest tears fixtures down on, so SGLang and the exporter are stopped by PID.
        signal.signal(signal.SIGTERM, _interrupt)


DRILLS = ("idle", "saturation", "prefill", "detokenizer", "hang", "kill", "restart")
_report: Report | None = None


def _skip_or_fail(why: str) -> None:
    message = f"SKIPPED: real-SGLang tier: {why}"
    if REQUIRED:
        pytest.fail(message + " [LLM_VITALS_REQUIRE_REAL_SGLANG=1 makes this a failure]", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def report() -> Report:
    global _report
    _report = Report(path=REPORT_PATH, engine="sglang")
    _report.exporter = {
        "poll_interval": POLL_INTERVAL_S,
        "stuck_after": STUCK_AFTER_S,
        "liveness_budget": LIVENESS_BUDGET_S,
        "canary_interval": CANARY_INTERVAL_S,
        "canary_timeout": CANARY_TIMEOUT_S,
    }
    _report.vllm = {
        "version": f"sglang {SGLANG_VERSION} on torch 2.13.0+cpu, sgl_kernel stand-in",
        "max_running_requests": MAX_RUNNING_REQUESTS,
        "context_length": CONTEXT_LENGTH,
        "chunked_prefill_size": CHUNKED_PREFILL_SIZE,
        "starts": [],
    }
    yield _report
    _report.write()


@pytest.fixture(scope="module")
def sglang(report: Report) -> SglangServer:
    """A real SGLang server on a free loopback port, stopped (with all its children) by PID at the end."""
    missing = setup_missing()
    if missing:
        _skip_or_fail(missing)
    server = SglangServer(port=free_port())
    try:
        server.start()
        yield server
    finally:
        server.stop()
        report.vllm["starts"] = server.starts
        report.vllm["leftover_pids_after_stop"] = [p.pid for p in server.leftovers()]
        report.write()


@pytest.fixture(scope="module")
def exporter(sglang: SglangServer) -> ExporterProcess:
    """The real exporter polling `sglang` every second as `engine: sglang` (stuck_after 10 s), stopped by PID at the end."""
    proc = ExporterProcess(vllm_url=sglang.url, target=TARGET, engine="sglang", log_dir=LOG_DIR,
                           stuck_after=STUCK_AFTER_S)
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
    terminalreporter.section("real-SGLang drills")
    for start in _report.vllm.get("starts", []):
        terminalreporter.write_line(f"SGLang start: ready in {start['seconds']:.1f} s (pid {start['pid']})")
    for record in _report.drills.values():
        terminalreporter.write_line(record.line())
    terminalreporter.write_line(f"report: {_report.path}; logs: {LOG_DIR}")
