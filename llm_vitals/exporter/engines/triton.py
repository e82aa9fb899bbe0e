"""The Triton adapter (NVIDIA Triton Inference Server): metrics on their own port, v2 health, v2 infer canary.

Triton serves Prometheus text on its metrics port (default 8002, `/metrics`), apart from the HTTP
endpoint (`url`, default 8000). Every family is per `model`,`version`; this adapter sums over all
models. A sample of a real page (Triton 2.51 via nvidia-pytriton 0.7.0; tests/fixtures/triton/,
2 model instances running and 1 request queued):

    # TYPE nv_inference_request_success counter
    nv_inference_request_success{model="toy_lm",version="1"} 1
    nv_inference_request_failure{model="toy_lm",reason="BACKEND",version="1"} 0
    nv_inference_exec_count{model="toy_lm",version="1"} 1
    nv_inference_compute_infer_duration_us{model="toy_lm",version="1"} 382304
    # TYPE nv_inference_pending_request_count gauge
    nv_inference_pending_request_count{model="toy_lm",version="1"} 1
    nv_cpu_utilization 0.93

- **Pending** is `nv_inference_pending_request_count`: requests *queued* in the scheduler. Nothing
  counts requests that are executing, so `running` reads 0 (2 running + 1 queued reads 1; exactly
  2 running would read 0 and look idle: a canary then queues behind them, so `canary.timeout` must
  exceed the longest request too).
- **Progress** is `nv_inference_exec_count`, `nv_inference_request_success` and
  `nv_inference_compute_infer_duration_us`. They move only when an execution completes, never while
  a request runs. So `stuck` for Triton means requests queued and nothing completing for
  `stuck_after`, **which must exceed the longest request** the server takes (a long generation with
  another request queued behind it otherwise reads stuck). `nv_inference_request_failure` is read
  (the API shows it) and is never progress: a hung model whose queue policy REJECTs, or whose
  clients CANCEL, moves it while completing nothing.
- **Units**: each model and version is a unit (`Unit`, named `model="m",version="1"`): one model
  with requests queued and nothing of its own completing for `stuck_after` is `stuck`, however busy
  the other models are.
- **TensorRT-LLM**: its backend adds `nv_trt_llm_*` gauges (names from
  triton-inference-server/tensorrtllm_backend, inflight_batcher_llm/src/custom_metrics_reporter/
  custom_metrics_reporter.cc at commit 7f9aa4680aafaebce2d7576b5a40d5ddc7c3cbaa). When the page has
  `nv_trt_llm_general_metrics{general_type="iteration_counter"}` it is the step counter (it moves
  every in-flight-batching iteration, mid-generation); `nv_trt_llm_request_metrics{request_type="active"}`
  is `running`, and the `used`/`max` KV-cache blocks give the KV usage.
- **Frozen server**: `tritonserver` stopped (SIGSTOP, a cgroup freeze, a process wedged whole)
  accepts connections on every port and never answers. Its metrics port is served by its own
  threads, not by the inference path, and answered in milliseconds while saturated; so, as for
  llama.cpp, the metrics port accepting and never answering, across reads for `stuck_after`, while
  requests were last seen queued, is `stuck` (`metrics_unanswered`), not `down`, which no restart
  would follow. Frozen with requests executing and none queued it was idle-looking: `down`.
- **Restart**: there is no start-time metric; every counter starts again from 0, so a restart is a
  counter reset, judged per model (a fall of any of a model's counters is that model started again).
- **Models come and go**: a model unloaded takes its series off the page, one loaded (or a new
  version) brings series starting at 0, so the sums fall or stand still while nothing restarted.
  The snapshot carries each model's counters as series of their own (`PageReading.series`, named
  `model="m",version="1"|family`), and the verdict compares a series only with itself: an unload
  or a version change is neither a restart nor progress. The server restarted when every model both
  reads carry started again; a model that had counted nothing cannot show a reset, so with one on
  both pages, a model started again is read as reloaded (not a restart), unless reads failed in
  between (the server was away). A server with a single model cannot tell the two apart: its
  reload is counted as a restart.
- **vLLM backend**: with `REPORT_CUSTOM_METRICS` on, the vLLM backend adds its engine's own
  families to the page, per `model`,`version` (names from triton-inference-server/vllm_backend,
  src/utils/metrics.py): `vllm:num_requests_running` and `vllm:num_requests_waiting` are running and
  waiting, `vllm:generation_tokens_total` and `vllm:prompt_tokens_total` move with every engine step
  (mid-generation), `vllm:gpu_cache_usage_perc` is the KV usage.
- **Decoupled models** (`model_transaction_policy { decoupled: true }`: the vLLM backend, TensorRT-LLM
  streaming, PyTriton's generators) answer each request with a stream. Triton hands the request to
  the model at once and counts it (`exec_count`, `request_success`) when the model's execute
  returns, before its responses stream; nothing of Triton's own counts the responses, nor a
  request while it streams (not queued: `pending` reads 0). Their canary goes to the
  generate-stream route (`/v2/models/<m>/generate_stream`, the first event read), never to `infer`,
  which answers such a model 501. Only an engine signal of the model's own that moves per
  iteration (TensorRT-LLM's iteration counter, the vLLM backend's tokens) judges one; without it the
  model is unjudged (llm_vitals/exporter/decoupled.py, docs/engines.md).
- **Health** lives on the HTTP endpoint: `/v2/health/live`, `/v2/health/ready` and
  `/v2/models/<model>/ready`. There is no `/v1/models`. The idle canary is a KServe v2 `infer` of the
  request the operator configures (`canary: {request: {...}}`), to `/v2/models/<model>/infer`.
"""

