"""Shared test plumbing: real binaries, free ports, and the one rule about skips.

A test that needs a real binary (promtool, prometheus, ...) asks `require_binary`. Where the binary
is missing it skips with one loud line saying how to get it; under LLM_VITALS_REQUIRE_REAL_STACK=1
(which .ci/run sets) that skip is a failure instead.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

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


def free_port() -> int:
    """A loopback port free right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_fixture(name: str) -> str:
    return (VLLM_FIXTURES / name).read_text()
