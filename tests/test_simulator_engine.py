"""The simulator's engine model, stepped directly: no event loop, no sleeping."""

from __future__ import annotations

import pytest

from llm_vitals.sim.config import SimConfig
from llm_vitals.sim.engine import Engine, SimRequest, buckets_1_2_5


def engine_with(**overrides: object) -> Engine:
    return Engine(SimConfig(**overrides))


def submit(engine: Engine, count: int, prompt: int = 10, max_tokens: int = 1000, now: float = 0.0) -> None:
    for i in range(count):
        engine.add_request(SimRequest(f"r{i}", prompt_tokens=prompt, max_tokens=max_tokens), now)


def test_saturated_engine_runs_max_num_seqs_and_queues_the_rest_fifo():
    engine = engine_with(max_num_seqs=2)
    submit(engine, 6)
    engine.step(0.0)
    assert (engine.num_running, engine.num_waiting) == (2, 4)
    assert [r.request_id for r in engine.running] == ["r0", "r1"]
    assert [r.request_id for r in engine.waiting] == ["r2", "r3", "r4", "r5"]
    before = engine.stats.iteration_steps
    for t in range(1, 11):
        engine.step(t * 0.01)
    assert (engine.num_running, engine.num_waiting) == (2, 4)
    assert engine.stats.iteration_steps == before + 10  # every decode step returns output
    assert engine.stats.generation_tokens == 2 * 11


def test_finished_request_frees_its_slot_for_the_next_waiting_one():
    engine = engine_with(max_num_seqs=1)
    submit(engine, 2, max_tokens=3)
    for t in range(3):
        engine.step(float(t))
    assert engine.stats.request_success["length"] == 1
    assert [r.request_id for r in engine.running] == []  # r1 is admitted by the next step
    engine.step(3.0)
    assert [r.request_id for r in engine.running] == ["r1"]
    assert engine.num_waiting == 0


def test_request_generates_exactly_max_tokens():
    engine = engine_with()
    engine.add_request(SimRequest("only", prompt_tokens=5, max_tokens=7), 0.0)
    produced, t = 0, 0.0
    while engine.has_work:
        produced += engine.step(t).new_tokens.get("only", 0)
        t += 0.01
    assert produced == 7
    assert engine.stats.generation_tokens == 7
    assert engine.stats.request_success == {"stop": 0, "length": 1, "abort": 0, "error": 0, "repetition": 0}
    assert engine.stats.histograms["request_generation_tokens"].sum == 7


def test_long_prefill_moves_kv_usage_but_not_the_step_count_until_it_completes():
    engine = engine_with(max_num_batched_tokens=512, max_model_len=4096, kv_cache_tokens=65536)
    engine.add_request(SimRequest("long", prompt_tokens=2000, max_tokens=1), 0.0)
    kv_seen = []
    for t in range(3):  # 3 chunks of 512: 1536 of 2000 prompt tokens computed
        output = engine.step(float(t))
        assert not output.returned_output
        assert output.prefill_tokens == 512
        kv_seen.append(engine.kv_cache_usage)
    assert kv_seen[0] > 0 and kv_seen == sorted(kv_seen) and len(set(kv_seen)) == 3
    assert engine.stats.iteration_steps == 0
    assert engine.stats.prompt_tokens == 0  # prompt counters move when the prefill completes
    assert engine.stats.generation_tokens == 0
    assert engine.steps == 3  # the engine did step; the page just doesn't show it

    last = engine.step(3.0)  # last chunk (464 tokens) samples the first and only token
    assert last.returned_output and last.prefill_tokens == 464
    assert engine.stats.iteration_steps == 1
    assert engine.stats.histograms["iteration_tokens_total"].sum == 2000 + 1
    assert engine.stats.prompt_tokens == 2000
    assert engine.stats.generation_tokens == 1
    assert engine.stats.request_success["length"] == 1


def test_prefill_chunks_share_the_step_budget_with_decodes():
    engine = engine_with(max_num_batched_tokens=100, max_num_seqs=4)
    engine.add_request(SimRequest("decoder", prompt_tokens=10, max_tokens=50), 0.0)
    engine.step(0.0)  # decoder's prefill completes, first token out
    engine.add_request(SimRequest("long", prompt_tokens=500, max_tokens=5), 0.0)
    output = engine.step(1.0)
    assert output.decode_tokens == 1
    assert output.prefill_tokens == 99  # what the decode left of the budget
    assert output.returned_output  # the decode produced a token: this step is counted


def test_step_cost_follows_the_token_rates():
    engine = engine_with(tokens_per_second=100, prefill_tokens_per_second=1000, max_num_batched_tokens=500)
    engine.add_request(SimRequest("a", prompt_tokens=500, max_tokens=5), 0.0)
    assert engine.step(0.0).cost_seconds == pytest.approx(0.5)  # a 500-token chunk, no decode
    assert engine.step(0.5).cost_seconds == pytest.approx(0.01)  # one decode step


def test_abort_counts_as_finished_with_reason_abort_and_frees_the_slot():
    engine = engine_with(max_num_seqs=1)
    submit(engine, 2)
    engine.step(0.0)
    assert engine.abort("r0", 1.0) is not None
    assert engine.abort("nope", 1.0) is None
    assert engine.stats.request_success["abort"] == 1
    engine.step(1.0)
    assert [r.request_id for r in engine.running] == ["r1"]


def test_latency_histograms_use_the_injected_clock():
    engine = engine_with(max_num_seqs=1)
    engine.add_request(SimRequest("a", prompt_tokens=4, max_tokens=3), 10.0)
    engine.step(12.0)  # queued 2 s, first token at 12
    engine.step(12.5)
    engine.step(13.0)
    h = engine.stats.histograms
    assert h["time_to_first_token_seconds"].sum == pytest.approx(2.0)
    assert h["e2e_request_latency_seconds"].sum == pytest.approx(3.0)
    assert h["request_queue_time_seconds"].sum == pytest.approx(2.0)
    assert h["request_decode_time_seconds"].sum == pytest.approx(1.0)
    assert h["inter_token_latency_seconds"].count == 2
    assert h["request_time_per_output_token_seconds"].sum == pytest.approx(0.5)


def test_requests_beyond_the_context_are_refused():
    engine = engine_with(max_model_len=100)
    with pytest.raises(ValueError):
        engine.add_request(SimRequest("big", prompt_tokens=90, max_tokens=20), 0.0)
    with pytest.raises(ValueError):
        engine.add_request(SimRequest("empty", prompt_tokens=0, max_tokens=1), 0.0)


def test_buckets_follow_vllms_1_2_5_rule():
    assert buckets_1_2_5(1024) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    assert buckets_1_2_5(2048)[-1] == 2000


def test_histogram_cumulative_counts_end_with_inf():
    engine = engine_with()
    h = engine.stats.histograms["iteration_tokens_total"]
    for value in (1, 8, 9, 20000):
        h.observe(value)
    cumulative = dict(h.cumulative())
    assert cumulative[1.0] == 1 and cumulative[8.0] == 2 and cumulative[16.0] == 3
    assert cumulative[float("inf")] == 4 == h.count


def test_config_rejects_nonsense():
    with pytest.raises(ValueError):
        SimConfig(max_num_seqs=0)
    with pytest.raises(ValueError):
        SimConfig(typo_field=1)
    with pytest.raises(ValueError):
        SimConfig(max_model_len=4096, kv_cache_tokens=1024)
