"""The pure verdict, as tables: each row is a sequence of (time, observation) and the verdict it must end in."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from verdict_tables import T0, Case, replay

from llm_vitals.exporter.engines import PageReading
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import (
    CanaryOutcome,
    ModelsOk,
    PollError,
    Verdict,
    canary_overlapped,
    drain_holds,
    exporter_late,
    health_check_due,
    initial,
    is_live,
    is_ready,
    is_started,
    judge,
    recently_unhealthy,
    record_canary,
)

PST = 1_795_999_000.0  # process start time of the first lifetime


def target(**overrides: object) -> TargetSettings:
    config = {"name": "t", "url": "http://127.0.0.1:1", "stuck_after": 60, "startup_grace": 300}
    config.update(overrides)
    return TargetSettings.model_validate(config)


def snap(running: float = 0, waiting: float = 0, steps: float = 0, gen: float = 0, prompt: float = 0,
         finished: float = 0, kv: float = 0.0, pst: float | None = PST) -> PageReading:
    return PageReading(running, waiting, steps, gen, prompt, finished, kv, pst)


def run(rows: list[tuple[float, object]], settings: TargetSettings | None = None) -> list[Verdict]:
    """Feed observations (or canary outcomes) at their times; return every verdict."""
    return replay(rows, settings or target())


# An idle server as the verdict sees it: two reads of one lifetime, nothing pending, nothing moved.
QUIET = [(-5, snap()), (0, snap())]

CASES = [
    Case("nothing_running_or_waiting_over_a_whole_interval_is_idle", [(0, snap()), (5, snap())], "idle", "idle"),
    Case("first_read_with_nothing_pending_is_starting_not_yet_idle", [(0, snap())], "starting", "startup",
         checks={"started": True, "up": True}),
    Case("first_read_with_work_is_busy_not_judged", [(0, snap(running=2, steps=5))], "busy", "progress"),
    Case("work_pending_and_steps_moving_is_busy",
         [(0, snap(running=2, steps=5)), (5, snap(running=2, steps=9))], "busy", "progress",
         checks={"steps_per_second": 0.8, "stuck_seconds": 0.0}),
    Case("long_prefill_without_output_tokens_is_busy_not_stuck",
         [(0, snap(running=1, kv=0.1)), (30, snap(running=1, kv=0.2)), (61, snap(running=1, kv=0.3)),
          (91, snap(running=1, kv=0.4))], "busy", "progress"),
    Case("running_0_waiting_with_steps_advancing_is_busy",
         [(0, snap(waiting=3, steps=1)), (30, snap(waiting=3, steps=2)), (70, snap(waiting=3, steps=3))],
         "busy", "progress"),
    Case("prompt_tokens_or_finished_moving_is_progress",
         [(0, snap(running=1)), (40, snap(running=1, prompt=900)), (80, snap(running=1, prompt=900, finished=1))],
         "busy", "progress"),
    Case("pending_without_progress_past_stuck_after_over_two_reads_is_stuck",
         [(0, snap(running=2, steps=5)), (5, snap(running=2, steps=9)), (35, snap(running=2, steps=9)),
          (65, snap(running=2, steps=9))], "stuck", "no_progress",
         checks={"stuck_seconds": 60.0, "reads_without_progress": 2}),
    Case("one_read_without_progress_is_not_stuck_even_after_stuck_after",
         [(0, snap(running=2, steps=5)), (100, snap(running=2, steps=5))], "busy", "waiting_for_progress",
         checks={"stuck_seconds": 100.0, "reads_without_progress": 1}),
    Case("many_reads_without_progress_short_of_stuck_after_is_not_stuck",
         [(t, snap(running=2, steps=5)) for t in range(0, 60, 5)], "busy", "waiting_for_progress",
         checks={"stuck_seconds": 55.0}),
    Case("stuck_clock_starts_when_work_appears_not_at_last_idle_progress",
         [(0, snap(steps=5)), (5, snap(steps=5)), (600, snap(steps=5)), (605, snap(running=1, steps=5)),
          (610, snap(running=1, steps=5))], "busy", "waiting_for_progress", checks={"stuck_seconds": 10.0}),
    Case("stuck_that_moves_again_is_busy",
         [(0, snap(running=2, steps=5)), (35, snap(running=2, steps=5)), (65, snap(running=2, steps=5)),
          (70, snap(running=2, steps=6))], "busy", "progress", checks={"stuck_seconds": 0.0}),
    Case("start_time_changed_is_a_restart_with_counters_rebased_not_yet_idle",
         [(0, snap(running=2, steps=900, gen=9000)), (5, snap(steps=0, gen=0, pst=PST + 100))], "starting", "restart",
         checks={"restarts": 1, "steps_per_second": None, "last_restart_at": T0 + 5}),
    Case("a_restarted_process_is_idle_after_a_quiet_interval_of_its_own",
         [(0, snap(running=2, steps=900, gen=9000)), (5, snap(steps=0, gen=0, pst=PST + 100)),
          (10, snap(steps=0, gen=0, pst=PST + 100))], "idle", "idle", checks={"restarts": 1}),
    # A restarted process is `starting` until a read of its own shows it servable, work pending or not.
    Case("restart_with_work_pending_is_starting_not_stuck_nor_negative",
         [(0, snap(running=2, steps=900)), (70, snap(running=2, steps=900)), (140, snap(running=1, steps=3, pst=PST + 1))],
         "starting", "restart", checks={"restarts": 1, "steps_per_second": None, "stuck_seconds": 0.0, "started": False}),
    Case("a_restarted_process_serving_on_its_second_read_is_busy_and_started",
         [(0, snap(running=2, steps=900)), (140, snap(running=1, steps=3, pst=PST + 1)),
          (145, snap(running=1, steps=9, pst=PST + 1))],
         "busy", "progress", checks={"restarts": 1, "started": True}),
    Case("counter_down_without_start_time_is_a_restart",
         [(0, snap(steps=900, gen=50, pst=None)), (5, snap(steps=3, gen=1, pst=None))], "starting", "restart",
         checks={"restarts": 1}),
    Case("restart_is_counted_once_not_on_each_later_read",
         [(0, snap(steps=9)), (5, snap(steps=0, pst=PST + 1)), (10, snap(steps=0, pst=PST + 1)),
          (15, snap(steps=0, pst=PST + 1))],
         "idle", "idle", checks={"restarts": 1}),
    Case("restart_across_a_down_period_is_counted",
         [(0, snap(steps=9)), (5, PollError("connect", "refused")), (10, snap(steps=0, pst=PST + 7))], "starting", "restart",
         checks={"restarts": 1}),
    # `down` needs failures that last down_after (no good read for that long); these set it to one poll.
    Case("counter_backwards_with_same_start_time_is_down_bad_metrics",
         [(0, snap(steps=900)), (5, snap(steps=3))], "down", "bad_metrics", settings={"down_after": 5},
         checks={"restarts": 0, "up": False}),
    Case("connection_refused_after_serving_is_down", [(0, snap()), (5, PollError("connect", "refused"))], "down", "connect",
         settings={"down_after": 5}, checks={"up": False, "error_reason": "connect"}),
    Case("timeout_is_down", [(0, snap()), (5, PollError("timeout", "slow"))], "down", "timeout", settings={"down_after": 5}),
    Case("http_5xx_is_down", [(0, snap()), (5, PollError("http_status", "HTTP 500"))], "down", "http_status",
         settings={"down_after": 5}),
    Case("health_503_is_down", [(0, snap(running=2)), (5, PollError("health_503", "dead"))], "down", "health_503"),
    Case("html_or_garbage_is_down", [(0, snap()), (5, PollError("bad_metrics", "html"))], "down", "bad_metrics",
         settings={"down_after": 5}),
    Case("page_over_cap_is_down", [(0, snap()), (5, PollError("too_large", "big"))], "down", "too_large",
         settings={"down_after": 5}),
    Case("never_servable_within_grace_is_starting",
         [(0, PollError("connect", "refused")), (299, PollError("connect", "refused"))], "starting", "startup",
         checks={"error_reason": "connect"}),
    Case("never_servable_past_grace_is_down",
         [(0, PollError("connect", "refused")), (301, PollError("connect", "refused"))], "down", "connect"),
    Case("starting_then_first_good_read_is_started_and_idle_after_a_quiet_interval",
         [(0, PollError("connect", "refused")), (5, snap()), (10, snap())], "idle", "idle", checks={"started": True}),
    Case("idle_with_three_canary_failures_is_unresponsive",
         [*QUIET, (1, CanaryOutcome("timeout")), (31, CanaryOutcome("error")), (61, CanaryOutcome("timeout"))],
         "unresponsive", "canary_failed"),
    Case("unresponsive_stays_on_next_idle_poll",
         [*QUIET, (1, CanaryOutcome("timeout")), (31, CanaryOutcome("timeout")), (61, CanaryOutcome("timeout")),
          (65, snap())], "unresponsive", "canary_failed"),
    Case("a_restart_clears_the_old_process_canary_failures",
         [*QUIET, (1, CanaryOutcome("timeout")), (31, CanaryOutcome("timeout")), (61, CanaryOutcome("timeout")),
          (65, snap()), (200, snap(pst=PST + 150)), (205, snap(pst=PST + 150))], "idle", "idle",
         checks={"canary_failures": 0, "restarts": 1}),
    Case("two_canary_failures_are_not_unresponsive",
         [*QUIET, (1, CanaryOutcome("timeout")), (31, CanaryOutcome("timeout"))], "idle", "idle"),
    Case("a_good_canary_brings_unresponsive_back_to_idle",
         [*QUIET, (1, CanaryOutcome("error")), (2, CanaryOutcome("error")), (3, CanaryOutcome("error")),
          (4, CanaryOutcome("ok"))], "idle", "canary_ok", checks={"canary_failures": 0}),
    Case("progress_clears_canary_failures",
         [*QUIET, (1, CanaryOutcome("error")), (2, CanaryOutcome("error")), (5, snap(running=1, steps=1)),
          (6, snap(steps=4)), (7, snap(steps=4)), (8, CanaryOutcome("error"))], "idle", "idle",
         checks={"canary_failures": 1}),
    Case("proxy_with_models_is_idle_never_compared",
         [(0, ModelsOk(("tiny",))), (100, ModelsOk(("tiny",)))], "idle", "proxy_models_ok", settings={"role": "proxy"},
         checks={"snapshot": None, "models": ("tiny",)}),
    Case("proxy_without_models_is_down",
         [(0, ModelsOk(("tiny",))), (5, PollError("connect", "refused"))], "down", "connect",
         settings={"role": "proxy", "down_after": 5}),
    Case("proxy_with_one_failed_read_keeps_its_state",
         [(0, ModelsOk(("tiny",))), (5, PollError("connect", "refused"))], "idle", "proxy_models_ok",
         settings={"role": "proxy"}, checks={"up": False, "error_reason": "connect", "failed_reads": 1}),
    Case("proxy_never_answered_is_starting", [(0, PollError("connect", "refused"))], "starting", "startup",
         settings={"role": "proxy"}),
    Case("openai_engine_judged_by_models_and_canary",
         [(0, ModelsOk(("m",))), (1, CanaryOutcome("error")), (2, CanaryOutcome("error")), (3, CanaryOutcome("error")),
          (5, ModelsOk(("m",)))], "unresponsive", "canary_failed", settings={"engine": "openai"}),
]


def frozen_with_one_read_in_three_timing_out(until: float, every: float = 5.0) -> list[tuple[float, object]]:
    """Work moving up to t=5, then frozen with work pending; from t=15 every third read times out."""
    rows: list[tuple[float, object]] = [(0, snap(running=2, steps=5)), (5, snap(running=2, steps=6))]
    t, n = 10.0, 0
    while t <= until:
        rows.append((t, PollError("timeout", "slow") if n % 3 == 1 else snap(running=2, steps=6)))
        t, n = t + every, n + 1
    return rows


# Partial evidence (issue 23): a missed read is not progress, and not proof either.
CASES += [
    Case("a_failed_read_keeps_the_state_and_the_last_good_reading",
         [(0, snap(running=2, steps=5)), (5, snap(running=2, steps=9)), (10, PollError("timeout", "slow"))],
         "busy", "progress",
         checks={"up": False, "error_reason": "timeout", "failed_reads": 1, "snapshot": snap(running=2, steps=9),
                 "last_progress": T0 + 5}),
    Case("stuck_stays_stuck_through_an_isolated_failed_read",
         [(0, snap(running=2, steps=5)), (35, snap(running=2, steps=5)), (65, snap(running=2, steps=5)),
          (70, PollError("timeout", "slow"))], "stuck", "no_progress",
         checks={"up": False, "error_reason": "timeout", "last_progress": T0}),
    Case("the_next_good_page_is_compared_with_the_last_good_one_across_a_failed_read",
         [(0, snap(running=2, steps=5)), (5, PollError("connect", "refused")), (10, snap(running=2, steps=6))],
         "busy", "progress", checks={"steps_per_second": 0.1, "failed_reads": 0, "up": True}),
    Case("the_stuck_clock_spans_failed_reads",
         [(0, snap(running=2, steps=5)), (5, snap(running=2, steps=5)), (10, PollError("timeout", "slow")),
          (15, PollError("timeout", "slow")), (20, snap(running=2, steps=5))], "busy", "waiting_for_progress",
         checks={"stuck_seconds": 20.0, "reads_without_progress": 2}),
    Case("frozen_with_one_read_in_three_timing_out_is_stuck_within_stuck_after_and_two_polls",
         frozen_with_one_read_in_three_timing_out(until=35), "stuck", "no_progress", settings={"stuck_after": 20}),
    Case("failures_short_of_down_after_keep_the_state",
         [*QUIET, *[(t, PollError("connect", "refused")) for t in (5, 10, 15, 20, 25)]], "idle", "idle",
         checks={"up": False, "failed_reads": 5}),
    Case("failures_that_last_down_after_are_down",
         [*QUIET, *[(t, PollError("connect", "refused")) for t in (5, 10, 15, 20, 25, 30)]], "down", "connect",
         checks={"failed_reads": 6, "stuck_seconds": 0.0}),
    Case("a_stuck_server_that_stays_unreadable_for_down_after_is_down",
         [(0, snap(running=2, steps=5)), (35, snap(running=2, steps=5)), (65, snap(running=2, steps=5)),
          *[(t, PollError("timeout", "slow")) for t in (75, 85, 95)]], "down", "timeout", checks={"stuck_seconds": 0.0}),
    Case("down_rebases_the_stuck_clock_for_the_next_good_read",
         [(0, snap(running=2, steps=5)), (40, PollError("connect", "refused")), (45, snap(running=2, steps=5))],
         "busy", "waiting_for_progress", settings={"down_after": 5}, checks={"stuck_seconds": 5.0}),
    # Idle means nothing pending and nothing moved.
    Case("counters_that_moved_with_gauges_at_0_are_busy",
         [*QUIET, (5, snap(steps=3, gen=3, finished=1))], "busy", "progress", checks={"stuck_seconds": 0.0}),
    Case("idle_needs_a_whole_quiet_interval_after_work",
         [*QUIET, (5, snap(steps=3, finished=1)), (10, snap(steps=3, finished=1))], "idle", "idle"),
    Case("work_pending_at_the_last_read_and_gone_now_is_not_idle_yet",
         [*QUIET, (5, snap(running=1)), (10, snap())], "busy", "waiting_for_progress"),
    Case("a_server_fed_one_request_at_a_time_stays_busy_between_requests",
         [*QUIET, *[(t, snap(steps=t, gen=t, finished=t // 5)) for t in (5, 10, 15, 20)]], "busy", "progress"),
    # A read that timed out while the exporter's own loop lagged is evidence of nothing.
    Case("exporter_late_reads_are_not_stuck_even_where_unanswered_metrics_are",
         [(0, snap(running=2, steps=5)), (5, snap(running=2, steps=6)),
          *[(t, PollError("exporter_late", "late")) for t in range(10, 120, 5)]], "busy", "progress",
         settings={"engine": "llamacpp", "stuck_after": 20},
         checks={"reads_without_progress": 0, "error_reason": "exporter_late", "up": False, "failed_reads": 0}),
    Case("the_same_reads_timing_out_on_a_healthy_exporter_are_stuck_on_llamacpp",
         [(0, snap(running=2, steps=5)), (5, snap(running=2, steps=6)),
          *[(t, PollError("timeout", "slow")) for t in range(10, 120, 5)]], "stuck", "metrics_unanswered",
         settings={"engine": "llamacpp", "stuck_after": 20}),
    Case("exporter_late_reads_never_make_down",
         [*QUIET, *[(t, PollError("exporter_late", "late")) for t in range(5, 300, 5)]], "idle", "idle",
         settings={"down_after": 5}, checks={"error_reason": "exporter_late"}),
    Case("stuck_stays_stuck_through_exporter_late_reads",
         [(0, snap(running=2, steps=5)), (35, snap(running=2, steps=5)), (65, snap(running=2, steps=5)),
          (70, PollError("exporter_late", "late"))], "stuck", "no_progress", checks={"last_progress": T0}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_verdict_table(case: Case) -> None:
    verdict = run(case.rows, target(**case.settings))[-1]
    assert (verdict.state, verdict.reason) == (case.state, case.reason), verdict.detail
    for name, expected in case.checks.items():
        actual = getattr(verdict, name)
        if isinstance(expected, float):
            assert actual == pytest.approx(expected), name
        else:
            assert actual == expected, name


def test_since_holds_while_the_state_holds_and_moves_on_change() -> None:
    verdicts = run([(0, snap()), (5, snap()), (10, snap()), (15, snap(running=1, steps=1)), (20, snap(running=1, steps=2))])
    assert [v.state for v in verdicts] == ["starting", "idle", "idle", "busy", "busy"]
    assert [v.since for v in verdicts] == [T0, T0 + 5, T0 + 5, T0 + 15, T0 + 15]


def test_rates_never_go_negative_across_a_restart() -> None:
    verdicts = run([(0, snap(running=2, steps=100, gen=1000)), (5, snap(running=2, steps=5, gen=10, pst=PST + 2)),
                    (10, snap(running=2, steps=15, gen=30, pst=PST + 2))])
    assert verdicts[1].steps_per_second is None
    assert verdicts[2].steps_per_second == pytest.approx(2.0)
    assert verdicts[2].generation_tokens_per_second == pytest.approx(4.0)


def test_sigstop_fixture_pages_become_stuck() -> None:
    from conftest import VLLM_FIXTURES

    from llm_vitals.exporter.engines.vllm import parse_page

    frozen = parse_page((VLLM_FIXTURES / "vllm-0.32.0-cpu-metrics-enginecore-sigstop.txt").read_bytes())
    verdict = run([(0, frozen), (30, frozen), (61, frozen)])[-1]
    assert verdict.state == "stuck"


def test_ready_never_depends_on_queue_length() -> None:
    settings = target()
    verdict = run([(0, snap(running=4, waiting=500, steps=1)), (5, snap(running=4, waiting=900, steps=2))], settings)[-1]
    assert verdict.state == "busy"
    assert is_ready(verdict, settings, T0 + 5, draining=False)


def test_ready_is_false_when_draining_stuck_down_or_not_started() -> None:
    settings = target()
    busy = run([(0, snap(running=1, steps=1)), (5, snap(running=1, steps=2))], settings)[-1]
    assert not is_ready(busy, settings, T0 + 5, draining=True)
    stuck = run([(0, snap(running=1)), (35, snap(running=1)), (65, snap(running=1))], settings)[-1]
    assert not is_ready(stuck, settings, T0 + 65, draining=False)
    down = run([(0, snap()), (5, PollError("connect", "refused"))], target(down_after=5))[-1]
    assert down.state == "down" and not is_ready(down, settings, T0 + 5, draining=False)
    starting = run([(0, PollError("connect", "refused"))], settings)[-1]
    assert not is_ready(starting, settings, T0, draining=False) and not is_started(starting)


def test_idle_server_is_ready_only_with_fresh_evidence() -> None:
    settings = target(canary={"interval": 30})
    idle = run(QUIET, settings)[-1]
    assert idle.state == "idle" and not is_ready(idle, settings, T0, draining=False)  # no canary yet
    served = record_canary(idle, CanaryOutcome("ok"), T0 + 1, settings)
    assert is_ready(served, settings, T0 + 1, draining=False)
    assert is_ready(served, settings, T0 + 90, draining=False)
    assert not is_ready(served, settings, T0 + 92, draining=False)  # fresh_for = 3 x interval


def test_a_restarted_idle_server_is_ready_only_once_its_own_canary_answers() -> None:
    settings = target(canary={"interval": 30})
    rows = [*QUIET, (1, CanaryOutcome("ok")), (5, PollError("connect", "refused")), (10, snap(pst=PST + 9))]
    restarted = run(rows, settings)[-1]
    assert (restarted.state, restarted.reason, restarted.restarts) == ("starting", "restart", 1)
    assert not is_ready(restarted, settings, T0 + 10, draining=False)  # not judged idle yet
    idle = judge(restarted, snap(pst=PST + 9), T0 + 15, settings)
    assert idle.state == "idle"
    assert not is_ready(idle, settings, T0 + 15, draining=False)  # the old process's canary
    served = record_canary(idle, CanaryOutcome("ok"), T0 + 16, settings)
    assert is_ready(served, settings, T0 + 16, draining=False)


def test_recently_unhealthy_remembers_an_unhealthy_read_for_the_window() -> None:
    settings = target(stuck_after=10)
    rows = [(0, snap(running=1)), (5, snap(running=1)), (10, snap(running=1)), (11, snap(running=1, steps=1))]
    verdicts = run(rows, settings)
    stuck, recovered = verdicts[-2], verdicts[-1]
    assert (stuck.state, recovered.state) == ("stuck", "busy")
    assert recovered.last_unhealthy_at == T0 + 10
    assert recently_unhealthy(stuck, T0 + 500, window=2)  # unhealthy now, whatever the window
    assert recently_unhealthy(recovered, T0 + 12, window=2)
    assert not recently_unhealthy(recovered, T0 + 12.5, window=2)
    never = run([(0, snap()), (5, snap(running=1, steps=1))], settings)[-1]
    assert never.last_unhealthy_at is None and not recently_unhealthy(never, T0 + 5, window=2)
    failed = run(QUIET + [(i, CanaryOutcome("timeout")) for i in (1, 2, 3)], settings)[-1]
    assert failed.state == "unresponsive" and failed.last_unhealthy_at == T0 + 3


def test_liveness_fails_only_when_stuck_past_the_budget() -> None:
    settings = target()  # budget 2 x 60 s
    rows = [(0, snap(running=1)), (35, snap(running=1)), (65, snap(running=1))]
    stuck = run(rows, settings)[-1]
    assert stuck.state == "stuck"
    assert is_live(stuck, settings, T0 + 120)
    assert not is_live(stuck, settings, T0 + 121)
    down = run([(0, snap()), (5, PollError("connect", "refused"))], target(down_after=5))[-1]
    assert down.state == "down" and is_live(down, settings, T0 + 10_000)


def test_health_503_with_a_frozen_page_is_down_any_other_answer_is_no_news() -> None:
    settings = target()
    frozen = snap(running=2, steps=5)
    first = judge(None, frozen, T0, settings)
    dead = judge(first, frozen, T0 + 5, settings, health=("/health", 503))
    assert (dead.state, dead.reason, dead.up, dead.detail) == ("down", "health_503", False,
                                                               "/health answered 503: the engine is dead")
    for other in (("/health", 200), ("/health", 500), None):  # a slow or failing /health must not turn stuck into down
        verdict = judge(first, frozen, T0 + 5, settings, health=other)
        assert verdict.state == "busy" and verdict.up


@pytest.mark.parametrize(
    ("case", "previous", "page", "due"),
    [
        ("pending, nothing moved", dict(running=2, steps=5), dict(running=2, steps=5), True),
        ("pending, steps moved", dict(running=2, steps=5), dict(running=2, steps=6), False),
        ("idle, canaries fine", dict(steps=5), dict(steps=5), False),
        # vLLM whose Worker died aborts its queue and reads idle: a failed canary is doubt enough.
        ("idle, last canary failed", dict(steps=5, canary_failures=1), dict(steps=5), True),
        ("pending, first read", None, dict(running=2), False),
    ],
)
def test_health_check_due_table(case: str, previous: dict | None, page: dict, due: bool) -> None:
    settings = target()
    before = initial(T0)
    if previous is not None:
        failures = previous.pop("canary_failures", 0)
        before = replace(judge(None, snap(**previous), T0, settings), canary_failures=failures)
    assert health_check_due(before, snap(**page)) is due, case


def test_an_idle_engine_whose_canary_failed_and_whose_health_says_503_is_down() -> None:
    settings = target()
    idle = replace(judge(None, snap(steps=5), T0, settings), canary_failures=1)
    dead = judge(idle, snap(steps=5), T0 + 1, settings, health=("/health", 503))
    assert (dead.state, dead.reason) == ("down", "health_503")


@pytest.mark.parametrize(
    ("state", "draining", "gpu_fault", "ready"),
    [
        ("busy", False, False, True),
        ("busy", True, False, False),
        ("busy", False, True, False),  # a GPU fault: not ready, whatever the counters say
        ("served idle", False, False, True),
        ("served idle", False, True, False),
        ("stuck", False, False, False),
        ("asleep", False, False, False),
    ],
)
def test_readiness_table(state: str, draining: bool, gpu_fault: bool, ready: bool) -> None:
    settings = target()
    verdicts = {
        "busy": run([(0, snap(running=1, steps=1)), (5, snap(running=1, steps=2))], settings)[-1],
        "served idle": run([*QUIET, (5, CanaryOutcome("ok"))], settings)[-1],
        "stuck": run([(0, snap(running=1)), (35, snap(running=1)), (65, snap(running=1))], settings)[-1],
        "asleep": run([(0, snap()), (5, CanaryOutcome("ok")), (65, PageReading(running=0, waiting=0, sleep_level=1))],
                      settings)[-1],
    }
    assert is_ready(verdicts[state], settings, T0 + 65, draining, gpu_fault=gpu_fault) is ready


def _asleep(level: int = 1, **kw: Any) -> PageReading:
    return PageReading(**{"running": 0, "waiting": 0, "steps": 5, "generation_tokens": 9, "process_start_time": PST, **kw},
                       sleep_level=level)


@pytest.mark.parametrize(("rows", "state", "reason", "detail"), [
    ([(0, _asleep(1))], "asleep", "asleep", "engine asleep at level 1 (weights offloaded to CPU memory); running 0, waiting 0"),
    ([(0, _asleep(2))], "asleep", "asleep", "engine asleep at level 2 (weights discarded); running 0, waiting 0"),
    # Requests kept at a sleeping engine (vLLM's /sleep?mode=keep): paused on purpose, never stuck
    # (it read stuck at 70 s before issue 38); past pause_budget it pages, still never stuck.
    ([(0, _asleep(1, waiting=3)), (70, _asleep(1, waiting=3)), (140, _asleep(1, waiting=3))], "paused", "sleep_kept",
     "engine asleep at level 1 with its requests kept; running 0, waiting 3: paused on purpose, not stuck"),
    ([(0, _asleep(1, waiting=3)), (30, _asleep(1, waiting=3))], "paused", "sleep_kept", None),
    ([(0, _asleep(1, waiting=3)), (1000, _asleep(1, waiting=3)), (1900, _asleep(1, waiting=3))], "paused",
     "sleep_kept", None),
    # A wake-up in flight (vLLM's sleep_mode_operations_in_flight{operation="wake"}): paused while
    # within pause_budget (1800 s), then stuck: wedged inside it. It read asleep forever before.
    ([(0, _asleep(1)), (60, _asleep(1, operations=(("sleep_mode:wake", 1.0),)))], "paused", "operation_in_flight",
     None),
    ([(0, _asleep(1)), (60, _asleep(1, operations=(("sleep_mode:wake", 1.0),))),
      (1000, _asleep(1, operations=(("sleep_mode:wake", 1.0),))),
      (1865, _asleep(1, operations=(("sleep_mode:wake", 1.0),)))], "stuck", "operation_stuck",
     "sleep_mode:wake still in flight after 1805.0s, past pause_budget 1800s: the engine is wedged inside it; "
     "running 0, waiting 0"),
    # Woken with the queue still pending and nothing moving: the stuck clock runs from the last
    # paused read, so it is not stuck yet ...
    ([(0, _asleep(1, waiting=3)), (140, _asleep(1, waiting=3)), (145, snap(waiting=3, steps=5, gen=9))],
     "busy", "waiting_for_progress", None),
    # ... and is once nothing moved for stuck_after (60 s) after the wake-up.
    ([(0, _asleep(1, waiting=3)), (140, _asleep(1, waiting=3)), (145, snap(waiting=3, steps=5, gen=9)),
      (180, snap(waiting=3, steps=5, gen=9)), (210, snap(waiting=3, steps=5, gen=9))], "stuck", "no_progress", None),
    # Woken and stepping: busy.
    ([(0, _asleep(1, waiting=3)), (140, _asleep(1, waiting=3)), (145, snap(waiting=3, steps=6, gen=9))],
     "busy", "progress", None),
    ([(0, snap(steps=5, gen=9)), (5, _asleep(1)), (10, snap(steps=5, gen=9))], "idle", "idle", None),
])
def test_a_sleeping_engine_is_asleep_never_stuck(rows, state: str, reason: str, detail: str | None) -> None:
    settings = target()
    verdict = run(rows, settings)[-1]
    assert (verdict.state, verdict.reason) == (state, reason)
    if detail is not None:
        assert verdict.detail == detail
    at = T0 + rows[-1][0]
    if state == "asleep":
        assert not is_ready(verdict, settings, at, draining=False)
        assert is_live(verdict, settings, at)
        assert not recently_unhealthy(verdict, at, 10.0)  # the fleet gate does not count it


def test_canaries_that_failed_before_sleep_do_not_make_it_unresponsive_after() -> None:
    settings = target()
    awake = snap(steps=5, gen=9)
    rows: list[tuple[float, object]] = [(-5, awake), (0, awake), (1, CanaryOutcome("timeout")),
                                        (2, CanaryOutcome("timeout")), (5, _asleep(1)), (10, awake),
                                        (11, CanaryOutcome("timeout"))]
    verdicts = run(rows, settings)
    assert [v.state for v in verdicts] == ["starting", "idle", "idle", "idle", "asleep", "idle", "idle"]
    assert verdicts[-1].canary_failures == 1


@pytest.mark.parametrize(("reason", "lag", "timeout", "judged"), [
    ("timeout", 0.0, 10.0, "timeout"),
    ("timeout", 0.99, 10.0, "timeout"),  # under a tenth of the timeout: the server's own slowness
    ("timeout", 1.0, 10.0, "exporter_late"),
    ("timeout", 0.2, 2.0, "exporter_late"),
    ("connect", 30.0, 10.0, "connect"),  # refused or never connected: not a read the loop could have missed
    ("http_status", 30.0, 10.0, "http_status"),
])
def test_a_timeout_is_the_exporters_own_lateness_only_when_its_loop_lagged(reason, lag, timeout, judged) -> None:
    error = exporter_late(PollError(reason, "/metrics took longer than 10s"), lag, timeout)
    assert error.reason == judged
    if judged == "exporter_late":
        assert "event loop ran up to" in error.detail and error.detail.startswith("/metrics took longer than 10s")


@pytest.mark.parametrize(("last_sent", "in_flight", "since", "overlap"), [
    (None, False, T0, False),
    (T0 - 5, False, T0, False),  # sent before the last read: its work was seen then
    (T0, False, T0, True),  # sent with the last read: ran inside this interval
    (T0 - 5, True, T0, True),  # still in flight
    (T0, False, None, False),  # no read yet to measure from
])
def test_canary_overlap_table(last_sent, in_flight, since, overlap) -> None:
    assert canary_overlapped(last_sent, in_flight, since) is overlap


def test_counters_moved_by_the_exporters_own_canary_leave_an_idle_server_idle() -> None:
    settings = target()
    idle = run(QUIET, settings)[-1]
    answered = snap(steps=2, gen=1, prompt=3, finished=1)  # what one 1-token canary moves
    assert judge(idle, answered, T0 + 5, settings, canary_overlap=True).state == "idle"
    assert judge(idle, answered, T0 + 5, settings).state == "busy"  # the same movement without a canary is work
    # Work pending at the last read is work, whatever canary ran.
    worked = judge(judge(idle, snap(running=1), T0 + 5, settings), answered, T0 + 10, settings, canary_overlap=True)
    assert worked.state == "busy"


@pytest.mark.parametrize(
    ("draining", "restarts_before", "restarts_after", "holds"),
    [
        (True, 0, 0, True),  # the same process: the preStop drain holds until the pod goes
        (True, 0, 1, False),  # a restart detected: the kubelet restarted the server after its preStop drain
        (True, 3, 4, False),
        (False, 0, 0, False),
        (False, 0, 1, False),  # a restart never starts a drain
    ],
)
def test_a_drain_lasts_for_the_process_it_was_asked_of(draining, restarts_before, restarts_after, holds):
    before = replace(initial(T0), restarts=restarts_before)
    after = replace(before, restarts=restarts_after)
    assert drain_holds(draining, before, after) is holds
