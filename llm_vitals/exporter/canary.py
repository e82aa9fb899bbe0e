"""The idle canary: one tiny request to the engine, with a hard timeout.

The poller decides *when* (only after a poll that saw nothing running and nothing waiting, one in
flight per target); this module only sends it and classifies the answer as ok, error or timeout.
What is sent is the engine table's word (`Engine.canary`): by default a `max_tokens: 1`,
`temperature: 0` OpenAI completion; Triton's is a KServe v2 infer of the operator's request.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp

from llm_vitals.exporter.engines import Canary, PageError, WatchedTarget
from llm_vitals.exporter.engines.table import engine_of
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.upstream import auth_headers, read_capped, read_models
from llm_vitals.exporter.verdict import CanaryOutcome

MAX_ANSWER_BYTES = 256 * 1024


def _completion_body(target: WatchedTarget, model: str) -> object:
    return {"model": model, "prompt": target.canary.prompt, "max_tokens": 1, "temperature": 0}


def _completion_wrong(answer: object) -> str | None:
    return None if isinstance(answer, dict) and answer.get("choices") else "answer has no choices"


COMPLETION = Canary(path="/v1/completions", body=_completion_body, wrong=_completion_wrong)


def canary_of(target: TargetSettings) -> Canary:
    """The canary the target's engine takes."""
    return engine_of(target.engine).canary or COMPLETION


async def resolve_model(session: aiohttp.ClientSession, target: TargetSettings, timeout: float) -> str:
    """The configured model, else the first id `/v1/models` lists; raises PageError."""
    if target.model:
        return target.model
    if engine_of(target.engine).models_path is None:
        # Settings refuse such a target while its canary is on; this is the message if one gets here.
        raise PageError("no_model", f"engine {target.engine} lists no models: set the target's model")
    return (await read_models(session, target, timeout))[0]


async def send_canary(session: aiohttp.ClientSession, target: TargetSettings, model: str) -> CanaryOutcome:
    """POST one tiny request; the whole exchange is bounded by `target.canary.timeout`."""
    canary = canary_of(target)
    try:
        async with asyncio.timeout(target.canary.timeout):
            async with session.post(
                target.base_url + canary.path.replace("{model}", model), json=canary.body(target, model),
                headers=auth_headers(target.api_key), allow_redirects=False,
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
    wrong = canary.wrong(answer)
    return CanaryOutcome("error", wrong) if wrong else CanaryOutcome("ok")
