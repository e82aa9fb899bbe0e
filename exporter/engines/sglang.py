"""The SGLang adapter: a stub until i12-sglang lands the real one.

The table facts below are from fixtures/sglang/RECIPE.md; `parse` is what the engine helper writes.
"""

from __future__ import annotations

from exporter.engines import Engine, Page, PageError, Snapshot


def parse(page: Page) -> Snapshot:
    """Not written yet: every page is `bad_metrics`, so an sglang target reads `down`, never idle."""
    raise PageError("bad_metrics", "the sglang adapter is not written yet")


ENGINE = Engine(
    name="sglang",
    parse=parse,
    signature="sglang:",
    # 503 after 20 s of a frozen scheduler (SGLANG_HEALTH_CHECK_TIMEOUT); a healthy answer takes ~1 s.
    health_paths=("/health",),
)
