"""Load for the llama.cpp drills: long generations that run until cancelled, and direct reads of /metrics.

Each request is a plain HTTP/1.1 exchange on a socket of its own, so a drill ends its load at once
by shutting the sockets. The requests stream (`"stream": true`): llama-server then writes every
token as it comes, a write to the closed socket fails, and the task is cancelled within a token.
A non-streamed request was cancelled only ~100 s after its client went away (seen in the tier).
Requests ask for more tokens than a drill lasts. A Load is a context manager: leaving its `with`
block, by an assertion too, cancels it, so a failed drill never leaves its load running into the next.

The drills' own reads of /metrics go through the engine loop as the exporter's do, and under
saturation on a loaded box one took longer than 10 s: `metrics` retries a read that timed out
or failed until its deadline, and only then fails the drill.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

METRICS_TIMEOUT_S = 10.0  # one direct read
METRICS_WITHIN_S = 60.0  # all tries of one read together
LONG_GENERATION_TOKENS = 8000  # under the 8192-token slot context


@dataclass
class Outcome:
    status: int | None  # HTTP status; None when the connection was closed or failed first
    seconds: float
    body: str = ""


@dataclass
class Load:
    """Requests in flight, each in a thread on its own connection."""

    host: str
    port: int
    started: float = field(default_factory=time.time)
    outcomes: list[Outcome] = field(default_factory=list)
    _conns: list[http.client.HTTPConnection] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _cancelled: bool = False

    def send(self, body: dict, path: str = "/completion", timeout: float = 600.0) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        self._conns.append(conn)

        def run() -> None:
            began = time.monotonic()
            try:
                conn.connect()
                # A request that connects while cancel() runs is dropped here: cancel() only reaches
                # the sockets already connected (seen as a request left running on a loaded box).
                with self._lock:
                    if self._cancelled:
                        raise ConnectionAbortedError("the load was cancelled before this request was sent")
                conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
                answer = conn.getresponse()
                outcome = Outcome(answer.status, time.monotonic() - began, answer.read()[:300].decode(errors="replace"))
            except (OSError, http.client.HTTPException) as exc:
                outcome = Outcome(None, time.monotonic() - began, repr(exc))
            with self._lock:
                self.outcomes.append(outcome)

        thread = threading.Thread(target=run, name="llamacpp-load", daemon=True)
        self._threads.append(thread)
        thread.start()

    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def __enter__(self) -> Load:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cancel()

    def cancel(self) -> list[Outcome]:
        """Close every connection (llama-server cancels those requests); the outcomes so far. Idempotent."""
        with self._lock:
            self._cancelled = True
            for conn in self._conns:
                if conn.sock is not None:
                    try:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
        for thread in self._threads:
            thread.join(timeout=30)
        for conn in self._conns:
            conn.close()
        return list(self.outcomes)


def long_generations(url: str, count: int, tokens: int = LONG_GENERATION_TOKENS) -> Load:
    """`count` generations of `tokens` tokens each (ignore_eos: they never end early)."""
    host, port = url.removeprefix("http://").split(":")
    load = Load(host, int(port))
    for k in range(count):
        load.send({"prompt": f"Once upon a time {k}", "n_predict": tokens, "ignore_eos": True, "cache_prompt": False,
                   "stream": True})
    return load


def read_metrics_once(url: str, timeout: float = METRICS_TIMEOUT_S) -> dict[str, float]:
    """Every sample on llama-server's /metrics, by full sample name (no labels on these pages)."""
    page = httpx.get(f"{url}/metrics", timeout=timeout).text
    return {s.name: s.value for family in text_string_to_metric_families(page) for s in family.samples}


def metrics(url: str, within: float = METRICS_WITHIN_S, timeout: float = METRICS_TIMEOUT_S) -> dict[str, float]:
    """One read of /metrics, tried again while reads time out or fail; AssertionError after `within` s."""
    return wait_metrics(url, lambda page: True, timeout=within, what="an answer from /metrics", read_timeout=timeout)


def wait_metrics(url: str, condition, timeout: float, what: str, read_timeout: float = METRICS_TIMEOUT_S) -> dict[str, float]:
    """The first direct read of /metrics that satisfies `condition`; AssertionError at the deadline.

    A read that times out or fails is one more try, never the drill's failure by itself.
    """
    deadline = time.monotonic() + timeout
    last: dict[str, float] | str = "no read yet"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            last = read_metrics_once(url, timeout=min(read_timeout, max(left, 0.1)))
            if condition(last):
                return last
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last read: {last}")


def busy(page: dict[str, float], running: int = 1, deferred: int = 0) -> bool:
    return page.get("llamacpp:requests_processing", 0) >= running and page.get("llamacpp:requests_deferred", 0) >= deferred


def idle(page: dict[str, float]) -> bool:
    return page.get("llamacpp:requests_processing", 1) == 0 and page.get("llamacpp:requests_deferred", 1) == 0
