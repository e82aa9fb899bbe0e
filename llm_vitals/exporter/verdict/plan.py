"""One read of one target, as the core drives it: `read` is a generator that yields each request the
read needs and receives its answer, then returns the read's `Conclusion`. The poller asks the core
once per read (issue 42): it starts `read`, carries out each request as it comes, in order, and
sends the answer back (the sans-I/O shape of h11 and h2); it decides nothing itself.

The requests, in the order a read makes them (reads.observe, the read's I/O steps):
- `ReadPage`: the /metrics GET, within the read's deadline (`read_deadline`: longer after a slow page);
- `AskHealth`: the engine's health route, beside a page that asks for it (`health_check_due`, from the
  page's one comparison with the last good read, which `judge` then takes as it is);
- `AskReady`: the model's ready route, beside a page with nothing pending;
- `SecondProbe`: one more request after a /metrics read that connected and got no answer;
- `AskNow`, last: the clock and the target's side tasks (the canary, the pause ask) once the I/O is
  done, answered with a `Moment`. Then the verdict (`judge`), and what follows it: whether to ask the
  pause route (`pause_ask_due`), whether a canary goes (`canary_due`), whether a drain holds.

All pure and plain data, table-tested in tests/test_verdict_plan.py.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

from llm_vitals.exporter.engines import Engine, PageReading
from llm_vitals.exporter.engines.table import engine_of
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict.compare import Comparison
from llm_vitals.exporter.verdict.judge import judge
from llm_vitals.exporter.verdict.model import ModelsOk, Observation, Verdict
from llm_vitals.exporter.verdict.probes import drain_holds
from llm_vitals.exporter.verdict.reads import Step, observe


@dataclass(frozen=True, slots=True)
class AskNow:
    """The read's I/O is done: answered with the `Moment` it is concluded at."""


ASK_NOW = AskNow()


class Moment(NamedTuple):
    """The clock and the target's side as the read's I/O ends: each may have changed while it ran."""

    previous: Verdict  # the target's verdict now (a canary that ended during the read has written it)
    now: float
    poll_interval: float  # a reload may change it
    last_canary_sent: float | None
    canary_in_flight: bool
    paused: bool | None  # the pause route's answer asked since the last read (None: none)
    pause_route: bool  # the engine has one, and no ask of it is still out
    draining: bool


def read(previous: Verdict, target: TargetSettings, engine: Engine,
         metrics_timeout: float) -> Generator[Step | AskNow, Any, Conclusion]:
    """One read of `target` after the verdict `previous`: yields each request (reads.observe's steps,
    then `AskNow`), receives each answer, and returns what the read came to (`conclude`).

    `engine` is the target's engine table entry. Only the page's steps judge against `previous`
    (its comparison with the last good read); the verdict is judged from the `Moment`'s.
    """
    observation, health, comparison = yield from observe(previous, metrics_timeout)
    moment: Moment = yield ASK_NOW
    return conclude(moment.previous, observation, moment.now, target, engine, health=health,
                    poll_interval=moment.poll_interval, last_canary_sent=moment.last_canary_sent,
                    canary_in_flight=moment.canary_in_flight, paused=moment.paused, pause_route=moment.pause_route,
                    draining=moment.draining, comparison=comparison)


@dataclass(frozen=True, slots=True)
class Conclusion:
    """What one read came to: the new verdict, and what the poller does next."""

    verdict: Verdict
    ask_pause: bool  # ask the engine's pause route in the background, for the next read (pause_ask_due)
    send_canary: bool  # send a canary now (canary_due)
    draining: bool  # the target still drains (drain_holds: a restart ends the drain asked of the old process)
    observation: Observation  # what the read saw (the poller's pace tracker reads its page)


def conclude(previous: Verdict, observation: Observation, now: float, target: TargetSettings, engine: Engine, *,
             health: tuple[str, int] | None, poll_interval: float, last_canary_sent: float | None,
             canary_in_flight: bool, paused: bool | None, pause_route: bool, draining: bool = False,
             comparison: Comparison | None = None) -> Conclusion:
    """The verdict after the read that saw `observation`, and whether to ask the pause route and send a canary.

    `engine` is the target's engine table entry, as the poller looked it up for this poll;
    `comparison` the page's with the last good read (None: worked out by `judge`). `paused` is the
    pause route's answer asked since the last read (None: none); `pause_route` whether the engine
    has one (and no ask of it is still out); `draining` whether the target drained before it.
    """
    overlap = canary_overlapped(last_canary_sent, canary_in_flight, previous.snapshot_at)
    verdict = judge(previous, observation, now, target, engine.facts, health=health, canary_overlap=overlap,
                    paused=paused, comparison=comparison)
    ask_pause, send = follow_ups(verdict, observation, now, target, engine, poll_interval,
                                 pause_route=pause_route, last_canary_sent=last_canary_sent,
                                 canary_in_flight=canary_in_flight)
    return Conclusion(verdict, ask_pause, send, drain_holds(draining, previous, verdict), observation)


