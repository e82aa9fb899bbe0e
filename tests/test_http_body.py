"""An answer's body read up to a limit (llm_vitals/http_body.py), on a loopback server that sends it in pieces."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from llm_vitals.http_body import read_upto

# A Docker Engine's inspect answer, cut where a loaded Engine's first piece once ended: before `State`.
INSPECT = json.dumps({"Id": "abc", "Name": "/sim-a", "Config": {"Env": ["X=1"] * 50},
                      "State": {"Status": "running", "Running": True}}).encode()


async def pieces_server(aiohttp_server, body: bytes, second: asyncio.Event):
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        await second.wait()  # the rest only once the client holds the first piece
        await response.write(body[len(body) // 2:])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    return await aiohttp_server(app)


async def test_a_body_in_two_pieces_is_read_whole(aiohttp_server) -> None:
    second = asyncio.Event()
    server = await pieces_server(aiohttp_server, INSPECT, second)
    async with aiohttp.ClientSession() as session, session.get(server.make_url("/")) as response:
        asyncio.get_running_loop().call_later(0.05, second.set)
        body = await read_upto(response, 64 * 1024)
    assert body == INSPECT and json.loads(body)["State"]["Running"] is True


async def test_a_body_over_the_limit_is_its_first_bytes(aiohttp_server) -> None:
    second = asyncio.Event()
    second.set()
    server = await pieces_server(aiohttp_server, b"x" * 1000, second)
    async with aiohttp.ClientSession() as session, session.get(server.make_url("/")) as response:
        assert await read_upto(response, 100) == b"x" * 100
