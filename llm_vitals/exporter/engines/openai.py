"""The OpenAI-compatible adapter: `/v1/models` is all it reads (proxies, and engines with no `/metrics`)."""

from __future__ import annotations

import json

from llm_vitals.exporter.engines import Engine, PageError


def parse_models(body: bytes) -> list[str]:
    """Model ids from a `/v1/models` answer, in order; raises PageError("bad_models") on anything else."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise PageError("bad_models", "/v1/models did not return JSON") from None
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        raise PageError("bad_models", "/v1/models has no 'data' list")
    ids = [item["id"] for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)]
    if not ids:
        raise PageError("bad_models", "/v1/models lists no model")
    return ids


# No /metrics worth reading: judged by /v1/models and the idle canary (the check the seed warns about).
ENGINE = Engine(name="openai", parse=None)
