"""A fleet of simulated vLLM servers, optionally behind a proxy, with a control server.

    async with Fleet(SimConfig(max_num_seqs=2), backends=3, proxy=True) as fleet:
        fleet.backend_urls   # ["http://127.0.0.1:PORT", ...]
        fleet.proxy_url      # or None
        fleet.control_url    # or None (control=False)
        fleet.backends[1].set_fault("hang")

Ports default to 0 (the kernel picks, safe for parallel tests). With `port=P`, backend i listens on
P + i. A backend keeps its port across restarts.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from aiohttp import web

from llm_vitals.sim.backend import Backend
from llm_vitals.sim.config import SimConfig
from llm_vitals.sim.control import create_control_app
from llm_vitals.sim.engines.table import sim_engine
from llm_vitals.sim.proxy import create_proxy_app

__all__ = ["Backend", "Fleet", "SimConfig"]


class Fleet:
    """N backends, an optional least-connection proxy and the control server, in this event loop."""

    def __init__(self, config: SimConfig | None = None, backends: int = 1, proxy: bool = False,
                 control: bool = True, host: str = "127.0.0.1", port: int = 0, proxy_port: int = 0,
                 control_port: int = 0):
        if backends < 1:
            raise ValueError(f"a fleet needs at least one backend, got {backends}")
        self.config = config or SimConfig()
        sim_engine(self.config.engine)  # an unknown engine fails here, not at the first start
        self.host = host
        self.backends = [Backend(i, self.config, host, port + i if port else 0, on_change=self._backend_changed)
                         for i in range(backends)]
        self._want_proxy, self._proxy_port = proxy, proxy_port
        self._want_control, self._control_port = control, control_port
        self._runners: list[web.AppRunner] = []
        self.proxy_url: str | None = None
        self.control_url: str | None = None
        # Set when every backend is dead (and none is loading): the CLI exits then, as vLLM does.
        self.all_dead = asyncio.Event()

    @property
    def backend_urls(self) -> list[str]:
        return [b.url for b in self.backends]

    async def start(self) -> Fleet:
        try:
            for backend in self.backends:
                await backend.start()
            if self._want_proxy:
                self.proxy_url = await self._serve(create_proxy_app(lambda: self.backend_urls), self._proxy_port)
            if self._want_control:
                self.control_url = await self._serve(create_control_app(self.backends), self._control_port)
        except BaseException:
            await self.stop()
            raise
        return self

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        await asyncio.gather(*(b.stop() for b in self.backends), return_exceptions=True)

    async def _serve(self, app: web.Application, port: int) -> str:
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, self.host, port, reuse_address=True).start()
        return f"http://{self.host}:{runner.addresses[0][1]}"

    def _backend_changed(self, _backend: Backend) -> None:
        if all(b.phase == "dead" for b in self.backends):
            self.all_dead.set()
        else:
            self.all_dead.clear()

    async def __aenter__(self) -> Fleet:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
