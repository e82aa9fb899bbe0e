"""The OpenAI-compatible routes that every simulated engine but Triton serves, as vLLM answers them.

`/v1/models`, `/v1/completions` and `/v1/chat/completions` (streamed or not): the request is checked
by `openai_api`, submitted to the lifetime's engine driver, and answered token by token as the
engine steps. Each engine's module (llm_vitals/sim/engines/) adds those it serves to its routes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from llm_vitals.sim.driver import TokenEvent
from llm_vitals.sim.openai_api import (
    ApiError,
    ParsedRequest,
    error_body,
    full_response,
    generated_text,
    models_body,
    now_seconds,
    parse_request,
    stream_chunk,
    usage_chunk,
)
from llm_vitals.sim.process import PROCESS_KEY, json_response


async def models(request: web.Request) -> web.Response:
    process = request.app[PROCESS_KEY]
    return json_response(models_body(process.config, int(process.start_time)))


async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve_completion(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve_completion(request, "chat")


async def _serve_completion(request: web.Request, kind: str) -> web.StreamResponse:
    process = request.app[PROCESS_KEY]
    try:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ApiError(400, f"JSON decode error: {exc}") from None
        parsed = parse_request(kind, body, process.config)
    except ApiError as exc:
        return json_response(exc.body(), status=exc.status)
    channel = process.driver.submit(parsed.sim)
    try:
        if parsed.stream:
            return await _stream(request, parsed, channel)
        return await _collect(parsed, channel)
    finally:
        # Finished requests are gone from the driver already; this only aborts the abandoned ones.
        process.driver.abort(parsed.sim.request_id)


async def _collect(parsed: ParsedRequest, channel: asyncio.Queue[TokenEvent]) -> web.Response:
    tokens = 0
    while True:
        event = await channel.get()
        if event.error is not None:
            return json_response(error_body(500, event.error), status=500)
        tokens += event.tokens
        if event.finished_reason is not None:
            return json_response(full_response(parsed, tokens, event.finished_reason, now_seconds()))


async def _stream(request: web.Request, parsed: ParsedRequest,
                  channel: asyncio.Queue[TokenEvent]) -> web.StreamResponse:
    created = now_seconds()
    first = await channel.get()
    if first.error is not None:  # dead before anything was sent: a plain 500, as vLLM does
        return json_response(error_body(500, first.error), status=500)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await response.prepare(request)

    async def send(obj: Any) -> None:
        await response.write(f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode())

    if parsed.kind == "chat":
        await send(stream_chunk(parsed, created, None, None, first=True))
    tokens, event = 0, first
    while True:
        if event.tokens and event.finished_reason is None and not channel.empty():
            # The last token and the finish arrive together in vLLM's final chunk.
            following = channel.get_nowait()
            event = TokenEvent(tokens=event.tokens + following.tokens, finished_reason=following.finished_reason,
                               error=following.error)
        if event.error is not None:
            await send(error_body(500, event.error))
            break
        if event.tokens:
            text = generated_text(parsed.sim.request_id, tokens, event.tokens)
            tokens += event.tokens
            await send(stream_chunk(parsed, created, text, event.finished_reason))
        elif event.finished_reason is not None:
            await send(stream_chunk(parsed, created, None if parsed.kind == "chat" else "", event.finished_reason))
        if event.finished_reason is not None:
            if parsed.include_usage:
                await send(usage_chunk(parsed, created, tokens))
            break
        event = await channel.get()
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
