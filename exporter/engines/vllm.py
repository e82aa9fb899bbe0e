"""The vLLM adapter: a targeted scan of `/metrics` that reads only the families the verdict needs.

It reads only the families the verdict needs, with the shared scanner (exporter/engines/scan.py),
which is held to prometheus-client's values by a property test. A sample of the page:

    # HELP vllm:num_requests_running Number of requests in model execution batches.
    # TYPE vllm:num_requests_running gauge
    vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
    vllm:num_requests_waiting{engine="0",model_name="tiny"} 8.0
    vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0019536019536019467
    vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} 10547.0
    vllm:generation_tokens_total{engine="0",model_name="tiny"} 20513.0
    vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 25.0
    process_start_time_seconds 1.79622199191e+09

Pending: running + waiting. Progress: steps, tokens, finished requests, KV usage. Restart: the
start time, else a counter reset (it is absent with --api-server-count > 1).
"""

from __future__ import annotations

import math

from exporter.engines import Engine, PageError, Snapshot
from exporter.engines.scan import Scanner, decode, show

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
STEPS = "vllm:iteration_tokens_total_count"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
FINISHED = "vllm:request_success_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_BEFORE_0_10 = "vllm:gpu_cache_usage_perc"
START_TIME = "process_start_time_seconds"


SCANNER = Scanner((RUNNING, WAITING, STEPS, GENERATION_TOKENS, PROMPT_TOKENS, FINISHED, KV_USAGE,
                    KV_USAGE_BEFORE_0_10, START_TIME))


def sample_values(text: str) -> dict[str, list[float]]:
    """Values of the wanted samples by full sample name (any labels, in page order)."""
    return {name: [sample.value for sample in samples] for name, samples in SCANNER.scan(text).items()}


def _required(name: str, values: list[float]) -> list[float]:
    for value in values:
        if not math.isfinite(value):
            raise PageError("bad_metrics", f"sample {name} is {show(value)}")
    return values


def parse_text(text: str) -> Snapshot:
    """Turn a vLLM `/metrics` page into a Snapshot, summed over engines; raises PageError."""
    found = sample_values(text)
    if RUNNING not in found or WAITING not in found:
        missing = RUNNING if RUNNING not in found else WAITING
        raise PageError("bad_metrics", f"no {missing} on the page (not a vLLM /metrics page?)")
    # An optional gauge that reads NaN or ±Inf is absent, not a reason to reject the page.
    kv_values = [v for v in found.get(KV_USAGE) or found.get(KV_USAGE_BEFORE_0_10) or [] if math.isfinite(v)]
    start_times = [v for v in found.get(START_TIME, []) if math.isfinite(v)]

    def total(name: str) -> float | None:
        values = found.get(name)
        return sum(_required(name, values)) if values else None

    return Snapshot(
        running=sum(_required(RUNNING, found[RUNNING])),
        waiting=sum(_required(WAITING, found[WAITING])),
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
    return parse_text(decode(body))


ENGINE = Engine(
    name="vllm",
    parse=lambda page: parse_page(page.body),  # no header carries anything the verdict needs
    signature="vllm:",
    # 503 once the engine is known dead (EngineDeadError); a hung engine still answers 200.
    health_paths=("/health",),
)
