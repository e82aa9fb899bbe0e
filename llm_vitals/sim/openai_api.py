"""Parsing and answering the OpenAI-compatible requests the way vLLM 0.32 does.

Pure helpers: turn a JSON body into a validated `SimRequest` (or a vLLM-style error), count prompt
tokens, and build the response and SSE chunk bodies. The aiohttp handlers live in `simulator.server`.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from dataclasses import dataclass
from typing import Any

from llm_vitals.sim.config import VLLM_VERSION, SimConfig
from llm_vitals.sim.engine import SimRequest

SYSTEM_FINGERPRINT = f"vllm-{VLLM_VERSION}-0f4233a9"
# Completions default to 16 tokens, as in vLLM's CompletionRequest.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# With no max_tokens, a chat reply stands in for an end-of-sequence after this many tokens
# ("stop"), unless ignore_eos asks for the whole context (then it is "length", as in vLLM).
CHAT_SIMULATED_EOS_TOKENS = 16
# Chat template overhead of the captured tiny model: "hi" as one user message was 21 prompt tokens.
_CHAT_TEMPLATE_TOKENS = 12
_PER_MESSAGE_TOKENS = 8
_WORDS = ("the", " model", " token", " engine", " batch", " step", " queue", " cache", " prefill", " decode",
          " health", " server", " metric", " counter", " slot", " chunk")


class ApiError(Exception):
    """An error answered in vLLM's JSON shape: {"error": {"message", "type", "param", "code"}}."""

    _TYPES = {400: "BadRequestError", 404: "NotFoundError", 409: "ConflictError", 500: "InternalServerError",
              503: "ServiceUnavailableError"}

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param)


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = ApiError._TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def count_text_tokens(text: str) -> int:
    """A stand-in tokenizer: about four UTF-8 bytes per token, at least one."""
    return max(1, math.ceil(len(text.encode("utf-8")) / 4))


@dataclass
class ParsedRequest:
    """A validated completion request: what the engine runs plus how to answer."""

    kind: str  # "completion" | "chat"
    sim: SimRequest
    stream: bool
    include_usage: bool
    echo_model: str


def _require_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'{name}' must be an integer, got {value!r}", name)
    if value < 1:
        raise ApiError(400, f"{name} must be at least 1, got {value}.", name)
    return value


def _require_bool(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false, got {value!r}", name)
    return value


def _prompt_tokens_of_completion(prompt: Any) -> int:
    # One prompt per request: a string, a list of token ids, or a one-element list of either.
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(400, "'prompt' must not be empty", "prompt")
        return count_text_tokens(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt)
    raise ApiError(400, "'prompt' must be a non-empty string or a list of token ids "
                        "(the simulator takes one prompt per request)", "prompt")


def _prompt_tokens_of_chat(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list of {\"role\", \"content\"} objects", "messages")
    total = _CHAT_TEMPLATE_TOKENS
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, f"messages[{index}] must be an object with a string 'role'", "messages")
        content = message.get("content", "")
        if isinstance(content, list):  # content parts: count the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if content is not None and not isinstance(content, str):
            raise ApiError(400, f"messages[{index}].content must be a string or a list of parts", "messages")
        total += _PER_MESSAGE_TOKENS + (count_text_tokens(content) if content else 0)
    return total


def parse_request(kind: str, body: Any, config: SimConfig) -> ParsedRequest:
    """Validate a /v1/completions ("completion") or /v1/chat/completions ("chat") body."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != config.model:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise ApiError(400, f"the simulator serves n=1 only, got n={n!r}", "n")
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or temperature < 0):
        raise ApiError(400, f"'temperature' must be a number >= 0, got {temperature!r}", "temperature")
    stream = _require_bool(body, "stream")
    ignore_eos = _require_bool(body, "ignore_eos")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise ApiError(400, "'stream_options' must be an object", "stream_options")
    include_usage = bool(stream_options.get("include_usage", False))

    if kind == "completion":
        if "prompt" not in body:
            raise ApiError(400, "'prompt' is required", "prompt")
        prompt_tokens = _prompt_tokens_of_completion(body["prompt"])
        max_tokens = _require_int(body, "max_tokens")
    else:
        if "messages" not in body:
            raise ApiError(400, "'messages' is required", "messages")
        prompt_tokens = _prompt_tokens_of_chat(body["messages"])
        max_tokens = _require_int(body, "max_completion_tokens") or _require_int(body, "max_tokens")

    limit = config.max_model_len
    if prompt_tokens >= limit:
        raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, your request has "
                            f"{prompt_tokens} input tokens. Please reduce the length of the input messages.")
    room = limit - prompt_tokens
    finish_reason = "length"
    if max_tokens is None:
        if kind == "completion":
            max_tokens = min(COMPLETIONS_DEFAULT_MAX_TOKENS, room)
        elif ignore_eos:
            max_tokens = room
        else:
            max_tokens, finish_reason = min(CHAT_SIMULATED_EOS_TOKENS, room), "stop"
    elif max_tokens > room:
        raise ApiError(400, f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                            f"context length is {limit} tokens and your request has {prompt_tokens} input tokens "
                            f"({max_tokens} > {limit} - {prompt_tokens}).", "max_tokens")
    prefix = "cmpl" if kind == "completion" else "chatcmpl"
    sim = SimRequest(request_id=f"{prefix}-{secrets.token_hex(8)}", prompt_tokens=prompt_tokens,
                     max_tokens=max_tokens, finish_reason=finish_reason)
    return ParsedRequest(kind, sim, stream, include_usage, config.model)


def token_text(request_id: str, index: int) -> str:
    """The text of a request's `index`-th generated token: deterministic, looks like words."""
    digest = hashlib.blake2b(f"{request_id}:{index}".encode(), digest_size=2).digest()
    return _WORDS[digest[0] % len(_WORDS)]


def generated_text(request_id: str, start: int, count: int) -> str:
    return "".join(token_text(request_id, i) for i in range(start, start + count))


def usage(parsed: ParsedRequest, completion_tokens: int) -> dict[str, Any]:
    prompt = parsed.sim.prompt_tokens
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion_tokens,
            "completion_tokens": completion_tokens, "prompt_tokens_details": None}


