"""A saturated server whose reads go unanswered (issue 38), as tables with an injected clock.

Every slot busy and requests queued for one: llama-server gives each in-flight request one of its
HTTP threads (`--threads-http`), so once its clients hold them all, `/metrics` and the second probe
wait behind them. Such a server is judged by `stuck_after` from its last progress, on every engine,
never by `down_after` without an answer; a server that really stopped still reads stuck within
`stuck_after` and two polls. Not saturated (nothing queued), today's frozen rule stands.

The times are the shipped ones: poll 5 s, metrics_timeout 10 s, so a poll whose read and second
probe go unanswered comes every 25 s; stuck_after 60 s, down_after 30 s.
"""

from __future__ import annotations

import pytest
from verdict_tables import T0, Case, replay

from llm_vitals.exporter.engines import EngineFacts, PageReading
from llm_vitals.exporter.engines.table import ENGINES
from llm_vitals.exporter.settings import ExporterSettings, TargetSettings
from llm_vitals.exporter.verdict import Observation, PollError, Verdict, is_live, saturated

LLAMA = EngineFacts(metrics_unanswered_is_stuck=True)
VLLM = EngineFacts()
# llama.cpp's own reads: its engine loop answers /metrics, so no second probe is needed to call it unanswered.
TIMEOUT = PollError("timeout", "/metrics took longer than 10s")
# Any engine: the read and the second probe on a fresh connection, both accepted and never answered.
FROZEN = PollError("timeout", "/metrics took longer than 10s", probe="unanswered")
REFUSED = PollError("refused", "/metrics: connection refused")
POLL = ExporterSettings.model_fields["poll_interval"].default
UNANSWERED_POLL = POLL + 2 * ExporterSettings.model_fields["metrics_timeout"].default  # 25 s


def target(**overrides: object) -> TargetSettings:
    config: dict[str, object] = {"name": "t", "url": "http://127.0.0.1:1", "startup_grace": 0,
                                 "canary": {"enabled": False}}
    config.update(overrides)
    return TargetSettings.model_validate(config)


SHIPPED = target()


def full(steps: float, running: float = 2, deferred: float = 1) -> PageReading:
    """llama-server's page as the adapter reads it: busy slots running, deferred requests waiting."""
    return PageReading(running, deferred, steps, restart_token="1571301719")


def unanswered(seen: Observation, start: float, stop: float, step: float = UNANSWERED_POLL) -> list[tuple[float, Observation]]:
    rows, t = [], start
    while t <= stop:
        rows.append((t, seen))
        t += step
    return rows


SATURATED = [(0.0, full(700)), (5.0, full(800))]  # the last progress at 5 s

