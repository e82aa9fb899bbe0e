"""The idle canary: one tiny request to the engine, with a hard timeout, and what its answer means.

The poller decides *when* (only after a poll that saw nothing running and nothing waiting, one in
flight per target); this module sends it and says what the answer means (`judge_answer`, pure):

- `ok`: a 2xx with a real answer;
- a failed canary, `timeout` or `error`: no answer in time, a reset or refused connection, or a 5xx.
  Only these count toward `unresponsive`, which a restart may fix;
- `rejected`: the server answered, and refused what was asked: 501 (Not Implemented: Triton's
  answer to an infer of a decoupled model, which only its generate-stream route serves), any other
  status below 500 (404 a model it
  does not serve or a route it lacks, 401/403 a key it does not take, 400/422 a body it does not
  accept, a redirect) or a 2xx that is not the answer asked for. A restart cannot fix any of these
  (the model is renamed, the key rotated, the server serves only chat or only embeddings), so a
  rejection is shown (reason `canary_rejected`) and alerted with `remediation: none`, never counted
  as a failure. The status decides, never the body's text (an upstream may echo request headers).

What is sent is the engine table's word (`Engine.canary`): Triton's is a KServe v2 infer of the
operator's request, and for a model whose own config says decoupled, the same request on its
generate-stream route, judged by its first event (exporter/decoupled.py). The OpenAI-compatible
engines have no fixed one: by default (`canary.endpoint: auto`) the canary follows what the server
serves, trying a 1-token completion, then a 1-token chat completion, then an embedding of the
prompt, while each is rejected; the first that answers is kept for the target's next canaries. A
target may name its endpoint (`completions`, `chat`, `embeddings`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import aiohttp

from llm_vitals.exporter.decoupled import canary_for
from llm_vitals.exporter.engines import Canary, ModelConfig, PageError, WatchedTarget
from llm_vitals.exporter.engines.openai import parse_models
from llm_vitals.exporter.engines.table import engine_of
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.upstream import MODELS_MAX_BYTES, auth_headers, bounded_get, read_capped
from llm_vitals.exporter.verdict import CanaryOutcome

MAX_ANSWER_BYTES = 256 * 1024


def _completion_body(target: WatchedTarget, model: str) -> object:
    return {"model": model, "prompt": target.canary.prompt, "max_tokens": 1, "temperature": 0}


def _chat_body(target: WatchedTarget, model: str) -> object:
    return {"model": model, "messages": [{"role": "user", "content": target.canary.prompt}],
            "max_tokens": 1, "temperature": 0}


def _embeddings_body(target: WatchedTarget, model: str) -> object:
    return {"model": model, "input": target.canary.prompt}


def _choices_wrong(answer: object) -> str | None:
    return None if isinstance(answer, dict) and answer.get("choices") else "answer has no choices"


def _embedding_wrong(answer: object) -> str | None:
    return None if isinstance(answer, dict) and answer.get("data") else "answer has no data"


COMPLETION = Canary(path="/v1/completions", body=_completion_body, wrong=_choices_wrong)
CHAT = Canary(path="/v1/chat/completions", body=_chat_body, wrong=_choices_wrong)
EMBEDDINGS = Canary(path="/v1/embeddings", body=_embeddings_body, wrong=_embedding_wrong)
# `canary.endpoint` -> the canary; `auto` tries them in this order while each is rejected.
ENDPOINTS: dict[str, Canary] = {"completions": COMPLETION, "chat": CHAT, "embeddings": EMBEDDINGS}

# What a rejecting status most likely means, for the detail a human reads.
_REJECTIONS = {
    400: "the request was refused as malformed",
    401: "the API key was refused (rotated, or none set)",
    403: "the API key is not allowed this request",
    404: "the model or the route is not served (a renamed model, a chat-only or embeddings server?)",
    405: "the route does not take a POST",
    422: "the request was refused as malformed",
    429: "rate limited",
    # HTTP's own "Not Implemented": the route cannot serve this model, for good (Triton's infer route
    # and a decoupled model). Decided by the status, never by the body's text.
    501: "the route does not serve this model (Triton: a decoupled model answers only on generate_stream)",
}


def judge_answer(status: int, body: bytes, canary: Canary) -> CanaryOutcome:
    """What one answer to a canary means (pure): ok, a failed canary (`error`), or `rejected`."""
    if status >= 500 and status != 501:
        return CanaryOutcome("error", f"{canary.path} answered HTTP {status}")
    if not 200 <= status < 300:
        why = _REJECTIONS.get(status, "a redirect: the url is not the server's API" if 300 <= status < 400
                              else "the request was refused")
        return CanaryOutcome("rejected", f"{canary.path} answered HTTP {status}: {why}")
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return CanaryOutcome("rejected", f"{canary.path} answered HTTP {status}, not JSON")
    wrong = canary.wrong(answer)
    return CanaryOutcome("rejected", f"{canary.path} answered HTTP {status}, {wrong}") if wrong else CanaryOutcome("ok")


def canaries_of(target: TargetSettings, learned: str | None = None,
                config: ModelConfig | None = None) -> tuple[Canary, ...]:
    """The canaries to try, in order: the engine's own (for the model's `config`), the target's endpoint,
    or (auto) the one that last answered (`learned`, a path) and then the rest of ENDPOINTS."""
    own = canary_for(engine_of(target.engine), config)
    if own is not None:
        return (own,)
    if target.canary.endpoint != "auto":
        return (ENDPOINTS[target.canary.endpoint],)
    ladder = tuple(ENDPOINTS.values())
    first = tuple(c for c in ladder if c.path == learned)
    return (*first, *(c for c in ladder if c not in first))


class ModelRejected(Exception):
    """`/v1/models` answered, and not with a model list the canary can use: a rejection, not a failure."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


