"""The Triton adapter: a stub until i12-triton lands the real one.

The table facts below are from fixtures/triton/RECIPE.md; `parse` is what the engine helper writes.
"""

from __future__ import annotations

from exporter.engines import Engine, Page, PageError, Snapshot


def parse(page: Page) -> Snapshot:
    """Not written yet: every page is `bad_metrics`, so a triton target reads `down`, never idle."""
    raise PageError("bad_metrics", "the triton adapter is not written yet")


ENGINE = Engine(
    name="triton",
    parse=parse,
    signature="nv_inference_",
    # Metrics on their own port (a target's metrics_url overrides): url's host, port 8002, /metrics.
    metrics_port=8002,
    health_paths=("/v2/health/live",),
    models_path=None,  # no /v1/models: models are named in the repository index or the config
)
