"""How one read is carried out: its deadline, its second probe and the exporter's own lateness,
and what it asks beside the page (the health route, the pause route, a canary). Pure: the poller
does the I/O, each rule here says when and what it means (ReadPlan, in plan.py, gathers them)."""

from __future__ import annotations

from llm_vitals.exporter.engines import Engine, PageReading
from llm_vitals.exporter.engines.table import engine_of
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict.compare import Comparison, compare
from llm_vitals.exporter.verdict.model import ModelsOk, Observation, PollError, Verdict

# How much of a read's timeout the exporter's own loop lag must reach for the timeout to be blamed
# on the exporter. A read takes about ten turns of the event loop (connect, request, headers, body
# chunks); a loop whose turns run a tenth of the timeout late can use the whole timeout up alone.
LATE_SHARE = 0.1


def exporter_late(error: PollError, loop_lag: float, timeout: float) -> PollError:
    """`error` as judged, given the worst lag of the exporter's event loop during the read.

    A read that timed out while the loop lagged at least LATE_SHARE of its timeout is
    `exporter_late`: the server may have answered in time to a loop that could not listen (a
    starved exporter at scale), so the timeout says nothing about the server. Any other error is
    returned as it is.
    """
    if error.reason != "timeout" or loop_lag < LATE_SHARE * timeout:
        return error
    return PollError("exporter_late", f"{error.detail}, while the exporter's own event loop ran up to {loop_lag:.2f}s "
                                      f"late: not evidence about the server")


# How much longer than the configured metrics timeout the read after a slow one may take. A real
# saturated vLLM answered /metrics in 9-12 s against a 10 s timeout: three times the timeout lets
# that page arrive, and stays well inside a poll loop that re-anchors after an overrun.
SLOW_READ_FACTOR = 3.0


def read_deadline(previous: Verdict, timeout: float) -> float:
    """The deadline of this poll's `/metrics` read: `timeout`, or SLOW_READ_FACTOR times it after a slow read.

    Only a read the second probe showed slow (the server answered elsewhere) earns the longer
    deadline: a frozen server's reads keep the short one, so it is found frozen no later.
    """
    return SLOW_READ_FACTOR * timeout if previous.slow else timeout


def second_probe_due(error: PollError) -> bool:
    """Whether a failed `/metrics` read calls for a second probe: only a read that connected and got no answer.

    Refused, never connected, an HTTP error or a bad page are already their own evidence, and a
    read the exporter was too late for (`exporter_late`) is evidence of nothing.
    """
    return error.reason == "timeout" and error.probe is None


def with_second_probe(error: PollError, path: str, answer: int | PollError, *, health_route: bool) -> PollError:
    """`error` (a /metrics read that connected and got no answer) judged with what the second probe at `path` got.

    `answer` is the probe's HTTP status, or its own failure (already judged by `exporter_late`).
    Any status is `answered` (the process answers: the page is slow), but a health route's 503,
    the engine's word that it is dead; a refused connection is the process gone; a probe that
    connected and got no answer is `unanswered` (frozen whole); a probe the exporter was too late
    to hear makes the whole read `exporter_late` (evidence of nothing, not even toward `down`: a
    starved exporter must not turn a slow page into a dead server); any other failure is no
    evidence either way, and `error` stays as it was.
    """
    if isinstance(answer, int):
        if health_route and answer == 503:
            return PollError("health_503", f"{path} answered 503: the engine is dead")
        return PollError(error.reason, f"{error.detail}; {path} answered HTTP {answer}", probe="answered")
    if answer.reason == "refused":
        return PollError("refused", f"{error.detail}; then {answer.detail}")
    if answer.reason == "timeout":
        return PollError(error.reason, f"{error.detail}, and {answer.detail} too", probe="unanswered")
    if answer.reason == "exporter_late":
        return PollError("exporter_late", f"{error.detail}; the second probe at {path}: {answer.detail}")
    return error


def health_check_due(previous: Verdict, snap: PageReading, comparison: Comparison | None = None) -> bool:
    """Whether this poll should also ask the engine's health route (vLLM answers 503 when dead).

    - Work pending and nothing moved since the last read: is the engine dead, or only slow?
    - Nothing pending, but the last canary failed: an engine whose loop died may drop its queue to 0
      (vLLM 0.32 aborts every request when its Worker dies, and then reads idle), so an idle page is
      no proof of life. Its own health route says dead at once, where the canary would take
      `failures_before_unresponsive` intervals to say only `unresponsive`.

    `comparison`: the page's against the last read (`compare(previous, snap)`, worked out where not given).
    """
    if not snap.pending:
        return previous.canary_failures > 0
    if previous.snapshot is None:
        return False
    seen = comparison if comparison is not None else compare(previous, snap)
    # One unit with work and nothing of its own moving asks too: a dead data-parallel engine is 503.
    return not seen.progressed or seen.unit_stalled


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
