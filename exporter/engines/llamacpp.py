"""The llama.cpp adapter (native `llama-server --metrics`): a stub until i12-llamacpp lands the real one.

The table facts below are from fixtures/llamacpp/RECIPE.md; `parse` is what the engine helper writes.
"""

from __future__ import annotations

from exporter.engines import Engine, EngineFacts, Page, PageError, Snapshot


def parse(page: Page) -> Snapshot:
    """Not written yet: every page is `bad_metrics`, so a llamacpp target reads `down`, never idle."""
    raise PageError("bad_metrics", "the llamacpp adapter is not written yet")


ENGINE = Engine(
    name="llamacpp",
    parse=parse,
    signature="llamacpp:",
    health_paths=("/health",),
    # ggml_time_us() at start: monotonic microseconds since boot, so only its change means anything.
    restart_header="Process-Start-Time-Unix",
    # The engine loop serves /metrics itself: accepted and never answered while work was pending is stuck.
    facts=EngineFacts(metrics_unanswered_is_stuck=True),
)