from __future__ import annotations

import json

from llm_vitals.exporter.engines import Canary, Engine, EngineFacts, ModelConfig, PageError, PageReading, Unit, WatchedTarget
from llm_vitals.exporter.engines.scan import Sample, Scanner, finite, finite_sum, text_parse

PENDING = "nv_inference_pending_request_count"
EXEC_COUNT = "nv_inference_exec_count"
SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"
COMPUTE_INFER = "nv_inference_compute_infer_duration_us"
TRT_GENERAL = "nv_trt_llm_general_metrics"  # general_type="iteration_counter" | "timestamp"
TRT_REQUESTS = "nv_trt_llm_request_metrics"  # request_type="active" | "max" | "scheduled" | "context"
TRT_KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"  # kv_cache_block_type="max" | "used" | "free" | ...
# The vLLM backend's own families (REPORT_CUSTOM_METRICS), per model and version.
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_GENERATION = "vllm:generation_tokens_total"
VLLM_PROMPT = "vllm:prompt_tokens_total"
VLLM_KV = "vllm:gpu_cache_usage_perc"

_SCANNER = Scanner((PENDING, EXEC_COUNT, SUCCESS, FAILURE, COMPUTE_INFER, TRT_GENERAL, TRT_REQUESTS, TRT_KV_BLOCKS,
                    VLLM_RUNNING, VLLM_WAITING, VLLM_GENERATION, VLLM_PROMPT, VLLM_KV))
# The counters every page with a loaded model carries; a fall of any of them is a restart.
_REQUIRED_COUNTERS = (EXEC_COUNT, SUCCESS, COMPUTE_INFER)


def _labelled(samples: list[Sample], label: str, value: str) -> float | None:
    """The sum of the finite samples whose `label` is `value`; None when there is none."""
    values = [s.value for s in samples if s.labels().get(label) == value and finite(s.value) is not None]
    return sum(values) if values else None


