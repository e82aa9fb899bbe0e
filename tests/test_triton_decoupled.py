"""Triton's decoupled (streaming) models and its model-ready route (issue 38), as tables over the pure rules.

The rules: llm_vitals/exporter/decoupled.py (which canary, whether the page can judge the model),
canary.judge_answer (a 501 is a rejection), the adapter's vLLM-backend families and the verdict's
`unjudgeable` and model-ready cases. The I/O (the config read, the first streamed event) is in
tests/test_triton_decoupled_io.py; the real server in tests/real_triton.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import FIXTURES

from llm_vitals.exporter.canary import canaries_of, judge_answer
from llm_vitals.exporter.decoupled import canary_for, config_due, unjudged
from llm_vitals.exporter.engines import ModelConfig, PageError, PageReading
from llm_vitals.exporter.engines.table import engine_of
from llm_vitals.exporter.engines.triton import generate_body, generate_wrong, model_config, parse_text
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import CanaryOutcome, PollError, is_live, is_ready, judge, record_canary
from llm_vitals.targets import RESTARTABLE_STATES

TRITON = FIXTURES / "triton"
ENTRY = engine_of("triton")
CANARY = {"inputs": [{"name": "max_tokens", "shape": [1], "datatype": "INT32", "data": [1]}]}
DECOUPLED, PLAIN = ModelConfig(decoupled=True), ModelConfig(decoupled=False)


def page(state: str) -> str:
    return (TRITON / f"triton-2.51.0-cpu-metrics-{state}.txt").read_text()


def target(**overrides: object) -> TargetSettings:
    config: dict[str, object] = {"name": "tr", "url": "http://127.0.0.1:8000", "engine": "triton", "model": "toy_lm_stream",
                                 "stuck_after": "10s", "down_after": "30s", "canary": {"request": CANARY}}
    config.update(overrides)
    return TargetSettings.model_validate(config)


# --- A 501 is a rejection -------------------------------------------------------------------------

@pytest.mark.parametrize("status,result", [
    (501, "rejected"),  # Triton's infer route and a decoupled model: "HTTP end point doesn't support models with decoupled ..."
    (500, "error"), (502, "error"), (503, "error"), (504, "error"),  # the server's failures stay failures
    (404, "rejected"), (400, "rejected"),
])
def test_a_501_is_a_rejection_and_other_5xx_stay_failures(status: int, result: str) -> None:
    outcome = judge_answer(status, b"", ENTRY.canary)  # type: ignore[arg-type]
    assert outcome.result == result
    if status == 501:
        assert "HTTP 501" in outcome.detail and "generate_stream" in outcome.detail


def test_three_501s_on_an_idle_server_are_canary_rejected_never_unresponsive() -> None:
    t = target()
    verdict = judge(judge(None, parse_text(page("idle")), 0.0, t), parse_text(page("idle")), 5.0, t)
    assert verdict.state == "idle"
    for at in (6.0, 9.0, 12.0, 15.0):
        verdict = record_canary(verdict, judge_answer(501, b"", ENTRY.canary), at, t)  # type: ignore[arg-type]
    verdict = judge(verdict, parse_text(page("idle")), 20.0, t)
    assert (verdict.state, verdict.reason, verdict.canary_failures) == ("idle", "canary_rejected", 0)
    assert "HTTP 501" in verdict.detail


# --- The model's config and the canary it gets -------------------------------------------------------

@pytest.mark.parametrize("body,decoupled", [
    ((TRITON / "triton-2.51.0-cpu-model-config.json").read_bytes(), False),  # the real toy_lm: no policy written
    (b'{"name":"m","model_transaction_policy":{"decoupled":true}}', True),
    (b'{"name":"m","model_transaction_policy":{"decoupled":false}}', False),
    (b'{"name":"m","model_transaction_policy":{}}', False),
    (b'{"name":"m","model_transaction_policy":{"decoupled":"true"}}', False),  # not the boolean the proto writes
])
def test_the_model_config_says_whether_the_model_is_decoupled(body: bytes, decoupled: bool) -> None:
    assert model_config(body) == ModelConfig(decoupled=decoupled)


@pytest.mark.parametrize("body", [b"<html>", b"[]", b"\xff"])
def test_a_model_config_that_is_not_one_is_a_clear_error(body: bytes) -> None:
    with pytest.raises(PageError) as caught:
        model_config(body)
    assert caught.value.reason == "bad_models"


@pytest.mark.parametrize("config,path", [
    (None, "/v2/models/{model}/infer"),  # not read (yet): the plain canary, whose 501 is a rejection
    (PLAIN, "/v2/models/{model}/infer"),
    (DECOUPLED, "/v2/models/{model}/generate_stream"),
])
def test_a_decoupled_model_is_canaried_on_its_generate_stream_route(config: ModelConfig | None, path: str) -> None:
    chosen = canary_for(ENTRY, config)
    assert chosen is not None and chosen.path == path and chosen.stream == (config == DECOUPLED)
    assert canaries_of(target(), None, config) == (chosen,)


def test_engines_without_a_model_config_keep_their_canary() -> None:
    assert canary_for(engine_of("vllm"), DECOUPLED) is None  # its OpenAI ladder (exporter/canary.py)


@pytest.mark.parametrize("engine,model,config,tried,now,due", [
    ("triton", "m", None, None, 0.0, True),
    ("triton", "m", None, 10.0, 20.0, False),  # failed 10 s ago: asked again after 30 s
    ("triton", "m", None, 10.0, 40.0, True),
    ("triton", "m", DECOUPLED, 10.0, 1000.0, False),  # known for this process
    ("triton", None, None, None, 0.0, False),  # no model named: nothing to ask about
    ("vllm", "m", None, None, 0.0, False),  # no such route
])
def test_the_config_is_read_once_per_process_and_retried_after_a_failure(
        engine: str, model: str | None, config: ModelConfig | None, tried: float | None, now: float, due: bool) -> None:
    assert config_due(engine_of(engine), model, config, tried, now, 30.0) is due


def test_the_generate_body_is_the_operators_infer_request_by_input_name() -> None:
    request = {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["Hi"]},
                          {"name": "max_tokens", "shape": [1], "datatype": "INT32", "data": [1]}],
               "parameters": {"stream": True}}
    assert generate_body(target(canary={"request": request}), "m") == {
        "text_input": ["Hi"], "max_tokens": [1], "parameters": {"stream": True}}


@pytest.mark.parametrize("answer,wrong", [
    ({"model_name": "toy_lm_stream", "model_version": "1", "generated": [1]}, None),
    ({"error": "boom"}, "the first event is an error"),
    ({}, "the first event is empty"),
    ([1], "the first event is not a JSON object"),
])
def test_a_streamed_answer_counts_only_as_outputs(answer: object, wrong: str | None) -> None:
    assert generate_wrong(answer) == wrong
    stream = ENTRY.decoupled_canary
    assert stream is not None
    assert judge_answer(200, json.dumps(answer).encode(), stream).result == ("ok" if wrong is None else "rejected")


# --- Judged, or not: the signals that move mid-stream ------------------------------------------------

# The vLLM backend's own families (REPORT_CUSTOM_METRICS), as its src/utils/metrics.py names and
# labels them, beside Triton's: the decoupled model's request was counted when it arrived.
def vllm_backend(running: int, waiting: int, tokens: int, prompt: int = 7) -> str:
    labels = '{model="llm",version="1"}'
    return (f"nv_inference_request_success{labels} 3\nnv_inference_exec_count{labels} 3\n"
            f"nv_inference_compute_infer_duration_us{labels} 900\nnv_inference_pending_request_count{labels} 0\n"
            f"vllm:num_requests_running{labels} {running}\nvllm:num_requests_waiting{labels} {waiting}\n"
            f"vllm:generation_tokens_total{labels} {tokens}\nvllm:prompt_tokens_total{labels} {prompt}\n"
            f"vllm:gpu_cache_usage_perc{labels} 0.25\n")


TRTLLM = (TRITON / "built-trtllm-busy-1.txt").read_text()


@pytest.mark.parametrize("text,model,config,named", [
    (page("busy-1"), "toy_lm_stream", DECOUPLED, True),  # PyTriton's generator: nothing moves mid-stream
    (page("busy-1"), "toy_lm_stream", None, False),  # config not read: judged as today
    (page("busy-1"), "toy_lm", PLAIN, False),
    (vllm_backend(2, 0, 40), "llm", DECOUPLED, False),  # the vLLM backend's tokens move per step
    (TRTLLM, "tensorrt_llm", DECOUPLED, False),  # TensorRT-LLM's iteration counter
    (vllm_backend(2, 0, 40), "other", DECOUPLED, True),  # another model's signals judge nothing of this one
])
def test_a_decoupled_model_is_unjudged_only_without_a_signal_of_its_own_that_moves_mid_stream(
        text: str, model: str, config: ModelConfig | None, named: bool) -> None:
    found = unjudged(ENTRY, model, config, parse_text(text))
    assert (found is not None) is named
    if found is not None:
        assert found.unit == f'model="{model}"' and f"model {model} is decoupled" in found.why


def test_the_vllm_backend_families_are_its_load_and_its_steps() -> None:
    snap = parse_text(vllm_backend(running=2, waiting=1, tokens=40))
    assert (snap.running, snap.waiting, snap.generation_tokens, snap.prompt_tokens, snap.kv_usage) == (2, 1, 40, 7, 0.25)
    assert ('model="llm",version="1"|vllm:generation_tokens_total', 40.0) in snap.series


@pytest.mark.parametrize("tokens,states", [
    # Hung mid-stream: 2 running, tokens flat. Stuck at the first read at least stuck_after (10 s)
    # after the last progress, over two reads: within stuck_after + 2 polls (5 s) of the hang.
    ((10, 20, 20, 20, 20, 20), ["busy", "busy", "busy", "stuck", "stuck", "stuck"]),
    # Streaming: the tokens move every read, nothing completes: busy throughout.
    ((10, 20, 30, 40, 50, 60), ["busy"] * 6),
])
def test_a_hung_decoupled_vllm_backend_model_is_stuck_within_stuck_after_and_two_polls(
        tokens: tuple[int, ...], states: list[str]) -> None:
    t = target(model="llm")
    verdict, seen = None, []
    for i, count in enumerate(tokens):
        snap = parse_text(vllm_backend(running=2, waiting=0, tokens=count))
        snap = replace(snap, unjudged=unjudged(ENTRY, "llm", DECOUPLED, snap))
        verdict = judge(verdict, snap, i * 5.0, t)
        seen.append(verdict.state)
    assert seen == states
    if "stuck" in states:
        hang, found = 5.0, 5.0 * states.index("stuck")
        assert found - hang <= 10.0 + 2 * 5.0


def unjudged_reads(t: TargetSettings, reads: int, start: float = 0.0) -> list[PageReading]:
    snap = parse_text(page("idle-after-busy"))
    return [replace(snap, unjudged=unjudged(ENTRY, "toy_lm_stream", DECOUPLED, snap))] * reads


@pytest.mark.parametrize("outcome", [CanaryOutcome("timeout", "no answer within 5s"),
                                     CanaryOutcome("error", "/v2/models/{model}/generate_stream answered HTTP 500")])
def test_an_unjudged_model_whose_canaries_fail_is_shown_never_unresponsive(outcome: CanaryOutcome) -> None:
    t = target()
    verdict = None
    now = 0.0
    for snap in unjudged_reads(t, 12):
        verdict = judge(verdict, snap, now, t)
        if verdict.state == "idle":
            verdict = record_canary(verdict, outcome, now + 1.0, t)
        assert verdict.state not in RESTARTABLE_STATES, verdict.detail
        now += 5.0
    assert verdict is not None
    assert (verdict.state, verdict.reason, verdict.unit) == ("idle", "unjudgeable", 'model="toy_lm_stream"')
    assert verdict.canary_failures >= 10 and "model toy_lm_stream is decoupled" in verdict.detail
    assert "canaries in a row failed" in verdict.detail
    # Load is never a reason to be unready, and a canary that may wait behind streams cannot vouch.
    assert is_ready(verdict, t, now, draining=False) and is_live(verdict, t, now)


def test_an_unjudged_model_whose_canary_answers_is_idle_and_ready() -> None:
    t = target()
    verdict = None
    for i, snap in enumerate(unjudged_reads(t, 3)):
        verdict = judge(verdict, snap, i * 5.0, t)
    assert verdict is not None
    verdict = record_canary(verdict, CanaryOutcome("ok"), 11.0, t)
    assert (verdict.state, verdict.reason, verdict.canary_failures) == ("idle", "unjudgeable", 0)
    assert is_ready(verdict, t, 12.0, draining=False)


def test_a_judged_model_whose_canaries_fail_is_still_unresponsive() -> None:
    t = target(model="toy_lm")
    verdict = None
    for i in range(6):
        verdict = judge(verdict, parse_text(page("idle-after-busy")), i * 5.0, t)
        if verdict.state == "idle":
            verdict = record_canary(verdict, CanaryOutcome("timeout", "no answer"), i * 5.0 + 1, t)
    assert verdict is not None and verdict.state == "unresponsive"


# --- The model-ready route is not /metrics -----------------------------------------------------------

READY_TIMEOUT = PollError("timeout", "/v2/models/toy_lm/ready took longer than 3s", ready_route=True)


@pytest.mark.parametrize("first,before", [("busy-1", "busy"), ("idle-after-busy", "idle")])
def test_a_model_ready_route_that_times_out_is_no_unanswered_metrics_page(first: str, before: str) -> None:
    # The page came in each of these polls: the server answers, its model-ready route is slow (on the
    # real tier: 3 s while PyTriton bound a model under load). Held, past stuck_after (10 s) and
    # down_after (30 s): never stuck (a frozen server's unanswered page), never down.
    t = target(model="toy_lm", canary={"enabled": False})
    verdict = judge(None, parse_text(page(first)), 0.0, t)
    verdict = judge(verdict, parse_text(page(first)), 5.0, t)
    assert verdict.state == before
    for i in range(2, 12):
        verdict = judge(verdict, READY_TIMEOUT, i * 5.0, t)
        assert (verdict.state, verdict.reason != "metrics_unanswered") == (before, True), verdict.detail
    assert verdict.error_reason == "timeout" and "/v2/models/toy_lm/ready" in verdict.detail


def test_a_model_ready_route_that_answers_404_is_still_down_after_down_after() -> None:
    # A model not loaded (Triton's answer while it loads): not servable, as before.
    t = target(model="toy_lm", canary={"enabled": False})
    verdict = judge(judge(None, parse_text(page("idle")), 0.0, t), parse_text(page("idle")), 5.0, t)
    not_ready = PollError("http_status", "/v2/models/toy_lm/ready answered HTTP 404: the model is not ready",
                          ready_route=True)
    assert judge(verdict, not_ready, 10.0, t).state == "idle"
    assert judge(judge(verdict, not_ready, 10.0, t), not_ready, 36.0, t).state == "down"


def with_success(text: str, model: str, count: int) -> str:
    """`text` with `model`'s request_success and exec_count set to `count` (a request gone in)."""
    out = []
    for line in text.splitlines():
        if line.startswith((f'nv_inference_request_success{{model="{model}"', f'nv_inference_exec_count{{model="{model}"')):
            line = f"{line.rsplit(' ', 1)[0]} {count}"
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("moving,state,reason", [
    # A hung canary went in: Triton counted it (success, exec) on arrival, and nothing came out.
    ("toy_lm_stream", "idle", "unjudgeable"),
    # The other model completed work: that is progress.
    ("toy_lm", "busy", "progress"),
])
def test_an_unjudged_models_own_counters_moving_on_an_idle_read_are_arrivals_not_progress(
        moving: str, state: str, reason: str) -> None:
    t = target()
    base = page("idle-after-busy")
    verdict = None
    for at, count in ((0.0, 10), (5.0, 10), (10.0, 11), (15.0, 12)):
        text = with_success(base, moving, count)
        snap = parse_text(text)
        snap = replace(snap, unjudged=unjudged(ENTRY, "toy_lm_stream", DECOUPLED, snap))
        verdict = judge(verdict, snap, at, t)
        if at == 5.0:
            verdict = record_canary(verdict, CanaryOutcome("timeout", "no answer within 2s"), 6.0, t)
    assert verdict is not None and (verdict.state, verdict.reason) == (state, reason)
    if state == "idle":
        assert verdict.canary_failures == 1  # not reset by the arrivals: shown as failing still
