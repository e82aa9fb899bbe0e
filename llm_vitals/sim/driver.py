"""Runs an `Engine` in real time on the event loop, and carries tokens back to the HTTP handlers.

The driver is the simulated EngineCore process: it steps the engine at the configured rate, and
is where the engine faults live. `hang` stops stepping *and* stops taking in new requests (as a
SIGSTOPped EngineCore does: the API server's gauges freeze, the counters freeze, requests sit
unanswered). `freeze` is the same, wedged inside a step (`in_step`): an engine whose own loop
answers /metrics (llama.cpp) still answers it then, with frozen counters. `slow` stretches every
step. `kill` fails every request in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from llm_vitals.sim.config import SimConfig
from llm_vitals.sim.engine import Engine, SimRequest

ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."

# A step whose cost is below this is not slept for on its own: the debt is paid in one sleep once it
# adds up, so high token rates don't become thousands of tiny sleeps.
_MIN_SLEEP = 0.002
# After a long stall of the event loop, forget the lag instead of bursting through it.
_MAX_DEBT = 0.25


@dataclass(frozen=True)
class TokenEvent:
    """One thing that happened to a request: tokens out, finished (with a reason), or an error."""

    tokens: int = 0
    finished_reason: str | None = None
    error: str | None = None


class EngineDriver:
    """Steps one engine in real time. Start with `start()`, stop with `stop()`."""

    def __init__(self, config: SimConfig, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.clock = clock
        self.engine = Engine(config)
        self.hung = False
        self.in_step = False  # hung inside an engine step (a decode), not between two
        self.slow_factor = 1.0
        self.dead = False
        # vLLM's sleep mode (POST /sleep?level=N): 0 awake. A sleeping engine steps nothing and
        # takes nothing in; what arrives meanwhile waits for /wake_up.
        self.sleep_level = 0
        # vLLM's pause (POST /pause?mode=keep, VLLM_SERVER_DEV_MODE=1): the scheduler keeps its
        # requests and steps nothing until /resume; requests that arrive meanwhile join its queue.
        self.paused = False
        self._channels: dict[str, asyncio.Queue[TokenEvent]] = {}
        self._held: list[Callable[[], object]] = []  # requests/aborts that arrived while hung
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    # -- requests ---------------------------------------------------------------------------------
    def submit(self, request: SimRequest) -> asyncio.Queue[TokenEvent]:
        """Hand a request to the engine; its events arrive on the returned queue."""
        channel: asyncio.Queue[TokenEvent] = asyncio.Queue()
        if self.dead:
            channel.put_nowait(TokenEvent(error=ENGINE_DEAD_MESSAGE))
            return channel
        self._channels[request.request_id] = channel
        self._do(lambda: self.engine.add_request(request, self.clock()))
        return channel

    def abort(self, request_id: str) -> None:
        """The client went away: drop the request (counted as finished_reason="abort")."""
        if self._channels.pop(request_id, None) is not None and not self.dead:
            self._do(lambda: self.engine.abort(request_id, self.clock()))

    def _do(self, operation: Callable[[], object]) -> None:
        # A hung engine core does not read its input queue: hold the operation until it resumes.
        if self.hung or self.sleep_level:
            self._held.append(operation)
        else:
            operation()
            self._wake.set()

    # -- faults -----------------------------------------------------------------------------------
    def set_hung(self, hung: bool, in_step: bool = False) -> None:
        self.hung = hung
        self.in_step = hung and in_step
        self._release()

    def set_sleep(self, level: int) -> None:
        """Sleep at `level` (1 weights offloaded, 2 discarded), or wake with 0."""
        self.sleep_level = level
        self._release()

    def set_paused(self, paused: bool) -> None:
        """Pause the scheduler with its requests kept (True), or resume it (False)."""
        self.paused = paused
        self._wake.set()

    def _release(self) -> None:
        if not self.hung and not self.sleep_level:
            held, self._held = self._held, []
            for operation in held:
                operation()
            self._wake.set()

    def set_peer_down(self, down: bool) -> None:
        """The prefill peer gone (True) or back (False): see Engine.peer_down."""
        self.engine.peer_down = down
        self._wake.set()

    def set_slow(self, factor: float) -> None:
        self.slow_factor = max(1.0, factor)

    def kill(self, message: str = ENGINE_DEAD_MESSAGE) -> None:
        """The engine core died: every request in flight gets an error, new ones get it at once."""
        self.dead = True
        self._held.clear()
        for channel in self._channels.values():
            channel.put_nowait(TokenEvent(error=message))
        self._channels.clear()
        if self._task is not None:
            self._task.cancel()

    # -- the loop ---------------------------------------------------------------------------------
    async def _run(self) -> None:
        debt = 0.0
        while True:
            if self.hung or self.sleep_level or self.paused or not self.engine.has_work:
                self._wake.clear()
                await self._wake.wait()
                debt = 0.0
                continue
            output = self.engine.step(self.clock())
            for request_id, count in output.new_tokens.items():
                channel = self._channels.get(request_id)
                if channel is not None:
                    channel.put_nowait(TokenEvent(tokens=count))
            for request in output.finished:
                channel = self._channels.pop(request.request_id, None)
                if channel is not None:
                    channel.put_nowait(TokenEvent(finished_reason=request.finished_reason))
            debt = min(debt + output.cost_seconds * self.slow_factor, _MAX_DEBT)
            if debt >= _MIN_SLEEP:
                started = self.clock()
                await asyncio.sleep(debt)
                debt = max(debt - (self.clock() - started), -_MAX_DEBT)
            else:
                await asyncio.sleep(0)
