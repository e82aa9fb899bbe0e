"""Refused, frozen and slow reads (issue 29), as tables with an injected clock.

A refused connection is `down` at once and unready. A read that connected and got no answer while
a second probe got none either is a frozen server: restartable (`stuck`, `metrics_unanswered`) once
no good read came for `down_after`, on every engine and whether last seen busy or idle, and `/live`
fails after `liveness_budget`. A read that timed out while the second probe answered is a slow page:
never unready, never restartable, and the next read waits longer.
"""

from __future__ import annotations

import pytest
from verdict_tables import T0, Case, replay

from llm_vitals.exporter.engines import EngineFacts, PageReading
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import (
    SLOW_READ_FACTOR,
    Observation,
    PollError,
    Verdict,
    is_live,
    is_ready,
    read_deadline,
    second_probe_due,
    with_second_probe,
)
from llm_vitals.targets import RESTARTABLE_STATES

VLLM = EngineFacts()
LLAMA = EngineFacts(metrics_unanswered_is_stuck=True)
REFUSED = PollError("refused", "/metrics: connection refused")
NO_CONNECT = PollError("connect", "/metrics: no connection within the connect timeout")
FROZEN = PollError("timeout", "/metrics took longer than 10s", probe="unanswered")
SLOW = PollError("timeout", "/metrics took longer than 10s", probe="answered")
NO_PROBE = PollError("timeout", "/metrics took longer than 10s")
LATE = PollError("exporter_late", "late")


def target(**overrides: object) -> TargetSettings:
    config: dict[str, object] = {"name": "t", "url": "http://127.0.0.1:1", "stuck_after": 60, "startup_grace": 0,
                                 "down_after": 30, "liveness_budget": 120, "canary": {"enabled": False}}
    config.update(overrides)
    return TargetSettings.model_validate(config)


def snap(running: float = 0, steps: float = 0) -> PageReading:
    return PageReading(running, 0, steps, process_start_time=1.0)


BUSY = [(0.0, snap(2, 5)), (5.0, snap(2, 9))]
IDLE = [(0.0, snap()), (5.0, snap())]


def run(rows: list[tuple[float, Observation]], facts: EngineFacts = VLLM,
        settings: TargetSettings | None = None) -> list[Verdict]:
    return replay(rows, settings or target(), facts)


def every(seen: Observation, start: float, stop: float, step: float = 5.0) -> list[tuple[float, Observation]]:
    rows, t = [], start
    while t <= stop:
        rows.append((t, seen))
        t += step
    return rows


