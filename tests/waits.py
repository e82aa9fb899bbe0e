"""A bounded wait for the tests: poll an async condition until it holds or a deadline passes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def wait_until(
    predicate: Callable[[], Awaitable[Any]],
    timeout: float,
    what: str,
    *,
    interval: float = 0.2,
    retry_on: tuple[type[BaseException], ...] = (),
) -> Any:
    """The first truthy value of the async `predicate`, polled every `interval` s; AssertionError
    naming `what` and the last value after `timeout` s. An error in `retry_on` (e.g. a server not
    answering yet) counts as not yet."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await predicate()
        except retry_on as exc:
            last = exc  # said in the timeout's message if it is the last thing seen
        else:
            if last:
                return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last: {last!r}")
