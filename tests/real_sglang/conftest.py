"""The real-SGLang tier (`make test-sglang` sets LLM_VITALS_REAL_SGLANG=1): the kit's fixtures, SGLang as the engine."""

from __future__ import annotations

import pytest
from real_engine.fixtures import drill, exporter, kit, report, server, watcher  # noqa: F401 -- fixtures, found by name
from real_engine.fixtures import keep_call_report as pytest_runtest_makereport  # noqa: F401 -- a hook
from real_engine.fixtures import summarize as pytest_terminal_summary  # noqa: F401 -- a hook

from .engine import ENGINE, SglangEngine

# Only under the switch: the normal suite (`make test`, pytest -n 2 over tests/) never starts the engine.
collect_ignore = ENGINE.tier.left_out("test_real_sglang_drills.py")


@pytest.fixture(scope="session")
def engine() -> SglangEngine:
    return ENGINE