async def resolve_model(session: aiohttp.ClientSession, target: TargetSettings, timeout: float) -> str:
    """The configured model, else the first id `/v1/models` lists.

    Raises PageError when `/v1/models` did not answer (a timeout, a reset: a failed canary) or
    answered 5xx, and ModelRejected when it answered 4xx or with no usable list.
    """
    if target.model:
        return target.model
    if engine_of(target.engine).models_path is None:
        # Settings refuse such a target while its canary is on; this is the message if one gets here.
        raise ModelRejected(f"engine {target.engine} lists no models: set the target's model")
    status, body = await bounded_get(session, target.base_url + "/v1/models", timeout=timeout,
                                     max_bytes=MODELS_MAX_BYTES, headers=auth_headers(target.api_key))
    if status >= 500:
        raise PageError("http_status", f"/v1/models answered HTTP {status}")
    if status != 200:
        raise ModelRejected(f"/v1/models answered HTTP {status}: {_REJECTIONS.get(status, 'the request was refused')}")
    try:
        return parse_models(body)[0]
    except PageError as exc:
        raise ModelRejected(exc.detail) from None


async def ask(session: aiohttp.ClientSession, target: TargetSettings, model: str, canary: Canary) -> CanaryOutcome:
    """POST one canary; the whole exchange is bounded by `target.canary.timeout`."""
    try:
        async with asyncio.timeout(target.canary.timeout):
            async with session.post(
                target.base_url + canary.path.replace("{model}", model), json=canary.body(target, model),
                headers=auth_headers(target.api_key), allow_redirects=False,
            ) as response:
                # A refused request's body is not read, let alone echoed: an upstream may reflect
                # request headers in its errors.
                body = b""
                if 200 <= response.status < 300:
                    body = (await first_event(response, MAX_ANSWER_BYTES) if canary.stream
                            else await read_capped(response, MAX_ANSWER_BYTES, "the answer"))
                return judge_answer(response.status, body, canary)
    except TimeoutError:
        return CanaryOutcome("timeout", f"no answer within {target.canary.timeout:g}s")
    except PageError as exc:  # over MAX_ANSWER_BYTES: not the 1-token answer asked for
        return CanaryOutcome("rejected", exc.detail)
    except (aiohttp.ClientError, OSError) as exc:
        return CanaryOutcome("error", f"{canary.path}: {type(exc).__name__}")


async def first_event(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The data of a server-sent event stream's first `data:` event (b"": the stream ended with none).

    The rest is not waited for: leaving the response closes the connection, and the server ends the stream.
    """
    seen = 0
    data: list[bytes] = []
    while True:
        line = await response.content.readline()
        seen += len(line)
        if seen > max_bytes:
            raise PageError("too_large", f"the first event is over the {max_bytes}-byte cap")
        line = line.rstrip(b"\r\n")
        if line.startswith(b"data:"):
            data.append(line[5:].strip())
        elif not line and (data or response.content.at_eof()):
            return b"\n".join(data)  # an empty line ends an event, and the end of the stream the last


@dataclass(frozen=True, slots=True)
class CanaryRun:
    """One canary's outcome, and the canary that answered (its path), to try first next time."""

    outcome: CanaryOutcome
    path: str | None = None


async def run_canaries(session: aiohttp.ClientSession, target: TargetSettings, model: str,
                       learned: str | None = None, config: ModelConfig | None = None) -> CanaryRun:
    """Ask the target's canaries in turn while each is rejected; the first answer that is not a rejection
    ends it. All rejected: the first rejection, with what the others answered."""
    rejections: list[CanaryOutcome] = []
    for canary in canaries_of(target, learned, config):
        outcome = await ask(session, target, model, canary)
        if outcome.result != "rejected":
            return CanaryRun(outcome, canary.path if outcome.result == "ok" else learned)
        rejections.append(outcome)
    return CanaryRun(CanaryOutcome("rejected", "; ".join(r.detail for r in rejections)))
