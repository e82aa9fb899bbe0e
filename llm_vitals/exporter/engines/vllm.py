"""The vLLM adapter: a targeted scan of `/metrics` that reads only the families the verdict needs.

It reads only the families the verdict needs, with the shared scanner (llm_vitals/exporter/engines/scan.py),
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
start time, else a counter reset (it is absent with --api-server-count > 1). Sleep mode:
`vllm:engine_sleep_state{sleep_state="awake|weights_offloaded|discard_all"}`, 1 for the state now.

Deferred work (0.32): `vllm:num_requests_waiting_by_reason{reason="capacity|deferred"}` splits the
waiting requests; `deferred` ones wait on something outside this engine (a remote KV transfer, the
LoRA budget, a blocked status), so with nothing moving they read `waiting_on_peer`, not `stuck`.

Pauses on purpose (0.32, served with `VLLM_SERVER_DEV_MODE=1`): `POST /pause?mode=keep` freezes the
requests in the scheduler until `POST /resume`; the page then shows them pending with nothing
moving, so the verdict asks `GET /is_paused` (`{"is_paused": true}`, answered through the
EngineCore: a hung EngineCore does not answer it) only when it would otherwise read stuck. Two
gauges say an operation is in flight, by `operation`:
`vllm:rl_weight_update_operations_in_flight{operation="init|shutdown|start|start_draft|update|finish"}`
and `vllm:sleep_mode_operations_in_flight{operation="sleep|release_kv_cache_memory|wake"}`; read as
`weight_update:<op>` and `sleep_mode:<op>`. `engine_sleep_state` turns awake only when `/wake_up`
returns, so a wake-up that hangs shows asleep with `sleep_mode:wake` in flight.

Units: a page with data-parallel engines (`--data-parallel-size`) carries every family once per
`engine` label. Each engine can hang alone, so each is a `Unit` judged on its own signals; a page
with one engine (the common case) skips that work.
"""

from __future__ import annotations

import functools
import json
import math

from llm_vitals.exporter.engines import Engine, PageError, PageReading, Unit
from llm_vitals.exporter.engines.scan import Sample, Scanner, Tally, by_label

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"  # reason="capacity" | "deferred" (0.32)
STEPS = "vllm:iteration_tokens_total_count"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
FINISHED = "vllm:request_success_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_BEFORE_0_10 = "vllm:gpu_cache_usage_perc"
START_TIME = "process_start_time_seconds"
# Sleep mode (`--enable-sleep-mode`): one series per sleep_state, at 1 for the engine's state now.
SLEEP_STATE = "vllm:engine_sleep_state"
SLEEP_LEVELS = {"awake": 0, "weights_offloaded": 1, "discard_all": 2}
# Operations in flight, by `operation` (see "Pauses on purpose"), and the words they are shown with.
WEIGHT_UPDATE_OPS = "vllm:rl_weight_update_operations_in_flight"
SLEEP_MODE_OPS = "vllm:sleep_mode_operations_in_flight"
OPERATIONS = {WEIGHT_UPDATE_OPS: "weight_update", SLEEP_MODE_OPS: "sleep_mode"}
PAUSE_PATH = "/is_paused"


# Pace (llm_vitals/exporter/pace.py): the inter-token latency histogram's sum and count, seconds per
# output token; before 0.11 it was `time_per_output_token_seconds`.
PACE = ("vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count")
PACE_BEFORE_0_11 = ("vllm:time_per_output_token_seconds_sum", "vllm:time_per_output_token_seconds_count")


# The page-wide sums are each refused when not finite (a present family with no sample sums to 0); the
# deferred requests are the waiting ones the engine marks so.
SCANNER = Scanner((RUNNING, WAITING, WAITING_BY_REASON, STEPS, GENERATION_TOKENS, PROMPT_TOKENS, FINISHED, KV_USAGE,
                   KV_USAGE_BEFORE_0_10, START_TIME, SLEEP_STATE, WEIGHT_UPDATE_OPS, SLEEP_MODE_OPS, *PACE,
                   *PACE_BEFORE_0_11), required=(RUNNING, WAITING), kind="vLLM",
                  sums=(RUNNING, WAITING, STEPS, GENERATION_TOKENS, PROMPT_TOKENS, FINISHED),
                  pick=(WAITING_BY_REASON, "reason", "deferred"))


def _pace_names(found: dict[str, list[Sample]]) -> tuple[str, str] | None:
    for names in (PACE, PACE_BEFORE_0_11):
        if names[0] in found and names[1] in found:
            return names
    return None


def pace_of(found: dict[str, list[Sample]], names: tuple[str, str] | None) -> tuple[float, float] | None:
    """(seconds, tokens) of the inter-token histogram, summed over engines; None without it (or not finite)."""
    if names is None:
        return None
    seconds, count = _summed(found[names[0]]), _summed(found[names[1]])
    return (seconds, count) if math.isfinite(seconds) and math.isfinite(count) else None


def _summed(samples: list[Sample]) -> float:
    # One engine writes one line (the common case): its value, with no generator to sum over (each poll).
    return 0.0 + samples[0].value if len(samples) == 1 else sum(sample.value for sample in samples)


def sleep_level(samples: list[Sample]) -> int:
    """The sleep level a page shows (0 awake): asleep only when every engine sleeps, at the lightest level among them.

    Each engine has one series per `sleep_state`, the one at 1 naming its state. An engine with
    no series at 1 counts as awake: a sleeping server gets no canary, so `asleep` must be what
    the page says, never a guess.
    """
    return _sleep_level(tuple(samples))


