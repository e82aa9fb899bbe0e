"""Load for the drills: concurrent completions in threads, and direct reads of the engine's counters."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .vllm_server import MAX_MODEL_LEN, SERVED_MODEL

# Requests wait for minutes when the engine is SIGSTOPped; a stuck client must not outlive a drill.
REQUEST_TIMEOUT_S = 240.0
# A read of vLLM's /metrics on a saturated 2-core box once took 9 s.
METRICS_TIMEOUT_S = 20.0
VOCAB = 2048
FIRST_ORDINARY_TOKEN = 4  # ids 0..3 are <unk> <s> </s> <pad>


@dataclass
class Outcome:
    status: int | None  # HTTP status, None when the connection failed
    seconds: float
    body: str = ""


@dataclass
class Load:
    """Completions running in background threads: a fixed batch, or clients that send until stopped.

    Each future yields one Outcome (a batch's request) or a list of them (a sustained client's).
    """

    futures: list[Future] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    _pool: ThreadPoolExecutor | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def stop(self) -> None:
        """Send nothing more; the requests in flight run to their end (a no-op for a fixed batch)."""
        self._stop.set()

    def wait(self, timeout: float) -> list[Outcome]:
        """Every request's outcome; TimeoutError when they are not all back in time."""
        deadline = time.monotonic() + timeout
        outcomes: list[Outcome] = []
        for f in self.futures:
            result = f.result(timeout=max(0.1, deadline - time.monotonic()))
            outcomes.extend(result if isinstance(result, list) else [result])
        self._pool.shutdown(wait=False)
        return outcomes


def post(client: httpx.Client, url: str, body: dict) -> Outcome:
    """One request's outcome: its status and time, or no status when the connection failed."""
    began = time.monotonic()
    try:
        answer = client.post(url, json=body)
        return Outcome(answer.status_code, time.monotonic() - began, answer.text[:300])
    except httpx.HTTPError as exc:
        return Outcome(None, time.monotonic() - began, repr(exc))


def start_load(base_url: str, bodies: list[dict], concurrency: int, path: str = "/v1/completions") -> Load:
    """POST the bodies to `path` with `concurrency` requests in flight; returns at once.

    The Triton tier sends KServe v2 infer bodies to `/v2/models/<m>/infer` with it.
    """
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="vllm-load")
    # No keep-alive: with more requests than `concurrency` a pooled connection is reused, and vLLM's
    # server closes idle ones after 5 s; a request sent on one just closed fails with no status.
    client = httpx.Client(
        timeout=REQUEST_TIMEOUT_S, limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    )
    remaining = threading.Semaphore(0)

    def one(body: dict) -> Outcome:
        try:
            return post(client, f"{base_url}{path}", body)
        finally:
            remaining.release()

    load = Load(_pool=pool)
    load.futures = [pool.submit(one, body) for body in bodies]

    def close_when_done() -> None:
        for _ in bodies:
            remaining.acquire()
        client.close()

    threading.Thread(target=close_when_done, daemon=True).start()
    return load


def start_sustained_load(
    base_url: str, body_for: Callable[[int], dict], concurrency: int, max_seconds: float, path: str = "/v1/completions"
) -> Load:
    """`concurrency` clients, each sending its next request as soon as the last one answered, until stop().

    The fault drills need work in flight at the moment of the fault whatever the engine's speed: a
    fixed batch of 32 long generations lasted ~60 s on the AMX Xeon and 19 s on the EPYC, where a
    starved direct read of /metrics missed all of it. `body_for(n)` gives the n-th request's body.
    A client stops at its first failure (a dead server is not hammered) and after `max_seconds`.
    """
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="vllm-sustained")
    load = Load(_pool=pool)
    numbers = iter(range(1_000_000))
    numbers_lock = threading.Lock()
    give_up_at = time.monotonic() + max_seconds

    def client_loop() -> list[Outcome]:
        outcomes: list[Outcome] = []
        # No keep-alive, for the reason given in start_load.
        with httpx.Client(timeout=REQUEST_TIMEOUT_S, limits=httpx.Limits(max_keepalive_connections=0)) as client:
            while not load._stop.is_set() and time.monotonic() < give_up_at:
                with numbers_lock:
                    body = body_for(next(numbers))
                outcomes.append(post(client, f"{base_url}{path}", body))
                if outcomes[-1].status != 200:
                    break
        return outcomes

    load.futures = [pool.submit(client_loop) for _ in range(concurrency)]
    return load


def long_generations(count: int, max_tokens: int) -> list[dict]:
    """`count` requests that each generate exactly `max_tokens` tokens (ignore_eos)."""
    return [
        {"model": SERVED_MODEL, "prompt": "def main():", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
        for _ in range(count)
    ]


def long_prompt(number: int, prompt_tokens: int, max_tokens: int, seed: int = 0) -> dict:
    """The `number`-th of a series of prompts of `prompt_tokens` random token ids each.

    Distinct, so that prefix caching cannot skip them.
    """
    assert prompt_tokens + max_tokens <= MAX_MODEL_LEN
    rng = random.Random(f"{seed}-{number}")
    return {
        "model": SERVED_MODEL,
        "prompt": [rng.randrange(FIRST_ORDINARY_TOKEN, VOCAB) for _ in range(prompt_tokens)],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }


def engine_counter(base_url: str, sample_name: str | tuple[str, ...], labels: dict[str, str] | None = None) -> float:
    """Sum of one sample of the engine's own /metrics over its label sets (e.g. every finished_reason).

    Several sample names are summed from one read of the page (e.g. running + waiting as of one
    moment). `labels` keeps only the label sets that carry those values, e.g. one histogram
    bucket's `le`.
    """
    names = (sample_name,) if isinstance(sample_name, str) else sample_name
    page = httpx.get(f"{base_url}/metrics", timeout=METRICS_TIMEOUT_S).text
    wanted = (labels or {}).items()
    total = 0.0
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name in names and wanted <= s.labels.items():
                total += s.value
    return total


def requests_queued_longer_than(base_url: str, le: str) -> float:
    """How many requests vLLM has counted, in its lifetime, as waiting longer than `le` seconds.

    From the engine's own `vllm:request_queue_time_seconds` histogram: a fact a drill reads after
    its load, so it cannot be missed the way a sampled `num_requests_waiting` can on a starved box.
    """
    family = "vllm:request_queue_time_seconds"
    return engine_counter(base_url, f"{family}_count") - engine_counter(base_url, f"{family}_bucket", {"le": le})


def wait_engine_busy(base_url: str, load: Load, timeout: float = 60.0) -> float:
    """Wait until vLLM itself reports requests running (read directly, not through the exporter).

    The faults are aimed at an engine with work in flight; waiting on our own read rather than the
    exporter's verdict keeps a slow sample from letting the load finish before the fault.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if load.done():
            raise AssertionError("the load finished before the engine was seen running it")
        running = engine_counter(base_url, "vllm:num_requests_running")
        if running > 0:
            return running
        time.sleep(0.2)
    raise AssertionError(f"vLLM showed no running request within {timeout:.0f} s of the load")