CASES = [
    Case("saturated_llamacpp_unanswered_past_down_after_is_busy_until_stuck_after",
         [*SATURATED, *unanswered(TIMEOUT, 30, 55)], "busy", "metrics_unanswered", facts=LLAMA,
         checks={"reads_without_progress": 2, "last_progress": T0 + 5}),
    Case("saturated_with_one_slot_and_one_request_deferred_is_saturated_too",
         [(0, full(700, 1, 1)), (5, full(800, 1, 1)), *unanswered(TIMEOUT, 30, 55)], "busy", "metrics_unanswered",
         facts=LLAMA),
    # The reproduction: stuck_after 120 s, stuck at 46.6 s on today's main.
    Case("saturated_llamacpp_unanswered_is_judged_by_its_stuck_after_of_120s_not_down_after",
         [*SATURATED, *unanswered(TIMEOUT, 30, 105)], "busy", "metrics_unanswered", facts=LLAMA,
         settings={"stuck_after": 120}),
    # Engine-neutral: any server's HTTP front can be starved by its own saturated queue.
    Case("saturated_vllm_frozen_whole_past_down_after_is_busy_until_stuck_after",
         [*SATURATED, *unanswered(FROZEN, 30, 55)], "busy", "metrics_unanswered", facts=VLLM),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_saturated_table(case: Case) -> None:
    verdict = replay(case.rows, target(**case.settings), case.facts)[-1]
    assert (verdict.state, verdict.reason) == (case.state, case.reason), verdict.detail
    for name, value in case.checks.items():
        assert getattr(verdict, name) == value, (name, verdict)


def test_saturated_reads_never_stuck_nor_down_while_answered_only_when_a_request_ends() -> None:
    # A read gets through only when a request ends and frees a thread (every third poll): each shows progress.
    rows = [*SATURATED, *[(t, full(800 + t) if n % 3 == 2 else TIMEOUT) for n, t in enumerate(range(30, 900, 25))]]
    states = {v.state for v in replay(rows, SHIPPED, LLAMA)}
    assert states == {"busy"}, states


def first(verdicts: list[Verdict], rows: list[tuple[float, Observation]], state: str) -> float:
    return next(t for (t, _), v in zip(rows, verdicts, strict=True) if v.state == state)


@pytest.mark.parametrize("engine", sorted(name for name, entry in ENGINES.items() if entry.parse is not None))
def test_a_saturated_server_that_stops_is_stuck_within_stuck_after_and_two_polls_not_at_down_after(engine: str) -> None:
    """SIGSTOP under saturation: every read and second probe unanswered from 10 s on. Stuck no sooner than
    stuck_after after the last progress (5 s), and within two unanswered polls of it; live fails after the budget."""
    settings = target(engine=engine, model="m")
    rows = [*SATURATED, *unanswered(FROZEN, 30, 400)]
    verdicts = replay(rows, settings)
    stuck_at = first(verdicts, rows, "stuck")
    assert 5 + settings.stuck_after <= stuck_at <= 5 + settings.stuck_after + 2 * UNANSWERED_POLL, stuck_at
    assert verdicts[-1].state == "stuck" and verdicts[-1].reason == "metrics_unanswered"
    assert {v.state for v in verdicts} <= {"busy", "stuck"}
    unlive_at = next(t for (t, _), v in zip(rows, verdicts, strict=True) if not is_live(v, settings, T0 + t))
    assert 5 + settings.liveness <= unlive_at <= 5 + settings.liveness + 2 * UNANSWERED_POLL, unlive_at
    assert "saturated" in verdicts[-1].detail


@pytest.mark.parametrize(("running", "waiting", "facts", "seen"), [
    (2, 0, LLAMA, TIMEOUT),  # every slot busy, nothing queued
    (0, 3, LLAMA, TIMEOUT),  # queued, nothing running
    (2, 0, VLLM, FROZEN),
])
def test_a_server_not_saturated_that_stops_is_still_frozen_at_down_after(running, waiting, facts, seen) -> None:
    rows = [(0.0, PageReading(running, waiting, 700, restart_token="a")), (5.0, PageReading(running, waiting, 800, restart_token="a")),
            *unanswered(seen, 30, 200)]
    stuck_at = first(replay(rows, SHIPPED, facts), rows, "stuck")
    assert stuck_at <= 5 + SHIPPED.down_after + 2 * UNANSWERED_POLL and stuck_at < 5 + SHIPPED.stuck_after, stuck_at


def test_a_refused_read_breaks_the_saturated_chain() -> None:
    rows = [*SATURATED, (30, TIMEOUT), (55, REFUSED), *unanswered(TIMEOUT, 80, 300)]
    assert replay(rows, SHIPPED, LLAMA)[-1].state == "down"


@pytest.mark.parametrize(("running", "waiting", "expected"), [
    (2, 1, True), (1, 4, True), (2, 0, False), (0, 3, False), (0, 0, False),
])
def test_saturated_is_work_queued_behind_running_work(running, waiting, expected) -> None:
    assert saturated(PageReading(running, waiting)) is expected
    assert saturated(None) is False
