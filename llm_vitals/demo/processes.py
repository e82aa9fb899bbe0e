"""The demo's child processes: each in its own process group, logged to a file, stopped by PID.

Children get their own session, so a Ctrl-C in the terminal reaches only the demo, which then
stops them in order (SIGTERM to each child's group, SIGKILL after a grace period). If the demo
itself is killed outright, the kernel sends each child SIGTERM (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import aiohttp


class StartError(RuntimeError):
    """A child exited or never became ready; the message carries the tail of its log."""


def _child_setup() -> None:
    """In the child, before exec: die with the demo even if it is SIGKILLed."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


async def answers_200(session: aiohttp.ClientSession, url: str, timeout: float = 2) -> bool:
    """True when a GET of `url` answers 200 within `timeout`; False on any other answer or error."""
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            return response.status == 200
    return False


class Child:
    """One started process and its log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = {**os.environ, **env} if env else None
        self.process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def returncode(self) -> int | None:
        """The exit status once stopped; None while running or never started."""
        return self.process.returncode if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env=self.env, start_new_session=True, preexec_fn=_child_setup)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        tail = "\n".join(text.splitlines()[-lines:])
        return f"--- {self.name} (pid {self.pid}), log {self.log_path} ---\n{tail}"

    async def wait_ready(self, session: aiohttp.ClientSession, url: str, timeout: float) -> None:
        """Poll `url` until it answers 200; fail early if the child exits."""
        await self.wait_until(lambda: answers_200(session, url), url, timeout)

    async def wait_until(self, ready: Callable[[], Awaitable[bool]], url: str, timeout: float,
                         interval: float = 0.2) -> None:
        """Call `ready()` until it is true; StartError with the log's tail if the child exits first or
        `timeout` passes. `url` names what is waited for in that error."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                code = self.process.returncode if self.process else None
                raise StartError(f"{self.name} exited with status {code} before it was ready\n{self.log_tail()}")
            if await ready():
                return
            if time.monotonic() > deadline:
                raise StartError(f"{self.name} not ready at {url} after {timeout:g}s\n{self.log_tail()}")
            await asyncio.sleep(interval)

    async def stop(self, grace: float = 5.0) -> None:
        """SIGTERM this child's process group (its PID is the group id), then SIGKILL if it lingers."""
        proc = self.process
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


class Children:
    """Every child the demo started, stopped in reverse order of starting."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Child] = []

    async def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        child = Child(name, argv, self.log_dir / f"{name}.log", env)
        self.started.append(child)
        await child.start()
        return child

    def exited(self) -> list[Child]:
        """Children that stopped on their own (the demo checks this while it runs)."""
        return [c for c in self.started if not c.running]

    async def stop_all(self) -> None:
        for child in reversed(self.started):
            await child.stop()
