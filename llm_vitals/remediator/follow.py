"""Following the shared state: re-read the store now and then, so that what this replica shows
(the metrics, /healthz, the status page's pause) and its duplicate check from memory keep up with
what another replica committed (a pause, an open circuit, a restart) between this replica's webhooks.
Only a store whose last state can go stale needs it (the Lease; not the one replica's SQLite row).

The follower never dies of an error: a read that fails is counted by the store (`read`), anything
else it meets (a bug, an answer of a shape nobody expected) is counted as `follow` in the store's
health (`llm_vitals_remediator_state_errors_total{operation="follow"}`) and logged with its
traceback, and the next read comes `interval` later. A failure is logged at WARNING when the
follower starts failing and at INFO when it reads again; repeats in between at DEBUG.
"""

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
    """Read the store every `interval` seconds until cancelled; any failed read is retried at the next."""
    failing = False
    while True:
        try:
            await store.read()
        except StateUnavailable as exc:
            log_event(log, "cannot read the shared state", level=logging.DEBUG if failing else logging.WARNING,
                      error=str(exc))
            failing = True
        except Exception as exc:  # never let the follower die: the replica would go on showing an old state
            store.health.failed("follow", f"{type(exc).__name__}: {exc}")
            log.exception("following the shared state failed unexpectedly; reading again in %gs", interval)
            failing = True
        else:
            if failing:
                log_event(log, "the shared state is readable again")
            failing = False
        await sleep(interval)
