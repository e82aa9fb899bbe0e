"""One simulated vLLM server across its lifetimes: serving, faults, death and restarts.

A `ServerProcess` (llm_vitals/sim/process.py) is one lifetime (one "process"): its own engine,
counters, start time and listening socket, serving the admin routes and its engine's. A `Backend`
owns the current one and its port, and moves between phases:

    serving --die--> dying (in flight get 500, /health 503) --> dead (port closed)
    serving|dead --restart--> loading (port closed for startup_seconds) --> serving (all new)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from llm_vitals.logs import log_event
from llm_vitals.sim.admin import FaultConflict, create_app
from llm_vitals.sim.config import SimConfig
from llm_vitals.sim.engine import Engine
from llm_vitals.sim.engines.table import add_engine_routes
from llm_vitals.sim.process import ServerProcess

log = logging.getLogger("llm_vitals.sim.backend")


class Backend:
    """A simulated vLLM server on a fixed port, with faults and restarts on command."""

    def __init__(self, index: int, config: SimConfig, host: str = "127.0.0.1", port: int = 0,
                 on_change: Callable[[Backend], None] | None = None):
        self.index = index
        self.config = config
        self.host = host
        self.port = port  # 0 until first bound; then fixed across restarts
        self.phase = "stopped"  # stopped | loading | serving | dying | dead
        self.fault = "none"
        self.slow_factor = 1.0
        self.restarts = 0
        self.process: ServerProcess | None = None
        self._last_engine: Engine | None = None
        self._process_start_time: float | None = None
        self._lifecycle: asyncio.Task[None] | None = None  # the latest die/restart: what die() waits for
        self._tasks: set[asyncio.Task[None]] = set()  # every die/restart still running (a restart may overtake a die)
        self._restarting = False
        self._lock = asyncio.Lock()
        self._on_change = on_change

    # -- what tests and the control server read ---------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def engine(self) -> Engine | None:
        """The current (or, while dead/loading, the last) lifetime's engine."""
        return self.process.driver.engine if self.process is not None else self._last_engine

    @property
    def listening(self) -> bool:
        return self.phase in ("serving", "dying") and self.process is not None

    def state(self) -> dict[str, Any]:
        """GET /admin/state: the phase, the fault and the engine's headline numbers."""
        engine = self.engine
        stats = engine.stats if engine is not None else None
        return {
            "index": self.index, "url": self.url, "port": self.port, "phase": self.phase,
            "listening": self.listening, "restarting": self._restarting, "fault": self.fault,
            "slow_factor": self.slow_factor,
            "restarts": self.restarts, "process_start_time": self._process_start_time,
            "running": engine.num_running if engine else 0, "waiting": engine.num_waiting if engine else 0,
            "steps": engine.steps if engine else 0,
            "iteration_steps": stats.iteration_steps if stats else 0,
            "generation_tokens": stats.generation_tokens if stats else 0,
            "prompt_tokens": stats.prompt_tokens if stats else 0,
            "finished": stats.finished if stats else 0,
            "kv_usage": engine.kv_cache_usage if engine else 0.0,
        }

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """First start: serving at once (no loading period)."""
        async with self._lock:
            await self._start_process()

    async def stop(self) -> None:
        """Shut down for good (fleet exit)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        async with self._lock:
            await self._close_process()
            self.phase = "stopped"

    async def _start_process(self) -> None:
        # After a restart the process "started" when its loading began, as a real one does.
        start_time = self._process_start_time if self.phase == "loading" and self._process_start_time else time.time()
        process = ServerProcess(self.config, start_time)
        app = create_app(process, self)
        add_engine_routes(app, self.config.engine)
        self.port = await process.listen(app, self.host, self.port)
        self.process = process
        self._process_start_time = start_time
        self.phase, self.fault, self.slow_factor = "serving", "none", 1.0
        log_event(log, "backend serving", backend=self.index, url=self.url, process_start_time=start_time)
        self._changed()

    async def _close_process(self) -> None:
        if self.process is not None:
            process, self.process = self.process, None
            self._last_engine = process.driver.engine
            process.driver.kill()
            await process.close()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self)

    # -- faults -----------------------------------------------------------------------------------
    def set_fault(self, fault: str, factor: float | None = None, startup_seconds: float | None = None) -> dict[str, Any]:
        """Apply a fault now; `die` and `restart` continue in the background (see `die()`/`restart()`).

        Raises FaultConflict when the fault makes no sense in the current phase.
        """
        if fault == "restart":
            if not self._restarting:  # a restart already under way absorbs repeated requests
                self._restarting = True
                self.fault = "restart"
                self._begin(self.restart(startup_seconds))
            return self.state()
        if self.phase != "serving" or self.process is None:
            raise FaultConflict(f"backend {self.index} is {self.phase}: only 'restart' applies now")
        driver = self.process.driver
        if fault == "die":
            self.phase = "dying"
            self.fault = "die"
            driver.kill()
            self._begin(self._finish_dying())
        elif fault in ("hang", "freeze"):
            self.fault = fault
            driver.set_hung(True, in_step=fault == "freeze")
        elif fault == "slow":
            self.fault, self.slow_factor = "slow", float(factor or 4.0)
            driver.set_hung(False)
            driver.set_slow(self.slow_factor)
        elif fault == "peer":
            # A disaggregated decode server whose prefill peer died: what waits is deferred on it.
            self.fault = "peer"
            driver.set_peer_down(True)
        elif fault == "none":
            self.fault, self.slow_factor = "none", 1.0
            driver.set_hung(False)
            driver.set_slow(1.0)
            driver.set_peer_down(False)
        else:
            raise ValueError(f"unknown fault {fault!r}")
        log_event(log, "fault applied", backend=self.index, fault=fault, slow_factor=self.slow_factor)
        self._changed()
        return self.state()

    def _begin(self, coroutine: Any) -> None:
        self._lifecycle = asyncio.create_task(coroutine, name=f"sim-backend-{self.index}-lifecycle")
        self._tasks.add(self._lifecycle)
        self._lifecycle.add_done_callback(self._tasks.discard)

    async def die(self) -> None:
        """Kill the engine: in-flight requests get HTTP 500, /health 503, then the port closes."""
        if self.phase == "serving":
            self.set_fault("die")
        if self._lifecycle is not None:
            await asyncio.shield(self._lifecycle)

    async def _finish_dying(self) -> None:
        # Real vLLM answers /health 503 for a moment, then the API server exits (status 0).
        await asyncio.sleep(self.config.die_close_delay)
        async with self._lock:
            if self.phase != "dying":
                return
            await self._close_process()
            self.phase = "dead"
        log_event(log, "backend dead", backend=self.index, url=self.url)
        self._changed()

    async def restart(self, startup_seconds: float | None = None) -> None:
        """Kill whatever runs, refuse connections for the loading period, then serve anew from zero."""
        self._restarting = True
        try:
            await self._restart(startup_seconds)
        finally:
            self._restarting = False

    async def _restart(self, startup_seconds: float | None) -> None:
        async with self._lock:
            self.fault = "restart"
            self.phase = "loading"  # before the port closes, so nobody sees it closed and "serving"
            await self._close_process()
            self._process_start_time = time.time()  # a new process starts loading now
            self.restarts += 1
            log_event(log, "backend loading", backend=self.index, url=self.url)
            self._changed()
            await asyncio.sleep(self.config.startup_seconds if startup_seconds is None else startup_seconds)
            try:
                await self._start_process()
            except OSError as exc:  # the port was taken meanwhile: stay down, visibly
                self.phase = "dead"
                log_event(log, "backend restart failed", level=logging.ERROR, backend=self.index, url=self.url,
                          error=str(exc))
                self._changed()

    async def wait_phase(self, phase: str, timeout: float = 10.0) -> None:
        """Poll until the backend reaches `phase` (for tests and the CLI)."""
        deadline = time.monotonic() + timeout
        while self.phase != phase:
            if time.monotonic() > deadline:
                raise TimeoutError(f"backend {self.index} still {self.phase} after {timeout}s (wanted {phase})")
            await asyncio.sleep(0.01)
