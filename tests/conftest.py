"""Shared test plumbing: real binaries, free ports, and the one rule about skips.

A test that needs a real binary (promtool, prometheus, ...) asks `require_binary`. Where the binary
is missing it skips with one loud line saying how to get it; under LLM_VITALS_REQUIRE_REAL_STACK=1
(which .ci/run sets) that skip is a failure instead.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

from llm_vitals.demo.ports import free_port  # noqa: F401 -- the tests' one free-port helper, shared with the demo

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
VLLM_FIXTURES = FIXTURES / "vllm"
AM_FIXTURES = FIXTURES / "alertmanager"

_HOW_TO_GET = {
    "promtool": "apt-get install --no-install-recommends prometheus",
    "prometheus": "apt-get install --no-install-recommends prometheus",
    "prometheus-alertmanager": "apt-get install --no-install-recommends prometheus-alertmanager",
    "amtool": "apt-get install --no-install-recommends prometheus-alertmanager",
    "docker-compose": "apt-get install --no-install-recommends docker-compose",
    "chromium": "apt-get install --no-install-recommends chromium",
}


def real_stack_required() -> bool:
    return os.environ.get("LLM_VITALS_REQUIRE_REAL_STACK") == "1"


def load_script(path: Path):
    """Import a script that is not in a package (dashboards/, bench/, deploy/) as a module.

    Registered in sys.modules under a name from its path, because dataclasses and NamedTuple
    look their defining module up while the script runs.
    """
    name = "script_" + "_".join(path.relative_to(REPO).with_suffix("").parts)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def require_binary(name: str) -> str:
    """Path of a real binary, or a loud skip (a failure when the real stack is required)."""
    path = shutil.which(name)
    if path:
        return path
    message = f"SKIPPED: real '{name}' not found; get it with: {_HOW_TO_GET.get(name, 'apt-get install ' + name)} (or `make test` as root)"
    if real_stack_required():
        pytest.fail(message + " [LLM_VITALS_REQUIRE_REAL_STACK=1 makes this a failure]")
    print(message)
    pytest.skip(message)



def read_fixture(name: str) -> str:
    return (VLLM_FIXTURES / name).read_text()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Print how many examples each property test ran (tests/property.py records them)."""
    rows = []
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        if report.when != "call":
            continue
        for key, value in getattr(report, "user_properties", ()):
            if key == "hypothesis_examples":
                rows.append((report.nodeid, value))
    if rows:
        terminalreporter.section("property tests: examples run")
        for nodeid, count in sorted(rows):
            terminalreporter.write_line(f"{count:>7}  {nodeid}")
