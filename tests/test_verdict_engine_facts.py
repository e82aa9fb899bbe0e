"""Engine-neutral verdict inputs, as tables with an injected clock: restart tokens, counter resets,
/metrics that never answers, busy signs, and progress named by the engine."""

from __future__ import annotations

import pytest
from verdict_tables import T0, Case, replay

from llm_vitals.exporter.engines import EngineFacts, PageReading
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import Observation, PollError, Verdict

LLAMA = EngineFacts(metrics_unanswered_is_stuck=True)
VLLM = EngineFacts()
TIMEOUT = PollError("timeout", "/metrics took longer than 10s")
REFUSED = PollError("refused", "/metrics: connection refused")
NO_CONNECT = PollError("connect", "/metrics: no connection within the connect timeout")


def target(**overrides: object) -> TargetSettings:
    config: dict[str, object] = {"name": "t", "url": "http://127.0.0.1:1", "stuck_after": 60, "startup_grace": 0}
    config.update(overrides)
    return TargetSettings.model_validate(config)


def snap(running: float = 0, waiting: float = 0, steps: float | None = 0, *, token: str | None = None,
         start: float | None = None, counters: dict[str, float] | None = None,
         gauges: dict[str, float] | None = None, signs: dict[str, float] | None = None) -> PageReading:
    return PageReading(running, waiting, steps, process_start_time=start, restart_token=token,
                       more_counters=tuple((counters or {}).items()), more_gauges=tuple((gauges or {}).items()),
                       busy_signs=tuple((signs or {}).items()))


def run(rows: list[tuple[float, Observation]], facts: EngineFacts = VLLM, settings: TargetSettings | None = None) -> Verdict:
    return replay(rows, settings or target(), facts)[-1]


