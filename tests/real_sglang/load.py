"""Load for the SGLang drills: `/generate` requests in threads, and direct reads of SGLang's own counters.

The threads and the engine-counter reads are the vLLM tier's (tests/real_vllm/load.py); only the
request bodies and the route differ. `/generate` takes token ids, so a prompt's length is exact.
"""

from __future__ import annotations

import random
import time

import httpx
from real_vllm.load import FIRST_ORDINARY_TOKEN, VOCAB, Load, engine_counter, start_load

from .sglang_server import CONTEXT_LENGTH

GENERATE = "/generate"


def generations(count: int, max_new_tokens: int) -> list[dict]:
    """`count` requests that each decode exactly `max_new_tokens` tokens (ignore_eos)."""
    return [
        {"text": "def main():", "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}}
        for _ in range(count)
    ]


def long_prompt(prompt_tokens: int, seed: int = 0) -> dict:
    """One request of `prompt_tokens` random token ids and one output token: a long chunked prefill."""
    assert prompt_tokens + 1 <= CONTEXT_LENGTH
    rng = random.Random(seed)
    ids = [rng.randrange(FIRST_ORDINARY_TOKEN, VOCAB) for _ in range(prompt_tokens)]
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "ignore_eos": True, "temperature": 0}}


def send(base_url: str, bodies: list[dict], concurrency: int) -> Load:
    """Post the bodies to `/generate` with `concurrency` in flight; returns at once."""
    return start_load(base_url, bodies, concurrency, path=GENERATE)


def counter(base_url: str, sample_name: str, labels: dict[str, str] | None = None) -> float:
    """Sum of one sample of SGLang's own /metrics over its label sets."""
    return engine_counter(base_url, sample_name, labels)


def wait_engine_running(base_url: str, load: Load, at_least: float = 1, timeout: float = 90.0) -> float:
    """Wait until SGLang itself reports `at_least` running plus queued requests (read directly)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if load.done():
            raise AssertionError("the load finished before the engine was seen running it")
        pending = counter(base_url, "sglang:num_running_reqs") + counter(base_url, "sglang:num_queue_reqs")
        if pending >= at_least:
            return pending
        time.sleep(0.2)
    raise AssertionError(f"SGLang showed no {at_least:g} pending requests within {timeout:.0f} s of the load")


def page(base_url: str) -> str:
    """SGLang's whole /metrics page now."""
    return httpx.get(f"{base_url}/metrics", timeout=20.0).text
