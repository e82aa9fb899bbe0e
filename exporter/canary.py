"""The idle canary: one `max_tokens: 1`, `temperature: 0` completion, with a hard timeout.

The poller decides *when* (only after a poll that saw nothing running and nothing waiting, one in
flight per target); this module only sends it and classifies the answer as ok, error or timeout.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp

from exporter.engines import PageError
from exporter.settings import TargetSettings
from exporter.upstream import auth_headers, read_capped, read_models
from exporter.verdict import CanaryOutcome

MAX_ANSWER_BYTES = 256 * 1024


async def resolve_model(session: aiohttp.ClientSession, target: TargetSettings, timeout: float) -> str:
    """The configured model, else the first id `/v1/models` lists; raises PageError."""
    return target.model or (await read_models(session, target, timeout))[0]


async def send_canary(session: aiohttp.ClientSession, target: TargetSettings, model: str) -> CanaryOutcome:
    """POST one tiny completion; the whole exchange is bounded by `target.canary.timeout`."""
    payload = {"model": model, "prompt": target.canary.prompt, "max_tokens": 1, "temperature": 0}
    try:
        async with asyncio.timeout(target.canary.timeout):
            async with session.post(
                target.base_url + "/v1/completions", json=payload, headers=auth_headers(target.api_key),
                allow_redirects=False,
            ) as response:
                if response.status != 200:
                    # The body is not read, let alone echoed: an upstream may reflect request headers in its errors.
                    return CanaryOutcome("error", f"HTTP {response.status}")
                body = await read_capped(response, MAX_ANSWER_BYTES, "the answer")
    except TimeoutError:
        return CanaryOutcome("timeout", f"no answer within {target.canary.timeout:g}s")
    except PageError as exc:
        return CanaryOutcome("error", exc.detail)
    except (aiohttp.ClientError, OSError) as exc:
        return CanaryOutcome("error", type(exc).__name__)
    try:
        answer = json.loads(body)
    except ValueError:
        return CanaryOutcome("error", "answer is not JSON")
    if not isinstance(answer, dict) or not answer.get("choices"):
        return CanaryOutcome("error", "answer has no choices")
    return CanaryOutcome("ok")
