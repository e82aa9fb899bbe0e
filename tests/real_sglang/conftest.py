"""The real-SGLang tier: a real SGLang 0.5.23 server (CPU torch, tiny model) judged by the real exporter.

Collected only under LLM_VITALS_REAL_SGLANG=1, which `make test-sglang` (tools/real-sglang-test.sh)
sets: the main `pytest -n 2` run of tests/ never starts SGLang. When the venv or the tiny model is
missing the tier skips with one line; under LLM_VITALS_REQUIRE_REAL_SGLANG=1 (CI) that is a failure.

One server and one exporter serve the whole module; the drills run in file order, kill and restart
last. The fixtures and the report are the vLLM tier's (tests/real_vllm/), pointed at SGLang.
"""

from __future__ import annotations

import pytest
from real_tier import DrillRecords, RealTier
from real_tier import keep_call_report as pytest_runtest_makereport  # noqa: F401 -- a hook: pytest finds it by name
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

TIER = RealTier("SGLang", enable="LLM_VITALS_REAL_SGLANG", require="LLM_VITALS_REQUIRE_REAL_SGLANG")
TARGET = "real-sglang"
REPORT_PATH = RUN_DIR / "real-sglang-report.json"
# Not part of the normal suite: `make test-sglang` runs the drills on their own.
collect_ignore = TIER.left_out("test_real_sglang_drills.py")

DRILLS = ("idle", "saturation", "prefill", "detokenizer", "hang", "kill", "restart")
RECORDS = DrillRecords("SGLang", DRILLS, "SGLang start: ready in", LOG_DIR)


def pytest_configure(config):
    TIER.stop_on_sigterm()


@pytest.fixture(scope="session")
def report() -> Report:
    report = RECORDS.keep(Report(path=REPORT_PATH, engine="sglang"))
    report.exporter = {
        "poll_interval": POLL_INTERVAL_S,
        "stuck_after": STUCK_AFTER_S,
        "liveness_budget": LIVENESS_BUDGET_S,
        "canary_interval": CANARY_INTERVAL_S,
        "canary_timeout": CANARY_TIMEOUT_S,
    }
    report.vllm = {
        "version": f"sglang {SGLANG_VERSION} on torch 2.13.0+cpu, sgl_kernel stand-in",
        "max_running_requests": MAX_RUNNING_REQUESTS,
        "context_length": CONTEXT_LENGTH,
        "chunked_prefill_size": CHUNKED_PREFILL_SIZE,
        "starts": [],
    }
    yield report
    report.write()


@pytest.fixture(scope="module")
def sglang(report: Report) -> SglangServer:
    """A real SGLang server on a free loopback port, stopped (with all its children) by PID at the end."""
    missing = setup_missing()
    if missing:
        TIER.skip_or_fail(missing)
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
    yield from RECORDS.record(request, report)


def pytest_terminal_summary(terminalreporter):
    RECORDS.summarize(terminalreporter)
