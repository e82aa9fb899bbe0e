"""What every real-part tier's conftest shares (tests/real_vllm/, real_sglang/, real_triton/,
real_llamacpp/, real_docker/, k8s/): its two switches, what the normal suite leaves uncollected,
SIGTERM as a teardown, and the skip that is a failure when the tier is required; for the engine
tiers, also the drill records and the summary at the end.

A tier's conftest names its own switches, files and messages and calls this; what really differs
(the servers, the report's facts) stays in the conftest. Imported as `real_tier`: `tests/` is on
sys.path under pytest (rootdir conftest, prepend import mode), as for `from conftest import ...`.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest


class RealTier:
    """One tier's switches: `enable` collects it (its Makefile target and tools/real-*-test.sh set
    it), `require` makes its skip a failure (CI's .ci/run sets it). Read once, at import, as the
    conftests did."""

    def __init__(self, name: str, *, enable: str, require: str) -> None:
        self.name = name  # as in "real-vLLM tier"
        self.require_var = require
        self.enabled = os.environ.get(enable) == "1"
        self.required = os.environ.get(require) == "1"

    def left_out(self, *patterns: str) -> list[str]:
        """What the conftest's `collect_ignore` / `collect_ignore_glob` holds: these unless the tier
        is switched on, so `make test` (pytest -n 2 over tests/) never starts a real part."""
        return [] if self.enabled else list(patterns)

    def stop_on_sigterm(self) -> None:
        """Call from pytest_configure. `timeout` (tools/real-*-test.sh) or CI ends a run with SIGTERM:
        turn it into the KeyboardInterrupt pytest tears fixtures down on, so the real servers (in
        sessions of their own, they would not get the signal) are still stopped by PID."""
        if self.enabled:
            signal.signal(signal.SIGTERM, _interrupt)

    def skip_or_fail(self, why: str) -> NoReturn:
        """One line saying why the tier cannot run here: a skip, or a failure when it is required."""
        message = f"SKIPPED: real-{self.name} tier: {why}"
        if self.required:
            pytest.fail(message + f" [{self.require_var}=1 makes this a failure]", pytrace=False)
        pytest.skip(message)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


class DrillRecords:
    """The engine tiers' drill bookkeeping: each drill test's record in the report (outcome and
    duration filled in after it), and the summary printed at the end of the run.

    `drills` names the records: a test is filed under the first drill its name (minus `test_`)
    starts with. `started` begins each server-start line of the summary ("vLLM start: ready in").
    """

    def __init__(self, name: str, drills: tuple[str, ...], started: str, log_dir: Path) -> None:
        self.name = name
        self.drills = drills
        self.started = started
        self.log_dir = log_dir
        self.report: Any = None  # the session's Report (tests/real_vllm/drill_report.py), once made

    def keep(self, report):
        """The session's report, kept for the summary."""
        self.report = report
        return report

    def record(self, request: pytest.FixtureRequest, report) -> Iterator:
        """The `drill` fixture's body: `yield from RECORDS.record(request, report)`."""
        test = request.node.name.removeprefix("test_")
        record = report.drill(next((d for d in self.drills if test.startswith(d)), test))
        began = time.monotonic()
        yield record
        record.seconds = round(time.monotonic() - began, 1)
        if "watcher" in request.fixturenames:
            record.facts.update(request.getfixturevalue("watcher").health(record.started))
        rep = getattr(request.node, "rep_call", None)  # set by keep_call_report
        record.outcome = rep.outcome if rep is not None else "error"
        report.write()

    def summarize(self, terminalreporter) -> None:
        """The body of pytest_terminal_summary: a line per server start and per drill."""
        if self.report is None or not self.report.drills:
            return
        terminalreporter.section(f"real-{self.name} drills")
        for start in self.report.vllm.get("starts", []):
            terminalreporter.write_line(f"{self.started} {start['seconds']:.1f} s (pid {start['pid']})")
        for record in self.report.drills.values():
            terminalreporter.write_line(record.line())
        terminalreporter.write_line(f"report: {self.report.path}; logs: {self.log_dir}")


@pytest.hookimpl(hookwrapper=True)
def keep_call_report(item, call):
    """A pytest_runtest_makereport hook for an engine tier's conftest to import under that name:
    it keeps the test's call-phase report on the item, where DrillRecords.record reads the outcome."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep
