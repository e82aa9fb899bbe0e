"""One lifetime of a simulated server (one "process"), and what every route of it reads.

A `ServerProcess` holds one lifetime's engine driver, counters, start time and listening socket;
`llm_vitals/sim/backend.py` builds one per (re)start, with its app (the admin routes and the
engine's own). Every route handler, whichever engine's, reads its lifetime as
`request.app[PROCESS_KEY]` and writes JSON with `json_response`.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

from aiohttp import web

from llm_vitals.sim.config import SimConfig
from llm_vitals.sim.driver import EngineDriver
from llm_vitals.sim.metrics import HttpStats, VllmCollector

# How long closing the port waits for in-flight handlers (they have all been answered by then).
_SHUTDOWN_TIMEOUT = 1.0

_compact = functools.partial(json.dumps, separators=(",", ":"))


def json_response(data: Any, status: int = 200) -> web.Response:
    """JSON as vLLM (FastAPI) writes it: compact."""
    return web.json_response(data, status=status, dumps=_compact)


class ServerProcess:
    """One lifetime of a simulated server: engine driver, metrics and listening socket."""

    def __init__(self, config: SimConfig, start_time: float):
        self.config = config
        self.start_time = start_time  # process_start_time_seconds
        self.driver = EngineDriver(config)
        self.http = HttpStats(created=time.time())
        self.collector = VllmCollector(config, self.driver.engine, self.http, start_time, created=time.time(),
                                       sleep_level=lambda: self.driver.sleep_level)
        self.runner: web.AppRunner | None = None

    async def listen(self, app: web.Application, host: str, port: int) -> int:
        """Start the engine and serve `app` (this lifetime's routes) on the port; returns the bound port."""
        self.driver.start()
        # handler_cancellation: a client that goes away aborts its request, as in vLLM.
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=_SHUTDOWN_TIMEOUT,
                                    access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await self.close()
            raise
        return self.runner.addresses[0][1]

    async def close(self) -> None:
        """Stop the engine and close the port (idempotent)."""
        await self.driver.stop()
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()


PROCESS_KEY: web.AppKey[ServerProcess] = web.AppKey("process")