def full_response(parsed: ParsedRequest, completion_tokens: int, finish_reason: str, created: int) -> dict[str, Any]:
    """The non-streaming answer, shaped like vLLM's."""
    text = generated_text(parsed.sim.request_id, 0, completion_tokens)
    if parsed.kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                                  "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                                  "prompt_token_ids": None}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None, "annotations": None,
                                          "audio": None, "function_call": None, "tool_calls": [], "reasoning": None},
                  "logprobs": None, "finish_reason": finish_reason, "stop_reason": None, "token_ids": None}
        obj = "chat.completion"
    return {"id": parsed.sim.request_id, "object": obj, "created": created, "model": parsed.echo_model,
            "choices": [choice], "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": usage(parsed, completion_tokens), "prompt_logprobs": None, "prompt_token_ids": None,
            "kv_transfer_params": None}


def stream_chunk(parsed: ParsedRequest, created: int, text: str | None, finish_reason: str | None,
                 first: bool = False) -> dict[str, Any]:
    """One SSE `data:` object of a streamed answer."""
    if parsed.kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason,
                                  "stop_reason": None}
        obj = "text_completion"
    else:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else (
            {"content": text} if text is not None else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = None
        obj = "chat.completion.chunk"
    return {"id": parsed.sim.request_id, "object": obj, "created": created, "model": parsed.echo_model,
            "choices": [choice]}


def usage_chunk(parsed: ParsedRequest, created: int, completion_tokens: int) -> dict[str, Any]:
    obj = "text_completion" if parsed.kind == "completion" else "chat.completion.chunk"
    return {"id": parsed.sim.request_id, "object": obj, "created": created, "model": parsed.echo_model,
            "choices": [], "usage": usage(parsed, completion_tokens)}


def models_body(config: SimConfig, created: int) -> dict[str, Any]:
    """GET /v1/models, as vLLM 0.32 answers it."""
    return {"object": "list", "data": [{
        "id": config.model, "object": "model", "created": created, "owned_by": "vllm",
        "root": f"/models/{config.model}", "parent": None, "max_model_len": config.max_model_len,
        "permission": [{"id": f"modelperm-{secrets.token_hex(8)}", "object": "model_permission", "created": created,
                        "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                        "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                        "organization": "*", "group": None, "is_blocking": False}],
    }]}


def now_seconds() -> int:
    return int(time.time())
