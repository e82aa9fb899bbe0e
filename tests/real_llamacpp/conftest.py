"""The real-llama.cpp tier: a real `llama-server` (CPU, a tiny GGUF) judged by the real exporter.

Collected only under LLM_VITALS_REAL_LLAMACPP=1, which `make test-llamacpp`
(tools/real-llamacpp-test.sh) sets after building the binary and the model: the main `pytest -n 2`
run of tests/ never starts llama-server. When the binary or the model is missing the tier skips with
one line; under LLM_VITALS_REQUIRE_REAL_LLAMACPP=1 (CI) that is a failure.

One server and one exporter serve the whole module; the drills run in file order, so the kill and
restart drills come last. The verdict harness (ExporterProcess, Watcher, Report) is the vLLM tier's.
"""

from __future__ import annotations

import pytest
from real_tier import DrillRecords, RealTier
from real_tier import keep_call_report as pytest_runtest_makereport  # noqa: F401 -- a hook: pytest finds it by name
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

TIER = RealTier("llama.cpp", enable="LLM_VITALS_REAL_LLAMACPP", require="LLM_VITALS_REQUIRE_REAL_LLAMACPP")
REPORT_PATH = OUT / "report.json"
# Not part of the normal suite: `make test-llamacpp` runs the drills on their own.
collect_ignore = TIER.left_out("test_real_llamacpp_drills.py")

DRILLS = ("smoke", "idle", "saturation", "frozen", "sigstop", "kill", "restart")
RECORDS = DrillRecords("llama.cpp", DRILLS, "llama-server start: ready in", LOG_DIR)


def pytest_configure(config):
    TIER.stop_on_sigterm()


@pytest.fixture(scope="session")
def report() -> Report:
    report = RECORDS.keep(Report(path=REPORT_PATH))
    report.exporter = {
        "poll_interval": POLL_INTERVAL_S,
        "stuck_after": STUCK_AFTER_S,
        "metrics_timeout": METRICS_TIMEOUT_S,
        "canary_interval": CANARY_INTERVAL_S,
        "canary_timeout": CANARY_TIMEOUT_S,
    }
    # Report keeps the server's facts under "vllm"; tools/real-llamacpp-report.py reads them from there.
    report.vllm = {
        "version": "llama.cpp llama-server 0c1e570 (llama-cpp-python 0.3.36 sdist), portable x86-64-v2 (GGML_NATIVE=OFF)",
        "slots": SLOTS,
        "context": CONTEXT,
        "batch": BATCH,
        "starts": [],
    }
    yield report
    report.write()


@pytest.fixture(scope="module")
def server(report: Report) -> LlamaServer:
    """A real llama-server on a free loopback port, stopped by PID at the end."""
    missing = setup_missing()
    if missing:
        TIER.skip_or_fail(missing)
    from llm_vitals.demo.ports import free_port

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
    yield from RECORDS.record(request, report)


def pytest_terminal_summary(terminalreporter):
    RECORDS.summarize(terminalreporter)
