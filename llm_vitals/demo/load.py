"""Clients: steady traffic through the proxy, and a batch job pinned to one backend.

Requests to a hung backend simply wait (no client timeout shorter than a restart): their being
in flight is what makes a hang "work pending, no progress", i.e. stuck rather than idle.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

MODEL = "tiny"


async def _worker(session: aiohttp.ClientSession, url: str, max_tokens: int) -> None:
    body = {"model": MODEL, "prompt": "Summarise the incident report in one paragraph.", "max_tokens": max_tokens,
            "ignore_eos": True}
    while True:
        try:
            async with session.post(f"{url}/v1/completions", json=body) as response:
                await response.read()
        except (TimeoutError, aiohttp.ClientError):
            await asyncio.sleep(0.5)  # a backend restarting or the proxy out of backends: try again soon
        await asyncio.sleep(0.05)


class Load:
    """A set of client workers that can be started and stopped as a group."""

    def __init__(self, session: aiohttp.ClientSession, url: str, workers: int, max_tokens: int) -> None:
        self.session, self.url, self.workers, self.max_tokens = session, url, workers, max_tokens
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(_worker(self.session, self.url, self.max_tokens)) for _ in range(self.workers)]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks = []
