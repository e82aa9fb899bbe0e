"""The remediator's own look, every `holds.REDECIDE_INTERVAL` while it runs: restarts it did not make
counted, and the targets it held decided again when their hold ends (`GateLoop.redecide`, holds.py).

It never dies of an error: anything it meets is logged, and the next look goes on.
"""

from __future__ import annotations

import asyncio
import logging

from .holds import REDECIDE_INTERVAL
from .loop import GateLoop

log = logging.getLogger("llm_vitals.remediator")


async def redecide(loop: GateLoop, interval: float = REDECIDE_INTERVAL) -> None:
    """Look every `interval` until cancelled."""
    while True:
        await asyncio.sleep(interval)
        try:
            await loop.redecide()
        except Exception:  # a failed look must not end the next ones: the word would hold on stale entries
            log.exception("re-deciding the held targets failed; looking again in %gs", interval)