def canary_overlapped(last_sent: float | None, in_flight: bool, since: float | None) -> bool:
    """Whether the exporter's own canary may have moved the counters since the read at `since`.

    A canary is sent right after a read (with its `now`), so one sent at or after `since`, or still
    in flight, ran inside the interval the next read measures.
    """
    return in_flight or (last_sent is not None and since is not None and last_sent >= since)


# -- what follows a verdict: the pause ask and the canary -----------------------------------------


def pause_ask_due(verdict: Verdict, now: float, target: TargetSettings, poll_interval: float, *,
                  canary_soon: bool = False) -> bool:
    """Whether to ask the engine's pause route (vLLM's GET /is_paused) after the read that judged `verdict`.

    The answer is for the next read (the poller asks in the background, so a hung engine, which
    never answers, delays nothing). Never on every poll: only when the next read could be `stuck`
    (work pending, nothing moved at the last read, and `stuck_after` within two polls of passing) or
    already is; when an idle-looking server's canary failed (a paused vLLM queues it); or while the
    verdict rests on the route's word (`paused`, reason `paused`), so a pause stays a pause until
    the engine says it ended; and, with nothing pending, when a canary may go with the next read
    (`canary_soon`): a paused vLLM takes no step, so its page keeps its last step's counts (0
    running, 0 waiting where the pause landed between requests, the next ones kept in it: its
    scheduler counts nothing unfinished under PAUSED_ALL), so the engine's word comes before the
    canary, which would only queue behind the pause (only where the route says the pause alone: the
    engine table's `pause_before_canary`). The poller asks only engines whose table entry has a pause route.
    """
    if verdict.state == "paused" and verdict.reason == "paused":
        return True
    snap = verdict.snapshot
    if snap is None or not verdict.up:
        return False
    if not snap.pending:
        return canary_soon or (verdict.state in ("idle", "unresponsive") and verdict.canary_failures > 0)
    if verdict.state == "stuck":
        return verdict.reason == "no_progress"
    if verdict.reads_without_progress < 1 or verdict.last_progress is None:
        return False
    return now + 2 * poll_interval - verdict.last_progress >= target.stuck_after


def canary_due(verdict: Verdict, observation: Observation, last_sent: float | None, now: float, target: TargetSettings, *,
               poll_interval: float, in_flight: bool = False, engine: Engine | None = None) -> bool:
    """May a canary go out with the poll that just judged `observation` into `verdict`?

    The product's key rule: never to a server this very poll saw working, so the canary cannot
    queue behind the load it guards. `last_sent` is when the previous canary went out (None: never).
    `engine`: the target's engine table entry (None: looked up by its name).
    """
    if not target.sends_canary or in_flight or verdict.state == "asleep":
        return False
    if now < canary_next_due(verdict, last_sent, target, poll_interval):
        return False
    if isinstance(observation, PageReading):
        # Idle by the verdict: a whole interval with nothing pending and nothing moving, not just
        # gauges at 0 at the instant of this read.
        return not observation.pending and verdict.state in ("idle", "unresponsive")
    # An engine with no /metrics cannot show its load; its models answer is the best we have.
    return isinstance(observation, ModelsOk) and (engine or engine_of(target.engine)).parse is None


def canary_next_due(verdict: Verdict, last_sent: float | None, target: TargetSettings, poll_interval: float) -> float:
    """From when the next canary may go (-inf: at once), whatever the next read shows."""
    # A canary to the process before the last detected restart says nothing about this one: a
    # new process must show it serves before an idle server is ready, so its canary goes at once.
    if last_sent is None or (verdict.last_restart_at is not None and last_sent < verdict.last_restart_at):
        return float("-inf")
    # Due from half a poll before the interval is up: a canary can only go out with a poll, so
    # waiting for the full interval made every gap interval + up to one poll (4 s for 3 s on
    # the real vLLM); with the half-poll allowance the gaps average the configured interval.
    return last_sent + target.canary.interval - poll_interval / 2


def follow_ups(verdict: Verdict, observation: Observation, now: float, target: TargetSettings, engine: Engine,
               poll_interval: float, *, pause_route: bool, last_canary_sent: float | None,
               canary_in_flight: bool) -> tuple[bool, bool]:
    """After a read's verdict: whether to ask the engine's pause route (where it has one and no ask is
    out), and whether to send a canary. `engine`: the target's engine table entry."""
    send = canary_due(verdict, observation, last_canary_sent, now, target, poll_interval=poll_interval,
                      in_flight=canary_in_flight, engine=engine)
    # A canary may go with the next read (none goes now, none is out, and the next read may judge
    # idle): the pause route is asked first, for that read (pause_ask_due), where it says the pause alone.
    canary_soon = (not send and not canary_in_flight and target.sends_canary
                   and engine.pause_before_canary
                   and verdict.state in ("idle", "unresponsive", "busy")
                   and now + poll_interval >= canary_next_due(verdict, last_canary_sent, target, poll_interval))
    ask_pause = pause_route and pause_ask_due(verdict, now, target, poll_interval, canary_soon=canary_soon)
    return ask_pause, send
