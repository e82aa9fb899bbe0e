"""The poller's questions of one read, one at each step its I/O leaves it: what to do (`plan_read`, before
it), what its page says (`ReadPlan.check_page`, before the health route) and what it came to (`conclude`).

The poller does the I/O and nothing else: the plan says the read's deadline, when the health route
is asked beside the page (from the page's one comparison with the last good read, which `conclude`
hands to `judge`), and how a failed read is judged (the exporter's own lateness, a second probe);
the conclusion says the new verdict, whether to ask the pause route, and whether a canary goes out.
All are pure and plain data, table-tested in tests/test_verdict_plan.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from llm_vitals.exporter.engines import Engine, PageReading
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import reads
from llm_vitals.exporter.verdict.compare import Comparison, compare
from llm_vitals.exporter.verdict.judge import judge
from llm_vitals.exporter.verdict.model import Observation, PollError, Verdict
from llm_vitals.exporter.verdict.probes import drain_holds


class PageCheck(NamedTuple):
    """What a read's page says before the health route is asked, worked out once: `conclude` takes it."""

    comparison: Comparison  # the page against the last good read (compare): judge takes it as it is
    health_due: bool  # ask the engine's health route beside this page (health_check_due)


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """What one read does, decided from the verdict before it: carried out by the poller as it says."""

    previous: Verdict  # the verdict the read starts from
    deadline: float  # the /metrics read's (read_deadline: longer after a slow page)

    def check_page(self, snapshot: PageReading) -> PageCheck:
        """The page compared with the last good read, and whether the health route is asked beside it."""
        comparison = compare(self.previous, snapshot)
        return PageCheck(comparison, reads.health_check_due(self.previous, snapshot, comparison))

    def failed(self, error: PollError, loop_lag: float | None, timeout: float, *, metrics: bool) -> tuple[PollError, bool]:
        """A failed read (of `timeout` seconds) as judged: `exporter_late` given the loop's worst lag during
        it (None: not known); and whether a second probe follows it (only a /metrics read, this plan's
        deadline, that connected and got no answer)."""
        if loop_lag is not None:
            error = reads.exporter_late(error, loop_lag, timeout)
        return error, metrics and reads.second_probe_due(error)

    def probed(self, error: PollError, path: str, answer: int | PollError, loop_lag: float | None, *,
               health_route: bool) -> PollError:
        """`error` judged with the second probe's answer at `path` (`with_second_probe`): its HTTP status, or its
        own failure, judged for the exporter's lateness (the loop's worst lag during it) as the read was."""
        if isinstance(answer, PollError) and loop_lag is not None:
            answer = reads.exporter_late(answer, loop_lag, self.deadline)
        return reads.with_second_probe(error, path, answer, health_route=health_route)


def plan_read(previous: Verdict, metrics_timeout: float) -> ReadPlan:
    """The plan of the read that follows `previous`."""
    return ReadPlan(previous, reads.read_deadline(previous, metrics_timeout))


@dataclass(frozen=True, slots=True)
class Conclusion:
    """What one read came to: the new verdict, and what the poller does next."""

    verdict: Verdict
    ask_pause: bool  # ask the engine's pause route in the background, for the next read (pause_ask_due)
    send_canary: bool  # send a canary now (canary_due)
    draining: bool  # the target still drains (drain_holds: a restart ends the drain asked of the old process)


def conclude(previous: Verdict, observation: Observation, now: float, target: TargetSettings, engine: Engine, *,
             health: tuple[str, int] | None, poll_interval: float, last_canary_sent: float | None,
             canary_in_flight: bool, paused: bool | None, pause_route: bool, draining: bool = False,
             page: PageCheck | None = None) -> Conclusion:
    """The verdict after the read that saw `observation`, and whether to ask the pause route and send a canary.

    `engine` is the target's engine table entry, as the poller looked it up for this poll; `page`
    the plan's check of the page (`ReadPlan.check_page`: None, worked out here). `paused` is the
    pause route's answer asked since the last read (None: none); `pause_route` whether the engine
    has one (and no ask of it is still out); `draining` whether the target drained before it.
    """
    overlap = canary_overlapped(last_canary_sent, canary_in_flight, previous.snapshot_at)
    verdict = judge(previous, observation, now, target, engine.facts, health=health, canary_overlap=overlap,
                    paused=paused, comparison=page.comparison if page is not None else None)
    ask_pause, send = reads.follow_ups(verdict, observation, now, target, engine, poll_interval,
                                       pause_route=pause_route, last_canary_sent=last_canary_sent,
                                       canary_in_flight=canary_in_flight)
    return Conclusion(verdict, ask_pause, send, drain_holds(draining, previous, verdict))


def canary_overlapped(last_sent: float | None, in_flight: bool, since: float | None) -> bool:
    """Whether the exporter's own canary may have moved the counters since the read at `since`.

    A canary is sent right after a read (with its `now`), so one sent at or after `since`, or still
    in flight, ran inside the interval the next read measures.
    """
    return in_flight or (last_sent is not None and since is not None and last_sent >= since)
