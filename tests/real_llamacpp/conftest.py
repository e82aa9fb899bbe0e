"""The real-llama.cpp tier (`make test-llamacpp` sets LLM_VITALS_REAL_LLAMACPP=1): the kit's fixtures and llama-server."""

from __future__ import annotations

import pytest
from real_engine.fixtures import drill, exporter, kit, report, server, watcher  # noqa: F401 -- fixtures, found by name
from real_engine.fixtures import keep_call_report as pytest_runtest_makereport  # noqa: F401 -- a hook
from real_engine.fixtures import summarize as pytest_terminal_summary  # noqa: F401 -- a hook

from .engine import ENGINE, LlamacppEngine

# Only under the switch: the normal suite (`make test`, pytest -n 2 over tests/) never starts the engine.
collect_ignore = ENGINE.tier.left_out("test_real_llamacpp_drills.py", "test_real_llamacpp_pace.py")


@pytest.fixture(scope="session")
def engine() -> LlamacppEngine:
    return ENGINE


@pytest.fixture
def built(engine: LlamacppEngine) -> None:
    """For a drill that starts servers of its own: the tier's one line when llama-server is not built, as the
    kit's `server` fixture says it (a skip, or a failure where the tier is required)."""
    if missing := engine.setup_missing():
        engine.tier.skip_or_fail(missing)
