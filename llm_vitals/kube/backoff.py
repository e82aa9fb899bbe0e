"""The informer's timing, in one place: the jittered exponential backoff and the watch timeout.

The numbers are client-go's reflector's (tools/cache/reflector.go, `NewExponentialBackoffManager(
800ms, 30s, 2m, 2.0, 1.0)` and `minWatchTimeout = 5m`): a wait starts at 0.8 s and doubles up to
30 s, each multiplied by a random factor in [1, 2) so that a fleet of exporters that lost the API
server together does not come back in step; after 2 minutes without a wait the next starts at
0.8 s again. A retry every second would be 1 QPS per informer against a sick API server; this
settles at one in [30, 60) s. Each watch asks the server to end it after a random time in
[5, 10) min, so that the re-watches of many clients spread out too.

Pure functions over plain data: the random draw (in [0, 1)) and the time are arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

INITIAL_SECONDS = 0.8
FACTOR = 2.0
CAP_SECONDS = 30.0
JITTER = 1.0  # a wait of d becomes d * (1 + JITTER * random): [d, 2d)
RESET_AFTER_SECONDS = 120.0  # no wait for this long: the next one starts at INITIAL_SECONDS again
WATCH_SECONDS = 300.0  # the shortest watch asked for; each is WATCH_SECONDS * (1 + random)
SHORT_WATCH_SECONDS = 1.0  # a watch that ends sooner with no event is relisted after a backoff, not resumed at once


@dataclass(frozen=True)
class Backoff:
    """One backoff's memory: how many waits in a row, and when the last began (None: never)."""

    attempt: int = 0
    last: float | None = None


def next_wait(backoff: Backoff, now: float, random: float) -> tuple[float, Backoff]:
    """(seconds to wait, the backoff after it): 0.8, 1.6, 3.2 ... 30 s, each times (1 + random)."""
    attempt = 0 if backoff.last is None or now - backoff.last > RESET_AFTER_SECONDS else backoff.attempt
    base = min(INITIAL_SECONDS * FACTOR ** min(attempt, 64), CAP_SECONDS)
    return base * (1.0 + JITTER * random), Backoff(attempt + 1, now)


def watch_seconds(random: float) -> int:
    """The `timeoutSeconds` of one watch: [5, 10) minutes, as client-go's reflector asks."""
    return int(WATCH_SECONDS * (1.0 + random))