CASES = [
    # -- refused: no process listens; `down` at the first refused read, whatever was last seen -----
    Case("refused_after_busy_is_down_at_once_and_unready", [*BUSY, (10, REFUSED)], "down", "refused", ready=False),
    Case("refused_after_idle_is_down_at_once_and_unready", [*IDLE, (10, REFUSED)], "down", "refused", ready=False),
    Case("refused_while_stuck_is_down", [(0, snap(2, 5)), (35, snap(2, 5)), (65, snap(2, 5)), (70, REFUSED)],
         "down", "refused", ready=False),
    Case("refused_before_the_first_good_read_is_starting_within_grace", [(0, REFUSED), (5, REFUSED)],
         "starting", "startup", settings={"startup_grace": 300}, ready=False),
    Case("a_connect_timeout_is_not_refused_it_waits_for_down_after", [*IDLE, (10, NO_CONNECT), (15, NO_CONNECT)],
         "idle", "idle", ready=True),
    Case("a_connect_timeout_for_down_after_is_down_not_restartable", [*IDLE, *every(NO_CONNECT, 10, 40)],
         "down", "connect", ready=False),
    # -- frozen whole: accepted, nothing answers, nor a second probe ----------------------------
    Case("frozen_busy_vllm_short_of_down_after_holds_busy", [*BUSY, *every(FROZEN, 10, 30)], "busy", "progress",
         ready=True),
    Case("frozen_busy_vllm_for_down_after_is_stuck", [*BUSY, *every(FROZEN, 10, 35)], "stuck", "metrics_unanswered",
         ready=False),
    Case("frozen_idle_vllm_for_down_after_is_stuck", [*IDLE, *every(FROZEN, 10, 35)], "stuck", "metrics_unanswered",
         ready=False),
    Case("frozen_idle_llamacpp_for_down_after_is_stuck", [*IDLE, *every(FROZEN, 10, 35)], "stuck",
         "metrics_unanswered", facts=LLAMA),
    Case("frozen_triton_like_engine_whose_metrics_are_apart_needs_no_probe", [*IDLE, *every(NO_PROBE, 10, 35)],
         "stuck", "metrics_unanswered", facts=LLAMA),
    Case("frozen_stays_stuck_while_it_stays_frozen", [*BUSY, *every(FROZEN, 10, 300)], "stuck", "metrics_unanswered"),
    Case("frozen_through_late_reads_is_still_frozen", [*BUSY, (10, FROZEN), (15, LATE), (20, FROZEN), (35, FROZEN)],
         "stuck", "metrics_unanswered"),
    Case("frozen_then_answering_and_moving_is_busy", [*BUSY, *every(FROZEN, 10, 40), (45, snap(2, 12))],
         "busy", "progress", ready=True),
    Case("frozen_then_refused_is_down", [*BUSY, *every(FROZEN, 10, 40), (45, REFUSED)], "down", "refused"),
    Case("refused_then_frozen_stays_down_never_restartable", [*BUSY, (10, REFUSED), *every(FROZEN, 15, 60)],
         "down", "timeout"),
    Case("a_timeout_without_a_second_probe_is_no_proof_of_a_frozen_vllm", [*BUSY, *every(NO_PROBE, 10, 35)],
         "down", "timeout"),
    Case("one_unanswered_read_after_a_long_gap_is_not_frozen", [*BUSY, (100, FROZEN)], "busy", "progress"),
    # -- slow: the page is late, the server answers a second probe ------------------------------
    Case("three_slow_reads_in_a_row_past_down_after_are_not_down_or_unready",
         [*BUSY, (10, SLOW), (25, SLOW), (60, SLOW)], "busy", "progress", ready=True),
    Case("slow_reads_while_idle_keep_idle", [*IDLE, (10, SLOW), (25, SLOW), (60, SLOW)], "idle", "idle", ready=True),
    Case("slow_reads_keep_a_stuck_verdict_stuck",
         [(0, snap(2, 5)), (35, snap(2, 5)), (65, snap(2, 5)), (70, SLOW), (85, SLOW), (120, SLOW)], "stuck",
         "no_progress"),
    Case("a_late_llamacpp_page_gets_the_longer_deadline_before_it_counts_as_frozen",
         [*IDLE, *[(t, SLOW if n % 2 == 0 else snap()) for n, t in enumerate(range(10, 120, 5))]], "idle", "idle",
         facts=LLAMA),
    Case("a_llamacpp_page_unanswered_even_with_the_longer_deadline_is_frozen_though_its_health_answers",
         [*IDLE, *every(SLOW, 10, 40)], "stuck", "metrics_unanswered", facts=LLAMA),
    Case("a_page_missed_four_times_in_a_row_though_the_server_answers_is_down_not_slow",
         [*BUSY, (10, SLOW), (25, SLOW), (60, SLOW), (95, SLOW)], "down", "timeout"),
    Case("a_page_that_never_arrived_is_not_slow_it_is_down_after_grace", [*every(SLOW, 0, 10)], "down", "timeout"),
    Case("slow_pages_that_arrive_every_other_read_keep_judging_progress",
         [*BUSY, *[(t, SLOW if n % 2 == 0 else snap(2, 9 + t)) for n, t in enumerate(range(10, 600, 5))]],
         "busy", "progress", ready=True),
    Case("slow_pages_with_frozen_counters_are_still_stuck",
         [*BUSY, *[(t, SLOW if n % 2 == 0 else snap(2, 9)) for n, t in enumerate(range(10, 100, 5))]],
         "stuck", "no_progress"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reads_table(case: Case) -> None:
    settings = target(**case.settings)
    verdict = run(case.rows, case.facts, settings)[-1]
    assert (verdict.state, verdict.reason) == (case.state, case.reason), verdict.detail
    if case.ready is not None:
        now = T0 + case.rows[-1][0]
        assert is_ready(verdict, settings, now, draining=False) is case.ready, verdict.detail


def test_a_slow_saturated_vllm_is_never_unready_nor_restartable_at_any_read() -> None:
    # 9-12 s pages against a 10 s timeout: every read that timed out had its second probe answered.
    settings = target()
    rows: list[tuple[float, Observation]] = [*BUSY]
    for n, t in enumerate(range(10, 1800, 5)):
        rows.append((t, SLOW if n % 3 != 2 else snap(2, 9 + t)))
    for (t, _), verdict in zip(rows[2:], run(rows, VLLM, settings)[2:], strict=True):
        assert verdict.state not in RESTARTABLE_STATES and verdict.state != "down", verdict.detail
        assert is_ready(verdict, settings, T0 + t, draining=False), verdict.detail
        assert is_live(verdict, settings, T0 + t)


def test_a_slow_read_whose_probe_the_exporter_was_too_late_to_hear_is_not_down() -> None:
    """The real vLLM tier's slow drill (down_after 3 s, an 11 s page against a 10 s timeout) read
    `down` once: a read timed out, and its second probe came back `exporter_late`, so the read stood
    as a plain timeout past down_after. Now the whole read is the exporter's lateness."""
    settings = target(down_after=3)
    late_probe = with_second_probe(NO_PROBE, "/health", PollError("exporter_late", "loop 2s late"), health_route=True)
    rows: list[tuple[float, Observation]] = [*BUSY, (16, SLOW), (45, snap(2, 20)), (56, late_probe)]
    verdict = run(rows, VLLM, settings)[-1]
    assert verdict.state == "busy" and is_ready(verdict, settings, T0 + 56, draining=False), verdict.detail


def test_a_connect_hiccup_between_slow_pages_is_a_missed_read_not_down() -> None:
    """Good pages every other read of a slow server can come further apart than down_after (10 s
    timeout, 12 s page: ~30 s); the second probes that answered in between show it alive. Seen as a
    flake of the scaled simulator drill on a loaded box: one late connect there read `down`."""
    settings = target(down_after=30)
    rows: list[tuple[float, Observation]] = [*BUSY, (20, SLOW), (37, NO_CONNECT)]
    hiccup = run(rows, VLLM, settings)[-1]
    assert hiccup.state == "busy" and is_ready(hiccup, settings, T0 + 37, draining=False), hiccup.detail
    # Nothing answering at all for down_after since the last answer is still down.
    gone = run([*rows, (55, NO_CONNECT), (68, NO_CONNECT)], VLLM, settings)[-1]
    assert gone.state == "down", gone.detail


@pytest.mark.parametrize("facts", [VLLM, LLAMA], ids=["vllm", "llamacpp"])
@pytest.mark.parametrize("last_seen", ["busy", "idle"])
def test_frozen_whole_is_restartable_and_unlive_within_down_after_liveness_and_two_polls(facts, last_seen) -> None:
    settings, poll = target(), 5.0
    rows = [*(BUSY if last_seen == "busy" else IDLE), *every(FROZEN, 10, 300)]
    verdicts = run(rows, facts, settings)
    frozen_at = 5.0  # the last good read
    stuck_at = next(t for (t, _), v in zip(rows, verdicts, strict=True) if v.state == "stuck")
    assert stuck_at <= frozen_at + settings.down_after + 2 * poll
    unlive_at = next(t for (t, _), v in zip(rows, verdicts, strict=True) if not is_live(v, settings, T0 + t))
    assert unlive_at <= frozen_at + settings.down_after + settings.liveness + 2 * poll
    assert unlive_at >= frozen_at + settings.liveness  # never sooner than the budget
    assert all(v.state != "down" for v in verdicts)


def test_a_refused_read_makes_an_idle_server_unready_at_once_not_after_down_after() -> None:
    settings = target(canary={"enabled": False})
    before, after = run([*IDLE, (10, REFUSED)], VLLM, settings)[-2:]
    assert is_ready(before, settings, T0 + 5, draining=False)
    assert not is_ready(after, settings, T0 + 10, draining=False)
    assert (after.error_reason, after.up) == ("refused", False)


def test_a_page_not_read_yet_gets_the_longer_deadline_when_the_server_answers_elsewhere() -> None:
    first = run([(0, SLOW)], VLLM, target(startup_grace=300))[-1]
    assert (first.state, read_deadline(first, 10.0)) == ("starting", SLOW_READ_FACTOR * 10.0)
    assert read_deadline(run([(0, NO_PROBE)], VLLM, target(startup_grace=300))[-1], 10.0) == 10.0


def test_only_a_read_the_second_probe_showed_slow_gets_the_longer_deadline() -> None:
    slow, frozen, good = (run(rows)[-1] for rows in ([*BUSY, (10, SLOW)], [*BUSY, (10, FROZEN)], [*BUSY, (10, SLOW),
                                                                                                   (15, snap(2, 11))]))
    assert read_deadline(slow, 10.0) == SLOW_READ_FACTOR * 10.0
    assert read_deadline(frozen, 10.0) == 10.0
    assert read_deadline(good, 10.0) == 10.0
    assert read_deadline(run([*BUSY, (10, SLOW), (15, LATE)])[-1], 10.0) == SLOW_READ_FACTOR * 10.0


@pytest.mark.parametrize(("error", "due"), [
    (NO_PROBE, True), (FROZEN, False), (SLOW, False), (REFUSED, False), (NO_CONNECT, False), (LATE, False),
    (PollError("http_status", "500"), False), (PollError("bad_metrics", "html"), False),
])
def test_second_probe_due_only_after_a_read_that_connected_and_got_no_answer(error: PollError, due: bool) -> None:
    assert second_probe_due(error) is due


def test_late_reads_do_not_count_as_polls() -> None:
    verdicts = run([*BUSY, (10, LATE), (15, LATE), (20, snap(2, 12)), (25, LATE)])
    assert [v.last_poll for v in verdicts] == [T0, T0 + 5, T0 + 5, T0 + 5, T0 + 20, T0 + 20]


@pytest.mark.parametrize("failure", [REFUSED, NO_CONNECT, FROZEN, SLOW, NO_PROBE])
def test_a_failed_read_of_the_server_is_still_a_poll(failure: PollError) -> None:
    assert run([*BUSY, (10, failure)])[-1].last_poll == T0 + 10


@pytest.mark.parametrize(("answer", "health_route", "reason", "probe"), [
    (200, True, "timeout", "answered"),
    (401, False, "timeout", "answered"),  # /v1/models behind a key still answers: the process is alive
    (500, True, "timeout", "answered"),
    (503, True, "health_503", None),  # the engine's own word that it is dead
    (503, False, "timeout", "answered"),  # a 503 from a route that is not a health route is only an answer
    (PollError("timeout", "/health took longer than 10s"), True, "timeout", "unanswered"),
    (PollError("refused", "/health: connection refused"), True, "refused", None),
    (PollError("connect", "/health: no connection within the connect timeout"), True, "timeout", None),
    # The exporter could not listen to the probe: the whole read is evidence of nothing (not toward down).
    (PollError("exporter_late", "late"), True, "exporter_late", None),
    (PollError("http_status", "/health: malformed HTTP answer (400)"), True, "timeout", None),
])
def test_the_second_probe_says_slow_frozen_dead_or_gone(answer, health_route: bool, reason: str, probe) -> None:
    judged = with_second_probe(NO_PROBE, "/health", answer, health_route=health_route)
    assert (judged.reason, judged.probe) == (reason, probe)
