"""When to keep a target's kept-alive connection open between two polls (pure; the poller sends).

A server that serves each connection on one thread of a fixed pool (llama-server's cpp-httplib
before its pool grew on demand) queues a new connection behind the clients' own requests once
they hold every thread, while a connection kept alive keeps its thread. Such a server closes a
connection idle for its keep-alive (5 s for cpp-httplib), shorter than the shipped poll plus its
jitter, so every poll would connect afresh and queue. A cheap request before the keep-alive runs
out keeps the exporter's connection, and with it its thread, for the next read.
"""

from __future__ import annotations

# How much of the server's keep-alive is left as margin before it runs out: 1 s of llama-server's 5 s,
# where the event loop's own lateness and the request's way there are well under a second.
MARGIN_SHARE = 0.2


def warm_times(wait: float, keep_alive: float | None) -> tuple[float, ...]:
    """Seconds into a `wait` between two polls at which to send a keep-warm request, in order.

    The last request ended at 0 and the next poll comes at `wait`; each gap between two requests
    stays within `(1 - MARGIN_SHARE) * keep_alive`. No keep-alive to beat (None), or a wait that
    short already: none.
    """
    if keep_alive is None or keep_alive <= 0:
        return ()
    step = (1 - MARGIN_SHARE) * keep_alive
    times: list[float] = []
    at = step
    while wait - (at - step) > step:
        times.append(at)
        at += step
    return tuple(times)
