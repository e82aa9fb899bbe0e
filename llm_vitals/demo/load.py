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


class HeldRequest:
    """One long streamed chat completion pinned to a backend, open until closed.

    A hang must strike with work in flight to read `stuck`. The pinned clients leave gaps between
    their requests (their pause, and any scheduling delay on a loaded machine), and a hung engine
    core holds what arrives next outside its counters, as vLLM's does. A hang that fell into such a
    gap read `idle`, then `unresponsive` after the canary, and the fleet gate never saw the story's
    three unhealthy at once. This request runs for the whole context (ignore_eos, no max_tokens)
    and is open, with a first token seen, before the story sets the hang.
    """

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url
        self.streaming = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def _stream(self) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell the whole incident report."}],
                "stream": True, "ignore_eos": True}
        with contextlib.suppress(TimeoutError, aiohttp.ClientError):  # a restart ends it: its work is done
            async with self.session.post(f"{self.url}/v1/chat/completions", json=body) as response:
                async for _ in response.content:
                    self.streaming.set()

    async def open(self, timeout: float) -> bool:
        """Start the request; True once its first token arrived within `timeout` seconds."""
        self.task = asyncio.create_task(self._stream())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.streaming.wait(), timeout)
        return self.streaming.is_set()

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
            self.task = None
