"""The core's one read (exporter/verdict/plan.py's `read`), driven as the poller drives it, as tables:
the requests it makes in order (the page within its deadline, the health route when the rule says,
the ready route, the second probe) and how a failed read is judged; then the verdict, the pause ask
and the canary, each the rule it gathers would give alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from llm_vitals.exporter.engines import PageReading
from llm_vitals.exporter.engines.table import engine_of
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import (
    ASK_HEALTH,
    ASK_NOW,
    ASK_READY,
    LATE_SHARE,
    SLOW_READ_FACTOR,
    Conclusion,
    Failed,
    ModelsOk,
    Moment,
    PollError,
    Probed,
    ReadPage,
    SecondProbe,
    Verdict,
    canary_due,
    compare,
    conclude,
    follow_ups,
    health_check_due,
    initial,
    judge,
    read,
)

TIMEOUT = 10.0


def target(**overrides: object) -> TargetSettings:
    config: dict[str, object] = {"name": "t", "url": "http://127.0.0.1:1", "stuck_after": 20, "startup_grace": 0,
                                 "canary": {"interval": 30}}
    config.update(overrides)
    return TargetSettings.model_validate(config)


def snap(running: float = 0, steps: float = 0) -> PageReading:
    return PageReading(running, 0, steps, process_start_time=1.0)


def after(*reads: tuple[float, PageReading | PollError], settings: TargetSettings | None = None) -> Verdict:
    verdict: Verdict | None = None
    for now, seen in reads:
        verdict = judge(verdict, seen, now, settings or target())
    assert verdict is not None
    return verdict


IDLE = after((0, snap()), (5, snap()))
BUSY = after((0, snap(2, 1)), (5, snap(2, 9)))
FROZEN = after((0, snap(2, 1)), (5, snap(2, 1)), (10, snap(2, 1)))  # work pending, nothing moving
SLOW = after((0, snap(2, 1)), (5, PollError("timeout", "/metrics took longer than 10s", probe="answered")))
FAILED_CANARY = replace(IDLE, canary_failures=1)


def driven(previous: Verdict, answers: Sequence[Any], settings: TargetSettings | None = None) -> tuple[list[object], Conclusion]:
    """The requests `read` makes, given these answers in turn (the last, to AskNow, a Moment at 10 s), and its conclusion."""
    settings = settings or target()
    steps = read(previous, settings, engine_of(settings.engine), TIMEOUT)
    asked = [next(steps)]
    for answer in answers:
        asked.append(steps.send(answer))
    assert asked[-1] == ASK_NOW
    try:
        steps.send(Moment(previous, 10.0, 5.0, None, False, None, True, False))
    except StopIteration as done:
        return asked, done.value
    raise AssertionError("the read asked for more than its moment")


@pytest.mark.parametrize(("previous", "deadline"), [
    (initial(0), TIMEOUT),
    (BUSY, TIMEOUT),
    (SLOW, SLOW_READ_FACTOR * TIMEOUT),  # a slow page earns the next read a longer deadline
])
def test_the_read_asks_the_page_within_its_deadline(previous: Verdict, deadline: float) -> None:
    asked, _ = driven(previous, [snap(2, 12)])
    assert asked[0] == ReadPage(deadline)


@pytest.mark.parametrize(("previous", "page", "asked"), [
    (BUSY, snap(2, 12), False),  # work moving
    (BUSY, snap(2, 9), True),  # work pending, nothing moved: dead or only slow?
    (IDLE, snap(), False),  # idle, its canaries answer
    (FAILED_CANARY, snap(), True),  # idle-looking, and its last canary failed
    (initial(0), snap(2, 1), False),  # nothing to compare with yet
])
def test_the_read_asks_the_health_route_as_the_rule_says(previous: Verdict, page: PageReading, asked: bool) -> None:
    # Beside a page with nothing pending the model's ready route is asked too, after the health route.
    answers: list[Any] = [page, *([("/health", 200)] if asked else []), *([None] if not page.pending else [])]
    requests, concluded = driven(previous, answers)
    assert (ASK_HEALTH in requests) is asked is health_check_due(previous, page)
    assert (ASK_READY in requests) is not page.pending
    # The one comparison, carried into judge: the verdict is the one judge gives with it.
    health = ("/health", 200) if asked else None
    assert concluded.verdict == judge(previous, page, 10.0, target(), health=health, comparison=compare(previous, page))


def test_a_failed_ready_route_is_the_reads_failure() -> None:
    not_ready = PollError("http_status", "/v2/models/m/ready answered HTTP 400", ready_route=True)
    requests, concluded = driven(IDLE, [snap(), Failed(not_ready, None, 2.0)])
    assert requests == [ReadPage(TIMEOUT), ASK_READY, ASK_NOW]
    assert concluded.observation == not_ready


@pytest.mark.parametrize(("error", "lag", "metrics", "reason", "probe"), [
    (PollError("timeout", "no answer"), None, True, "timeout", True),  # connected, no answer: ask again elsewhere
    (PollError("timeout", "no answer"), 0.0, False, "timeout", False),  # not the /metrics read: no second probe
    (PollError("timeout", "no answer"), LATE_SHARE * TIMEOUT, True, "exporter_late", False),  # the exporter's own lateness
    (PollError("refused", "refused"), 5.0, True, "refused", False),  # its own evidence, late or not
    (PollError("timeout", "no answer", probe="unanswered"), None, True, "timeout", False),  # already probed
])
def test_the_read_judges_a_failed_read(error: PollError, lag: float | None, metrics: bool, reason: str, probe: bool) -> None:
    probed = Probed("/health", PollError("timeout", "no answer"), None, True)
    requests, concluded = driven(BUSY, [Failed(error, lag, TIMEOUT, metrics), *([probed] if probe else [])])
    assert (SecondProbe(TIMEOUT) in requests) is probe
    assert isinstance(concluded.observation, PollError)
    assert concluded.observation.reason == reason


UNANSWERED = PollError("timeout", "/metrics took longer than 30s")


@pytest.mark.parametrize(("answer", "lag", "reason", "probe"), [
    (200, 5.0, "timeout", "answered"),  # an HTTP answer is an answer, however late the loop
    (503, None, "health_503", None),  # a health route's word that the engine is dead
    (PollError("timeout", "no answer"), 2.0, "timeout", "unanswered"),  # deadline 30 s: 2 s of lag is under a tenth
    (PollError("timeout", "no answer"), 3.0, "exporter_late", None),  # ... 3 s is not: evidence of nothing
    (PollError("timeout", "no answer"), None, "timeout", "unanswered"),
    (PollError("refused", "refused"), 3.0, "refused", None),
])
def test_the_read_judges_the_second_probe_on_its_deadline(answer: int | PollError, lag: float | None, reason: str,
                                                          probe: str | None) -> None:
    requests, concluded = driven(SLOW, [Failed(UNANSWERED, None, 3 * TIMEOUT, True), Probed("/health", answer, lag, True)])
    assert requests[1] == SecondProbe(SLOW_READ_FACTOR * TIMEOUT)
    judged = concluded.observation
    assert isinstance(judged, PollError)
    assert (judged.reason, judged.probe) == (reason, probe)


def test_an_engine_judged_by_its_model_list_asks_nothing_beside_it() -> None:
    requests, concluded = driven(IDLE, [ModelsOk(("tiny",))])
    assert requests == [ReadPage(TIMEOUT), ASK_NOW]
    assert concluded.observation == ModelsOk(("tiny",))


def concluded(previous: Verdict, seen: PageReading | PollError | ModelsOk, now: float, settings: TargetSettings, *,
              last_sent: float | None = None, in_flight: bool = False, paused: bool | None = None,
              pause_route: bool = True, draining: bool = False) -> Conclusion:
    return conclude(previous, seen, now, settings, engine_of(settings.engine), health=None, poll_interval=5.0, last_canary_sent=last_sent,
                    canary_in_flight=in_flight, paused=paused, pause_route=pause_route, draining=draining)


@pytest.mark.parametrize(("previous", "seen", "now", "last_sent", "in_flight", "paused", "pause_route"), [
    (IDLE, snap(), 10, None, False, None, True),  # idle: a canary goes
    (IDLE, snap(), 10, 5.0, False, None, True),  # one went a poll ago: none
    (IDLE, snap(), 10, None, True, None, True),  # one in flight: none
    (BUSY, snap(2, 12), 10, None, False, None, True),  # working: never a canary
    (FROZEN, snap(2, 1), 15, None, False, None, True),  # stuck_after within two polls: ask the pause route
    (FROZEN, snap(2, 1), 15, None, False, None, False),  # ... only where the engine has one, and no ask is out
    (FROZEN, snap(2, 1), 15, None, False, True, True),  # the pause route said paused
    (BUSY, PollError("refused", "refused"), 10, None, False, None, True),  # a failed read
    (IDLE, ModelsOk(("tiny",)), 10, None, False, None, True),  # an engine with a page judged by its model list
])
def test_the_conclusion_is_each_rule_it_gathers(previous: Verdict, seen: PageReading | PollError | ModelsOk, now: float,
                                                last_sent: float | None, in_flight: bool, paused: bool | None,
                                                pause_route: bool) -> None:
    settings = target()
    got = concluded(previous, seen, now, settings, last_sent=last_sent, in_flight=in_flight, paused=paused,
                    pause_route=pause_route)
    overlap = in_flight or (last_sent is not None and previous.snapshot_at is not None and last_sent >= previous.snapshot_at)
    verdict = judge(previous, seen, now, settings, canary_overlap=overlap, paused=paused)
    # The pause route is asked before a canary may go (follow_ups), so the two rules are gathered as one.
    assert got == Conclusion(
        verdict, *follow_ups(verdict, seen, now, settings, engine_of(settings.engine), 5.0, pause_route=pause_route,
                             last_canary_sent=last_sent, canary_in_flight=in_flight), False, seen)
    assert got.send_canary == canary_due(verdict, seen, last_sent, now, settings, poll_interval=5.0, in_flight=in_flight)
    assert not got.ask_pause or pause_route


def test_a_restart_ends_a_drain_and_nothing_else_does() -> None:
    settings = target()
    restarted = PageReading(2, 0, 1, process_start_time=2.0)  # another process
    assert concluded(BUSY, snap(2, 12), 10, settings, draining=True).draining
    assert not concluded(BUSY, restarted, 10, settings, draining=True).draining
    assert not concluded(BUSY, snap(2, 12), 10, settings).draining


def test_the_conclusion_of_the_cases_above() -> None:
    settings = target()
    assert concluded(IDLE, snap(), 10, settings).send_canary
    assert not concluded(BUSY, snap(2, 12), 10, settings).send_canary
    frozen = concluded(FROZEN, snap(2, 1), 15, settings)
    assert (frozen.verdict.state, frozen.ask_pause, frozen.send_canary) == ("busy", True, False)
    assert concluded(FROZEN, snap(2, 1), 15, settings, paused=True).verdict.state == "paused"
    assert not concluded(FROZEN, snap(2, 1), 15, settings, pause_route=False).ask_pause
