"""Kubernetes' time formats, as objects written to the API server carry them."""

from __future__ import annotations

from datetime import UTC, datetime


def micro_time(unix: float) -> str:
    """A MicroTime: exactly six fractional digits (isoformat drops them when they are zero, and 1.20 refuses that)."""
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