def parse_text(text: str) -> PageReading:
    """Turn a Triton metrics page into a PageReading, summed over models; raises PageError."""
    found = _SCANNER.scan(text)
    if PENDING not in found:
        raise PageError(
            "bad_metrics",
            f"no {PENDING} on the page (not a Triton metrics page, or no model loaded yet)",
        )
    missing = [name for name in _REQUIRED_COUNTERS if name not in found]
    if missing:
        raise PageError("bad_metrics", f"Triton page without {', '.join(missing)}")
    trt = found.get(TRT_GENERAL, [])
    iterations = _labelled(trt, "general_type", "iteration_counter")
    active = _labelled(found.get(TRT_REQUESTS, []), "request_type", "active")
    blocks = found.get(TRT_KV_BLOCKS, [])
    used, most = _labelled(blocks, "kv_cache_block_type", "used"), _labelled(blocks, "kv_cache_block_type", "max")
    executions = finite_sum(EXEC_COUNT, found[EXEC_COUNT])
    compute_us, finished = finite_sum(COMPUTE_INFER, found[COMPUTE_INFER]), finite_sum(SUCCESS, found[SUCCESS])
    more = [("request_failure", finite_sum(FAILURE, found.get(FAILURE, []))), ("compute_infer_duration_us", compute_us)]
    if iterations is not None:
        more.append(("exec_count", executions))  # the steps are TensorRT-LLM's iterations then
    running = active if active is not None else 0.0
    if VLLM_RUNNING in found:
        running += finite_sum(VLLM_RUNNING, found[VLLM_RUNNING])
    kv_usage = used / most if used is not None and most else None
    if kv_usage is None and found.get(VLLM_KV):
        finite_sum(VLLM_KV, found[VLLM_KV])  # a NaN is bad_metrics, as for every signal
        kv_usage = max(sample.value for sample in found[VLLM_KV])  # a ratio per model: the fullest
    return PageReading(
        running=running,
        waiting=finite_sum(PENDING, found[PENDING]) + finite_sum(VLLM_WAITING, found.get(VLLM_WAITING, [])),
        steps=iterations if iterations is not None else executions,
        generation_tokens=finite_sum(VLLM_GENERATION, found[VLLM_GENERATION]) if VLLM_GENERATION in found else None,
        prompt_tokens=finite_sum(VLLM_PROMPT, found[VLLM_PROMPT]) if VLLM_PROMPT in found else None,
        finished=finished,
        kv_usage=kv_usage,
        more_counters=tuple(more),
        series=_series(found, trt),
        # One model writes one pending line: the per-model work only where several are loaded.
        units=_units(found, trt) if len(found[PENDING]) > 1 else (),
        # Pace (llm_vitals/exporter/pace.py): compute seconds per successful request, over every model
        # (its models are not peers of one another; the same models on another replica are).
        pace=(compute_us / 1e6, finished),
    )


def _unit(sample: Sample) -> str:
    """The unit a per-model sample belongs to: its model and version, as the page labels them."""
    labels = sample.labels()
    return f'model="{labels.get("model", "")}",version="{labels.get("version", "")}"'


# The per-model counters that are progress (never the failures), in the order units carry them.
_PROGRESS = (EXEC_COUNT, SUCCESS, COMPUTE_INFER)


def _series(found: dict[str, list[Sample]], trt: list[Sample]) -> tuple[tuple[str, float], ...]:
    """Each model's (and version's) progress counters as series of their own: `unit|family` -> value."""
    named = [(f"{_unit(sample)}|{name}", sample.value)
             for name in _PROGRESS for sample in found.get(name, []) if finite(sample.value) is not None]
    named += [(f"{_unit(sample)}|{TRT_GENERAL}", sample.value) for sample in trt
              if sample.labels().get("general_type") == "iteration_counter" and finite(sample.value) is not None]
    named += [(f"{_unit(sample)}|{name}", sample.value)
              for name in _IN_FLIGHT_VLLM for sample in found.get(name, []) if finite(sample.value) is not None]
    return tuple(named)


# The vLLM backend's counters that move with every engine step, mid-generation.
_IN_FLIGHT_VLLM = (VLLM_GENERATION, VLLM_PROMPT)
# The series families that move while a model's requests are in flight, not only when they end.
_IN_FLIGHT = (f"|{TRT_GENERAL}", *(f"|{name}" for name in _IN_FLIGHT_VLLM))


def in_flight_signal(snapshot: PageReading, model: str) -> bool:
    """Whether the page carries a signal of `model`'s own that moves per iteration or token (any version)."""
    prefix = f'model="{model}",'
    return any(name.startswith(prefix) and name.endswith(_IN_FLIGHT) for name, _ in snapshot.series)


