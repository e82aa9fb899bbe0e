"""The real-llama.cpp tier: a real `llama-server` (CPU, a tiny GGUF) judged by the real exporter.

Collected only under LLM_VITALS_REAL_LLAMACPP=1, which `make test-llamacpp`
(tools/real-llamacpp-test.sh) sets after building the binary and the model: the main `pytest -n 2`
run of tests/ never starts llama-server. When the binary or the model is missing the tier skips with
one line; under LLM_VITALS_REQUIRE_REAL_LLAMACPP=1 (CI) that is a failure.

One server and one exporter serve the whole module; the drills run in file order, so the kill and
restart drills come last. The verdict harness (ExporterProcess, Watcher, Report) is the vLLM tier's.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from real_vllm.drill_report import Report
from real_vllm.exporter_process import ExporterProcess, Watcher

from .llamacpp_server import BATCH, CONTEXT, LOG_DIR, OUT, SLOTS, LlamaServer, setup_missing
from .timing import (
    CANARY_INTERVAL_S,
    CANARY_TIMEOUT_S,
    METRICS_TIMEOUT_S,
    POLL_INTERVAL_S,
    STUCK_AFTER_S,
    TARGET,
    exporter_config,
)

ENABLED = os.environ.get("LLM_VITALS_REAL_LLAMACPP") == "1"
REQUIRED = os.environ.get("LLM_VITALS_REQUIRE_REAL_LLAMACPP") == "1"
REPORT_PATH = OUT / "report.json"

if not ENABLED:
    # Not part of the normal suite: `make test-llamacpp` runs the drills on their own.
    collect_ignore = ["test_real_llamacpp_drills.py"]


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    if ENABLED:
        # `timeout` (tools/real-llamacpp-test.sh) ends a run with SIGTERM: make it the KeyboardInterrupt
        # pytest tears fixtures down on, so llama-server and the exporter are still stopped by PID.
        signal.signal(signal.SIGTERM, _interrupt)


DRILLS = ("smoke", "idle", "saturation", "frozen", "sigstop", "kill", "restart")
_report: Report | None = None


def _skip_or_fail(why: str) -> None:
    message = f"SKIPPED: real-llama.cpp tier: {why}"
    if REQUIRED:
        pytest.fail(message + " [LLM_VITALS_REQUIRE_REAL_LLAMACPP=1 makes this a failure]", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def report() -> Report:
    global _report
    _report = Report(path=REPORT_PATH)
    _report.exporter = {
        "poll_interval": POLL_INTERVAL_S,
        "stuck_after": STUCK_AFTER_S,
        "metrics_timeout": METRICS_TIMEOUT_S,
        "canary_interval": CANARY_INTERVAL_S,
        "canary_timeout": CANARY_TIMEOUT_S,
    }
    # Report keeps the server's facts under "vllm"; tools/real-llamacpp-report.py reads them from there.
    _report.vllm = {
        "version": "llama.cpp llama-server 0c1e570 (llama-cpp-python 0.3.36 sdist), portable x86-64-v2 (GGML_NATIVE=OFF)",
        "slots": SLOTS,
        "context": CONTEXT,
        "batch": BATCH,
        "starts": [],
    }
    yield _report
    _report.write()


@pytest.fixture(scope="module")
def server(report: Report) -> LlamaServer:
    """A real llama-server on a free loopback port, stopped by PID at the end."""
    missing = setup_missing()
    if missing:
        _skip_or_fail(missing)
    from demo.ports import free_port

    srv = LlamaServer(port=free_port())
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()
        report.vllm["starts"] = srv.starts
        report.write()


@pytest.fixture(scope="module")
def exporter(server: LlamaServer) -> ExporterProcess:
    """The real exporter polling `server` every second (engine: llamacpp), stopped by PID at the end."""
    proc = ExporterProcess(vllm_url=server.url, target=TARGET, engine="llamacpp", log_dir=LOG_DIR,
                           config=lambda port: exporter_config(port, server.url))
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
    terminalreporter.section("real-llama.cpp drills")
    for start in _report.vllm.get("starts", []):
        terminalreporter.write_line(f"llama-server start: ready in {start['seconds']:.1f} s (pid {start['pid']})")
    for record in _report.drills.values():
        terminalreporter.write_line(record.line())
    terminalreporter.write_line(f"report: {_report.path}; logs: {LOG_DIR}")
