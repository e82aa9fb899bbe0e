"""Following the shared state: re-read the store now and then, so that what this replica shows
(the metrics, /healthz, the status page's pause) and its duplicate check from memory keep up with
what another replica committed (a pause, an open circuit, a restart) between this replica's webhooks.
Only a store whose last state can go stale needs it (the Lease; not the one replica's SQLite row)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from llm_vitals.logs import log_event

from .store import GateStore, StateUnavailable

log = logging.getLogger("llm_vitals.remediator")


async def follow(
    store: GateStore[Any], interval: float, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
) -> None:
    """Read the store every `interval` seconds until cancelled; a failed read is retried at the next."""
    while True:
        try:
            await store.read()
        except StateUnavailable as exc:
            log_event(log, "cannot read the shared state", level=logging.DEBUG, error=str(exc))
        await sleep(interval)
