"""An HTTP answer's body read up to a limit, as the remediator's executors and the shim's backstop ask read them."""

from __future__ import annotations

import asyncio

import aiohttp


async def read_upto(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body of `response` up to `limit` bytes: all of it when shorter, its first `limit` bytes when not.

    Not `response.content.read(limit)`: that returns what has arrived so far, which cuts a body that
    comes in more than one piece (a real Docker Engine's inspect answer, under load, was read without
    its `State` and a running container refused as unreadable).
    """
    try:
        return await response.content.readexactly(limit)
    except asyncio.IncompleteReadError as short:
        return short.partial