def _per_unit(samples: list[Sample], label: str | None = None, value: str | None = None) -> dict[str, float]:
    """Finite values summed per model and version (only those whose `label` is `value`, when given)."""
    summed: dict[str, float] = {}
    for sample in samples:
        if finite(sample.value) is None or (label is not None and sample.labels().get(label) != value):
            continue
        key = _unit(sample)
        summed[key] = summed.get(key, 0.0) + sample.value
    return summed


def _units(found: dict[str, list[Sample]], trt: list[Sample]) -> tuple[Unit, ...]:
    """Each loaded model (and version) with its own queue and its own completions."""
    pending = _per_unit(found[PENDING])
    if len(pending) < 2:
        return ()
    counters = [_per_unit(found.get(name, [])) for name in _PROGRESS]
    counters.append(_per_unit(trt, "general_type", "iteration_counter"))
    counters += [_per_unit(found.get(name, [])) for name in _IN_FLIGHT_VLLM]
    active = _per_unit(found.get(TRT_REQUESTS, []), "request_type", "active")
    running, waiting = _per_unit(found.get(VLLM_RUNNING, [])), _per_unit(found.get(VLLM_WAITING, []))
    return tuple(Unit(key, active.get(key, 0.0) + running.get(key, 0.0), queued + waiting.get(key, 0.0), 0.0,
                      tuple(values.get(key) for values in counters))
                 for key, queued in pending.items())


parse = text_parse(parse_text)


def canary_body(target: WatchedTarget, model: str) -> object:
    """The operator's KServe v2 infer body (settings require one while the canary is on)."""
    return target.canary.request or {}


def canary_wrong(answer: object) -> str | None:
    """None for a KServe v2 infer answer with outputs, else what is wrong with it."""
    if not isinstance(answer, dict):
        return "answer is not a JSON object"
    outputs = answer.get("outputs")
    if not isinstance(outputs, list) or not outputs:
        return "answer has no outputs"
    return None


def generate_body(target: WatchedTarget, model: str) -> object:
    """The operator's v2 infer request as the generate extension takes it: each input's data by its name."""
    request = target.canary.request or {}
    inputs = request.get("inputs")
    body: dict[str, object] = {str(each["name"]): each.get("data")
                               for each in (inputs if isinstance(inputs, list) else [])
                               if isinstance(each, dict) and "name" in each}
    if request.get("parameters"):
        body["parameters"] = request["parameters"]
    return body


def generate_wrong(answer: object) -> str | None:
    """None for a generate event (a JSON object of outputs), else what is wrong with it."""
    if not isinstance(answer, dict):
        return "the first event is not a JSON object"
    if "error" in answer:
        return "the first event is an error"  # its text is the model's, not shown
    return None if len(answer) > 0 else "the first event is empty"


def model_config(body: bytes) -> ModelConfig:
    """`GET /v2/models/<m>/config` read; raises PageError when it is not a model config."""
    try:
        config = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise PageError("bad_models", "the model config is not JSON") from None
    if not isinstance(config, dict):
        raise PageError("bad_models", "the model config is not a JSON object")
    policy = config.get("model_transaction_policy")
    return ModelConfig(decoupled=isinstance(policy, dict) and policy.get("decoupled") is True)


ENGINE = Engine(
    name="triton",
    parse=parse,
    signature="nv_inference_",
    # Metrics on their own port (a target's metrics_url overrides): url's host, port 8002, /metrics.
    metrics_port=8002,
    health_paths=("/v2/health/live",),
    ready_path="/v2/models/{model}/ready",
    models_path=None,  # no /v1/models: the model is named in the config (PyTriton's repository index is 403)
    canary=Canary(path="/v2/models/{model}/infer", body=canary_body, wrong=canary_wrong, needs_request=True),
    model_config_path="/v2/models/{model}/config",
    model_config=model_config,
    # Its first streamed event, read within the canary's timeout: one answer, however long the stream.
    decoupled_canary=Canary(path="/v2/models/{model}/generate_stream", body=generate_body, wrong=generate_wrong,
                            needs_request=True, stream=True),
    in_flight_signal=in_flight_signal,
    # tritonserver's own threads serve the metrics port, apart from inference (it answered in ms while
    # saturated): accepted and never answered while requests were queued is the whole server frozen.
    facts=EngineFacts(metrics_unanswered_is_stuck=True),
)