# A server's sleep-state lines are the same at nearly every poll: each set is read once per process.
@functools.lru_cache(maxsize=1024)
def _sleep_level(samples: tuple[Sample, ...]) -> int:
    levels: dict[str, int] = {}
    engines: set[str] = set()
    for sample in samples:
        labels = sample.labels()
        engine = labels.get("engine", "")
        engines.add(engine)
        level = SLEEP_LEVELS.get(labels.get("sleep_state", ""))
        if level is not None and sample.value == 1:
            levels[engine] = min(levels.get(engine, level), level)
    return min((levels.get(engine, 0) for engine in engines), default=0)


def parse_text(text: str) -> PageReading:
    """Turn a vLLM `/metrics` page into a PageReading, summed over engines; raises PageError."""
    return parse_found(SCANNER.scan(text))


def parse_found(found: dict[str, list[Sample]]) -> PageReading:
    """The PageReading of the samples `SCANNER.scan` found (the backtest builds them from Prometheus's samples)."""
    return reading(SCANNER.tally(found))


def reading(tally: Tally) -> PageReading:
    """The PageReading of a page's `Tally` (its samples, sums and deferred requests: one call into the scanner)."""
    found, deferred = tally.found, tally.picked
    # An optional gauge that reads NaN or ±Inf is absent, not a reason to reject the page.
    kv_values = [s.value for s in found.get(KV_USAGE) or found.get(KV_USAGE_BEFORE_0_10) or [] if math.isfinite(s.value)]
    start_times = [s.value for s in found.get(START_TIME, []) if math.isfinite(s.value)]
    running = found[RUNNING]
    pace_names = _pace_names(found)
    running_sum, waiting_sum, steps, generation_tokens, prompt_tokens, finished = tally.sums
    level = sleep_level(found.get(SLEEP_STATE, []))
    if isinstance(tally.picked_sum, PageError):
        raise tally.picked_sum  # after the sleep state's labels: a page broken twice reads the same first error
    return PageReading(
        running=running_sum or 0.0,
        waiting=waiting_sum or 0.0,
        steps=steps,
        generation_tokens=generation_tokens,
        prompt_tokens=prompt_tokens,
        finished=finished,
        # A usage fraction is not additive across data-parallel engines: report their mean.
        kv_usage=sum(kv_values) / len(kv_values) if kv_values else None,
        process_start_time=start_times[0] if start_times else None,
        sleep_level=level,
        deferred=tally.picked_sum,
        operations=operations(found),
        # One engine writes one running line: the per-engine work only for a data-parallel page.
        units=_units(found, deferred, pace_names) if len(running) > 1 else (),
        pace=pace_of(found, pace_names),
    )


def _units(found: dict[str, list[Sample]], deferred: list[Sample], pace: tuple[str, str] | None) -> tuple[Unit, ...]:
    """Each data-parallel engine's own load and signals, by its `engine` label."""
    running = by_label(found[RUNNING], "engine")
    if len(running) < 2:
        return ()
    waiting = by_label(found[WAITING], "engine")
    held = by_label(deferred, "engine")
    counters = [by_label(found.get(name, ()), "engine") for name in (STEPS, GENERATION_TOKENS, PROMPT_TOKENS, FINISHED)]
    kv = by_label(found.get(KV_USAGE) or found.get(KV_USAGE_BEFORE_0_10) or (), "engine")
    seconds, count = (by_label(found[name], "engine") for name in pace) if pace else ({}, {})
    return tuple(
        Unit(f'engine="{engine}"', running[engine], waiting.get(engine, 0.0), held.get(engine, 0.0),
             tuple(values.get(engine) for values in counters), (kv.get(engine),),
             _pair(seconds.get(engine), count.get(engine)))
        for engine in running
    )


def operations(found: dict[str, list[Sample]]) -> tuple[tuple[str, float], ...]:
    """The weight-update and sleep-mode operations the page has in flight, as `weight_update:update` etc."""
    if WEIGHT_UPDATE_OPS not in found and SLEEP_MODE_OPS not in found:
        return ()  # a page without them (no dev mode, an older release): every poll of most servers
    ops: dict[str, float] = {}
    for family, word in OPERATIONS.items():
        for sample in found.get(family, ()):
            value = sample.value
            if value and math.isfinite(value):  # NaN or ±Inf: absent, as any optional gauge
                name = f"{word}:{sample.labels().get('operation', '')}"
                ops[name] = ops.get(name, 0.0) + value
    return tuple(ops.items())


def pause_answer(status: int, body: bytes) -> bool | None:
    """`GET /is_paused`'s answer: 200 `{"is_paused": true|false}`; None for anything else."""
    if status != 200:
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    value = answer.get("is_paused") if isinstance(answer, dict) else None
    return value if isinstance(value, bool) else None


def _pair(seconds: float | None, work: float | None) -> tuple[float, float] | None:
    return None if seconds is None or work is None else (seconds, work)


def parse_page(body: bytes) -> PageReading:
    """Decode (strict UTF-8) and parse a `/metrics` body; raises PageError."""
    return reading(SCANNER.read(body))


ENGINE = Engine(
    name="vllm",
    parse=lambda page: parse_page(page.body),  # no header carries anything the verdict needs
    signature="vllm:",
    # 503 once the engine is known dead (EngineDeadError); a hung engine still answers 200.
    health_paths=("/health",),
    pause_path=PAUSE_PATH,
    pause_answer=pause_answer,
    pause_before_canary=True,
)
