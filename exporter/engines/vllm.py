"""The vLLM adapter: a targeted scan of `/metrics` that reads only the families the verdict needs.

Why not prometheus-client's parser: it builds every family on a ~50 KB page (hundreds of histogram
buckets) on every poll of every target; this scanner finds the dozen sample lines it needs with
one regex pass and is tested to give the same values as that parser on every real page we have.
"""

from __future__ import annotations

import math
import re

from exporter.engines import PageError, Snapshot

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
STEPS = "vllm:iteration_tokens_total_count"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
FINISHED = "vllm:request_success_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_BEFORE_0_10 = "vllm:gpu_cache_usage_perc"
START_TIME = "process_start_time_seconds"


# One pass over the page for every sample we need. The names are factored so that the regex engine
# rejects the ~600 other lines after a few characters; a line matches only when the name is followed
# by `{` or a space, so longer names that share a prefix (`..._waiting_by_reason`) are not ours.
_WANTED = re.compile(
    r"\n(vllm:(?:num_requests_(?:running|waiting)|iteration_tokens_total_count|generation_tokens_total"
    r"|prompt_tokens_total|request_success_total|kv_cache_usage_perc|gpu_cache_usage_perc)"
    r"|process_start_time_seconds)([{ ][^\n]*)"
)


def _value(name: str, rest: str) -> float:
    if rest[0] == "{":
        # Label values cannot hold a newline, and value/timestamp hold no brace: the last `}` closes.
        close = rest.rfind("}")
        if close == -1:
            raise PageError("bad_metrics", f"unterminated label set in {name}")
        rest = rest[close + 1 :]
    fields = rest.split()
    if not fields:
        raise PageError("bad_metrics", f"sample {name} has no value")
    try:
        value = float(fields[0])
    except ValueError:
        raise PageError("bad_metrics", f"sample {name} has a non-numeric value {fields[0][:40]!r}") from None
    if not math.isfinite(value):
        raise PageError("bad_metrics", f"sample {name} is {fields[0]}")
    return value


def sample_values(text: str) -> dict[str, list[float]]:
    """Values of the wanted samples by full sample name (any labels, in page order)."""
    found: dict[str, list[float]] = {}
    for name, rest in _WANTED.findall("\n" + text):
        found.setdefault(name, []).append(_value(name, rest))
    return found


def parse_text(text: str) -> Snapshot:
    """Turn a vLLM `/metrics` page into a Snapshot, summed over engines; raises PageError."""
    found = sample_values(text)
    if RUNNING not in found or WAITING not in found:
        missing = RUNNING if RUNNING not in found else WAITING
        raise PageError("bad_metrics", f"no {missing} on the page (not a vLLM /metrics page?)")
    kv_values = found.get(KV_USAGE) or found.get(KV_USAGE_BEFORE_0_10)
    start_times = found.get(START_TIME)

    def total(name: str) -> float | None:
        values = found.get(name)
        return sum(values) if values else None

    return Snapshot(
        running=sum(found[RUNNING]),
        waiting=sum(found[WAITING]),
        steps=total(STEPS),
        generation_tokens=total(GENERATION_TOKENS),
        prompt_tokens=total(PROMPT_TOKENS),
        finished=total(FINISHED),
        # A usage fraction is not additive across data-parallel engines: report their mean.
        kv_usage=sum(kv_values) / len(kv_values) if kv_values else None,
        process_start_time=start_times[0] if start_times else None,
    )


def parse_page(body: bytes) -> Snapshot:
    """Decode (strict UTF-8) and parse a `/metrics` body; raises PageError."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PageError("bad_metrics", f"page is not UTF-8 (byte {exc.start})") from None
    return parse_text(text)
