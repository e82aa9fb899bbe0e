"""The exporter's own event-loop lag: how late the loop runs what is due, measured by a task that asks
to wake every `tick` seconds and notes how late it woke.

Why: a read of a target's /metrics runs on the same loop as 5,000 others. When the loop is starved
(a loaded box, a fleet too large for one process, a long garbage collection), an answer that came
in time can sit unread until the read's timeout fires first. A timeout then says nothing about the
server, and on engines whose unanswered /metrics counts toward `stuck` it must not lead to a
restart: the poller asks `worst_since(read_start)` and the verdict calls such a read
`exporter_late` (llm_vitals/exporter/verdict/reads.py). `llm_vitals_exporter_loop_lag_seconds` shows it.

Cost: one timer every 0.1 s and a deque of the last two minutes of lateness (1,200 floats).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable


class LoopLag:
    """Lateness of the running loop, sampled every `tick` seconds and kept for `keep` seconds (monotonic time)."""

    def __init__(self, tick: float = 0.1, keep: float = 120.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.tick = tick
        self.keep = keep
        self.clock = clock
        self._samples: deque[tuple[float, float]] = deque()  # (when it woke, how late)
        self._due: float | None = None  # when the sampler should wake next; None while it does not run

    def note(self, due: float, woke: float) -> None:
        """One sample: the sampler was due at `due` and woke at `woke`."""
        self._samples.append((woke, max(0.0, woke - due)))
        horizon = woke - self.keep
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()

    def worst_since(self, since: float) -> float:
        """The worst lateness seen from `since` to now, counting a wake that is overdue right now.

        The overdue part matters: a read's timeout may fire in the very turn of a starved loop in
        which the sampler's own wake is still waiting its turn.
        """
        now = self.clock()
        worst = max(0.0, now - self._due) if self._due is not None else 0.0
        for woke, late in reversed(self._samples):
            if woke < since:
                break
            worst = max(worst, late)
        return worst

    def recent(self, window: float = 10.0) -> float:
        """The worst lateness over the last `window` seconds: what the metric shows."""
        return self.worst_since(self.clock() - window)

    async def run(self) -> None:
        """Sample until cancelled."""
        try:
            while True:
                self._due = self.clock() + self.tick
                await asyncio.sleep(self.tick)
                self.note(self._due, self.clock())
        finally:
            self._due = None