CASES = [
    # -- restart: an opaque token compared for inequality only ------------------------------------
    Case("token_changes_to_a_smaller_value_is_one_restart",
         [(0, snap(1, 0, 500, token="1860019350")), (5, snap(0, 0, 0, token="1571301719"))], "starting", "restart", 1),
    Case("same_token_counters_moving_is_progress",
         [(0, snap(1, 0, 500, token="a")), (5, snap(1, 0, 600, token="a"))], "busy", "progress"),
    Case("same_token_counter_fell_is_a_bad_read_not_a_restart",
         [(0, snap(1, 0, 500, token="a")), (5, snap(1, 0, 10, token="a"))], "down", "bad_metrics",
         settings={"down_after": 5}),
    Case("same_token_counter_fell_once_is_one_bad_read_the_state_held",
         [(0, snap(1, 0, 500, token="a")), (5, snap(1, 0, 600, token="a")), (10, snap(1, 0, 10, token="a"))],
         "busy", "progress"),
    Case("token_wins_over_a_start_time",
         [(0, snap(1, 0, 500, token="a", start=100.0)), (5, snap(1, 0, 600, token="b", start=100.0))],
         "starting", "restart", 1),
    # -- restart without start time or token: a counter reset --------------------------------------
    Case("no_start_time_counter_reset_is_one_restart",
         [(0, snap(2, 1, 700)), (5, snap(0, 0, 0)), (10, snap(0, 0, 0))], "idle", "idle", 1),
    Case("an_engine_counter_reset_is_a_restart",
         [(0, snap(1, 0, None, counters={"exec_count": 40})), (5, snap(0, 0, None, counters={"exec_count": 0}))],
         "starting", "restart", 1),
    Case("an_engine_gauge_falling_is_progress_not_a_restart",
         [(0, snap(1, 0, None, gauges={"num_used_tokens": 8192})),
          (5, snap(1, 0, None, gauges={"num_used_tokens": 4096}))], "busy", "progress", 0),
    # -- progress named by the engine -----------------------------------------------------------
    Case("only_an_engine_counter_moves_is_progress",
         [(0, snap(1, 1, 10, counters={"realtime_tokens": 4085})), (30, snap(1, 1, 10, counters={"realtime_tokens": 6297})),
          (70, snap(1, 1, 10, counters={"realtime_tokens": 7000}))], "busy", "progress"),
    Case("engine_counters_frozen_past_stuck_after_is_stuck",
         [(0, snap(1, 1, None, counters={"exec_count": 4})), (30, snap(1, 1, None, counters={"exec_count": 4})),
          (61, snap(1, 1, None, counters={"exec_count": 4}))], "stuck", "no_progress"),
    # -- busy signs: running and waiting 0, yet work is owed ---------------------------------------
    Case("a_busy_sign_makes_a_zero_queue_busy_not_idle",
         [(0, snap(0, 0, 13, signs={"http_requests_active": 1})), (1, snap(0, 0, 4109, signs={"http_requests_active": 1}))],
         "busy", "progress"),
    Case("a_busy_sign_with_nothing_moving_is_stuck_after_stuck_after",
         [(0, snap(0, 0, 13, signs={"num_used_tokens": 4096})), (30, snap(0, 0, 13, signs={"num_used_tokens": 4096})),
          (61, snap(0, 0, 13, signs={"num_used_tokens": 4096}))], "stuck", "no_progress"),
    Case("a_busy_sign_at_zero_is_idle",
         [(0, snap(0, 0, 13, signs={"http_requests_active": 0})), (5, snap(0, 0, 13, signs={"http_requests_active": 0}))],
         "idle", "idle"),
    # -- /metrics accepted and never answered -----------------------------------------------------
    Case("unanswered_while_pending_is_busy_until_stuck_after",
         [(0, snap(2, 1, 700)), (5, TIMEOUT), (30, TIMEOUT)], "busy", "metrics_unanswered", facts=LLAMA,
         settings={"down_after": 300}),
    # Every slot busy and nothing queued: not saturated, so no client holds the reads back (issue 38).
    Case("unanswered_while_pending_for_down_after_is_stuck_before_stuck_after",
         [(0, snap(2, 0, 700)), (5, TIMEOUT), (30, TIMEOUT)], "stuck", "metrics_unanswered", facts=LLAMA),
    Case("unanswered_while_pending_for_stuck_after_is_stuck",
         [(0, snap(2, 1, 700)), (5, TIMEOUT), (30, TIMEOUT), (61, TIMEOUT)], "stuck", "metrics_unanswered", facts=LLAMA),
    Case("unanswered_after_frozen_counters_keeps_the_stuck_clock",
         [(0, snap(2, 1, 700)), (20, snap(2, 1, 700)), (40, TIMEOUT), (61, TIMEOUT)], "stuck", "metrics_unanswered",
         facts=LLAMA),
    Case("one_unanswered_read_past_stuck_after_and_down_after_is_not_enough",
         [(0, snap(2, 1, 700)), (100, TIMEOUT)], "busy", "metrics_unanswered", facts=LLAMA),
    Case("unanswered_on_vllm_is_down_its_metrics_only_get_slow",
         [(0, snap(2, 1, 700)), (5, TIMEOUT), (30, TIMEOUT), (61, TIMEOUT)], "down", "timeout", facts=VLLM),
    Case("unanswered_while_idle_for_down_after_is_stuck_frozen_not_down",
         [(0, snap(0, 0, 700)), (5, TIMEOUT), (30, TIMEOUT), (61, TIMEOUT)], "stuck", "metrics_unanswered", facts=LLAMA),
    Case("unanswered_while_idle_short_of_down_after_keeps_idle",
         [(0, snap(0, 0, 700)), (5, snap(0, 0, 700)), (10, TIMEOUT), (30, TIMEOUT)], "idle", "idle", facts=LLAMA),
    Case("refused_while_pending_is_down_not_stuck",
         [(0, snap(2, 1, 700)), (5, REFUSED), (30, REFUSED), (61, REFUSED)], "down", "refused", facts=LLAMA),
    Case("refused_once_is_down_at_once",
         [(0, snap(2, 1, 700)), (5, REFUSED)], "down", "refused", facts=LLAMA),
    Case("a_connect_that_timed_out_is_no_evidence_of_a_frozen_server",
         [(0, snap(0, 0, 700)), (5, NO_CONNECT), (30, NO_CONNECT), (61, NO_CONNECT)], "down", "connect", facts=LLAMA),
    Case("a_down_read_breaks_the_unanswered_chain",
         [(0, snap(2, 1, 700)), (5, REFUSED), (30, TIMEOUT), (61, TIMEOUT)], "down", "timeout", facts=LLAMA),
    Case("answered_again_and_moving_is_busy",
         [(0, snap(2, 1, 700)), (5, TIMEOUT), (30, TIMEOUT), (61, TIMEOUT), (66, snap(2, 1, 905))],
         "busy", "progress", facts=LLAMA),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_engine_facts_table(case: Case) -> None:
    verdict = run(case.rows, case.facts, target(**case.settings))
    assert (verdict.state, verdict.reason, verdict.restarts) == (case.state, case.reason, case.restarts), verdict.detail


def test_stuck_by_unanswered_metrics_counts_from_the_last_progress() -> None:
    verdict = run([(0, snap(2, 1, 700)), (10, snap(2, 1, 800)), (20, TIMEOUT), (75, TIMEOUT)], LLAMA)
    assert verdict.state == "stuck" and verdict.stuck_for(T0 + 80) == pytest.approx(70)
    assert verdict.up is False and verdict.error_reason == "timeout"
    assert "never answered" in verdict.detail


def test_busy_signs_appear_in_the_detail_and_keep_a_canary_away() -> None:
    reading = snap(0, 0, 13, signs={"http_requests_active": 1, "num_used_tokens": 0})
    assert reading.pending
    verdict = run([(0, reading), (1, reading)])
    assert "http_requests_active 1" in verdict.detail and "num_used_tokens" not in verdict.detail


def test_the_facts_default_to_the_engine_table() -> None:
    rows: list[tuple[float, Observation]] = [(0, snap(2, 1, 700)), (5, TIMEOUT), (30, TIMEOUT), (61, TIMEOUT)]
    verdict = replay(rows, target(engine="llamacpp"))[-1]  # no facts given: the engine table's
    assert (verdict.state, verdict.reason) == ("stuck", "metrics_unanswered")


@pytest.mark.parametrize(("engine", "state", "reason"), [
    ("llamacpp", "stuck", "metrics_unanswered"),  # its engine loop serves /metrics
    ("triton", "stuck", "metrics_unanswered"),  # tritonserver frozen whole: its metrics threads are apart from inference
    ("vllm", "down", "timeout"),  # its /metrics gets slow under load
    ("sglang", "down", "timeout"),
])
def test_which_engines_read_metrics_unanswered_while_pending_as_stuck(engine: str, state: str, reason: str) -> None:
    rows: list[tuple[float, Observation]] = [(0, snap(0, 3, 700)), (5, TIMEOUT), (30, TIMEOUT), (61, TIMEOUT)]
    verdict = replay(rows, target(engine=engine, model="m"))[-1]
    assert (verdict.state, verdict.reason) == (state, reason), verdict
