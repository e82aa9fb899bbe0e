"""Load for the drills, and the drills' own direct reads of an engine's /metrics.

One generator for every engine: each request is a plain HTTP/1.1 exchange on a connection of its
own, in a thread, so
- nothing is kept alive (an engine that closes idle connections, as vLLM does after 5 s, cannot
  fail a request sent on one it just closed);
- a drill ends its load at once by shutting the sockets (`cancel`): an engine that streams
  (llama.cpp, `"stream": true`) then fails its next write and cancels the request within a token;
- a Load is a context manager whose exit cancels it, so a drill that fails, by an assertion too,
  never leaves its load running into the next one.

A load is a fixed batch (`Load.batch`) or clients that each send their next request as soon as the
last one answered (`Load.sustained`); `stop()` sends nothing more and lets the requests in flight end.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

# A request of a frozen engine waits for minutes; a stuck client must not outlive a drill.
REQUEST_TIMEOUT_S = 240.0
# One direct read of an engine's /metrics: a saturated 2-core box once took 9 s (vLLM), and over 10 s (llama.cpp).
METRICS_TIMEOUT_S = 20.0
JOIN_S = 30.0  # for the threads of a cancelled load, whose sockets are shut


@dataclass
class Outcome:
    status: int | None  # HTTP status; None when the connection failed or was closed first
    seconds: float
    body: str = ""


class Load:
    """Requests in flight, each in a thread on a connection of its own; see the module's docstring."""

    def __init__(self, url: str, path: str, timeout: float = REQUEST_TIMEOUT_S) -> None:
        where = urlsplit(url)
        self.host, self.port = where.hostname or "127.0.0.1", where.port or 80
        self.path = path
        self.timeout = timeout
        self.started = time.time()
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._cancelled = False

    @classmethod
    def batch(cls, url: str, path: str, bodies: Iterable[dict], concurrency: int, timeout: float = REQUEST_TIMEOUT_S) -> Load:
        """POST the bodies with `concurrency` requests in flight; returns at once."""
        load = cls(url, path, timeout)
        queue: Iterator[dict] = iter(list(bodies))

        def client() -> None:
            while not load._stop.is_set():
                with load._lock:
                    body = next(queue, None)
                if body is None:
                    return
                load.post(body)

        load._run(client, concurrency)
        return load

    @classmethod
    def sustained(cls, url: str, path: str, body_for: Callable[[int], dict], concurrency: int, max_seconds: float,
                  timeout: float = REQUEST_TIMEOUT_S) -> Load:
        """`concurrency` clients, each sending its next request as soon as the last one answered, until `stop()`.

        The fault drills need work in flight at the moment of the fault whatever the engine's speed:
        a fixed batch of 32 long generations lasted ~60 s on one CPU and 19 s on another, where a
        starved direct read of /metrics missed all of it. `body_for(n)` gives the n-th request's body.
        A client stops at its first failure (a dead server is not hammered) and after `max_seconds`.
        """
        load = cls(url, path, timeout)
        numbers = iter(range(1_000_000))
        give_up_at = time.monotonic() + max_seconds

        def client() -> None:
            while not load._stop.is_set() and time.monotonic() < give_up_at:
                with load._lock:
                    number = next(numbers)
                if load.post(body_for(number)).status != 200:
                    return

        load._run(client, concurrency)
        return load

    def _run(self, client: Callable[[], None], concurrency: int) -> None:
        self._threads = [threading.Thread(target=client, name="load", daemon=True) for _ in range(concurrency)]
        for thread in self._threads:
            thread.start()

    def post(self, body: dict) -> Outcome:
        """One request's outcome: its status and time, or no status when the connection failed or was shut."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        began = time.monotonic()
        try:
            conn.connect()
            # A request that connects while cancel() runs is dropped here: cancel() only reaches the
            # sockets already registered (seen as a request left running on a loaded box).
            with self._lock:
                if self._cancelled:
                    raise ConnectionAbortedError("the load was cancelled before this request was sent")
                self._open.add(conn)
            conn.request("POST", self.path, json.dumps(body), {"Content-Type": "application/json"})
            answer = conn.getresponse()
            outcome = Outcome(answer.status, time.monotonic() - began, answer.read()[:300].decode(errors="replace"))
        except (OSError, http.client.HTTPException) as exc:
            outcome = Outcome(None, time.monotonic() - began, repr(exc))
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()
        with self._lock:
            self.outcomes.append(outcome)
        return outcome

    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        """Send nothing more; the requests in flight run to their end."""
        self._stop.set()

    def cancel(self) -> list[Outcome]:
        """Send nothing more and shut every connection in flight (the engine cancels those requests); idempotent."""
        self._stop.set()
        with self._lock:
            self._cancelled = True
            for conn in self._open:
                if conn.sock is not None:
                    try:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
        for thread in self._threads:
            thread.join(timeout=JOIN_S)
        return list(self.outcomes)

    def wait(self, timeout: float) -> list[Outcome]:
        """Every request's outcome; TimeoutError when they are not all back in time."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if not self.done():
            raise TimeoutError(f"{sum(t.is_alive() for t in self._threads)} load client(s) still busy after {timeout:.0f} s")
        return list(self.outcomes)

    def __enter__(self) -> Load:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cancel()


def read_page(url: str, timeout: float = METRICS_TIMEOUT_S) -> str:
    """An engine's whole /metrics page now (one read; httpx.HTTPError when it fails)."""
    return httpx.get(url, timeout=timeout).text


def sample_sum(page: str, names: str | tuple[str, ...], labels: dict[str, str] | None = None) -> float:
    """Sum of the samples named `names` on a page already read, over the label sets that carry `labels`.

    Several names are summed from the one page (e.g. running + waiting as of one moment); `labels`
    keeps e.g. one histogram bucket's `le`. Names are full sample names, as the parser gives them.
    """
    wanted = (names,) if isinstance(names, str) else names
    want = (labels or {}).items()
    return sum(s.value for family in text_string_to_metric_families(page) for s in family.samples
               if s.name in wanted and want <= s.labels.items())


def engine_counter(url: str, names: str | tuple[str, ...], labels: dict[str, str] | None = None) -> float:
    """`sample_sum` over one direct read of the page at `url`."""
    return sample_sum(read_page(url), names, labels)


def wait_page(url: str, condition: Callable[[str], bool], timeout: float, what: str, load: Load | None = None,
              read_timeout: float = METRICS_TIMEOUT_S) -> str:
    """The first direct read of the page that satisfies `condition`; AssertionError at the deadline.

    A read that times out or fails is one more try, never the drill's failure by itself: under
    saturation on a loaded box one read took longer than 10 s. With `load`, a load that ends first
    is the failure (the fault was to be aimed at work in flight).
    """
    deadline = time.monotonic() + timeout
    last = "no read yet"
    while (left := deadline - time.monotonic()) > 0:
        if load is not None and load.done():
            raise AssertionError(f"the load finished before {what}")
        try:
            page = read_page(url, timeout=min(read_timeout, max(left, 0.1)))
            if condition(page):
                return page
            last = f"{len(page)} bytes that did not show it"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last read: {last}")
