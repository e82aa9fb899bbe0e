"""The TGI adapter: a stub until the adapter from TGI's own source lands (never checked against a live TGI)."""

from __future__ import annotations

from exporter.engines import Engine, Page, PageError, Snapshot


def parse(page: Page) -> Snapshot:
    """Not written yet: every page is `bad_metrics`, so a tgi target reads `down`, never idle."""
    raise PageError("bad_metrics", "the tgi adapter is not written yet")


ENGINE = Engine(name="tgi", parse=parse, signature="tgi_", health_paths=("/health",))
