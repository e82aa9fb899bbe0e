"""The content type our own /metrics pages are served with, for what they are."""

from __future__ import annotations

# Both tools write the classic text format: legacy metric names, no UTF-8 quoting, no exemplars.
# prometheus-client's CONTENT_TYPE_LATEST now says version=1.0.0 (UTF-8 names), which these pages
# are not; this says what they are, so a scraper parses them as such.
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
