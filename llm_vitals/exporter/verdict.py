"""The pure state machine: (previous verdict, what one poll saw, now, target settings) -> new verdict.

No I/O and no clock of its own: every case is a table test with an injected `now`. `now` is a
monotonic reading (llm_vitals/exporter/clock.py): every time a Verdict holds is one, and every span it
measures (stuck seconds, liveness, down_after, the canary's interval) is a difference of two; the
views turn the instants they show into wall time.

Partial evidence (docs/states.md):
- a failed read is not evidence: the verdict keeps its state, its last good reading and its stuck
  clock, so the next good page is compared with the last good one; only failures that last
  `down_after` (no good read for that long) make the target `down`. The engine's own word that it
  is dead (a health route's 503) is `down` at once;
- a read that timed out while the exporter's own event loop lagged is `exporter_late`
  (`exporter_late()`): counted and shown, and evidence of nothing, not even toward `down`, and
  not a poll either (`last_poll` stays, so LLMVitalsPollingStale sees a starved exporter);
- refused, frozen and slow are told apart by evidence, not by one timeout (docs/states.md):
  a refused connection (no process listens) is `down` at once; a read that connected and got no
  answer, while a second probe on a fresh connection got none either, is a frozen process: held
  until no good read came for `down_after`, then `stuck` (`metrics_unanswered`), which liveness and
  the remediator act on, whether it was last seen busy or idle, unless it was last seen `saturated`
  (work queued behind running work: its reads may wait behind its own clients' requests), which is
  judged by `stuck_after` from its last progress alone; a read that timed out while the
  second probe answered is a slow page from a live server: held, never toward `down`, and the next
  read gets a longer deadline (`read_deadline`) so that a page that arrives late arrives;
- idle means nothing pending *and* nothing moved: work counters that moved since the last read are
  `busy` even when running and waiting read 0 at the instant of the read, and idle (with it the
  canary) needs one whole interval between two reads of one lifetime with nothing pending and
  nothing moving. The first read of a lifetime cannot show that: it is `starting`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from llm_vitals.exporter.engines import EngineFacts, Snapshot, Unit
from llm_vitals.exporter.engines.table import engine_of
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.targets import NOT_READY_STATES, STATES, UNHEALTHY_STATES, PollErrorReason, Reason, State

__all__ = ["NOT_READY_STATES", "STATES", "UNHEALTHY_STATES"]  # re-exported: the verdict's words

# vLLM's sleep levels (POST /sleep?level=N), as a verdict's detail names them.
SLEEP_LEVEL_WORDS = {1: "weights offloaded to CPU memory", 2: "weights discarded"}


@dataclass(frozen=True, slots=True)
class PollError:
    """A poll that produced no usable reading. `reason` is the `poll_errors_total` label.

    `probe` is set on a `timeout` (connected, no answer) when the poller asked a second route on a
    fresh connection (`second_probe_due`): `answered` (the process answers: the page is slow) or
    `unanswered` (accepted, nothing answered either: frozen whole). None: not asked, or no evidence.
    """

    reason: PollErrorReason
    detail: str
    probe: Literal["answered", "unanswered"] | None = None
    # The engine's model-ready route failed after a good /metrics page (Engine.ready_path): not
    # shown ready, and never a /metrics page that went unanswered; its timeout is a server that
    # answers (the page came), held and never toward `down`.
    ready_route: bool = False


@dataclass(frozen=True, slots=True)
class ModelsOk:
    """A good `/v1/models` answer: all a proxy (or an engine with no `/metrics`) is judged by."""

    models: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CanaryOutcome:
    """What one canary's answer means (exporter/canary.py `judge_answer`): `error` and `timeout` are
    failed canaries; `rejected` is a server that answered and refused the request (a 4xx)."""

    result: Literal["ok", "error", "timeout", "rejected"]
    detail: str = ""


Observation = Snapshot | PollError | ModelsOk


@dataclass(frozen=True, slots=True)
class Verdict:
    """Everything the exporter believes about one target after its latest poll."""

    state: State
    reason: Reason
    detail: str
    since: float  # when the current state began
    first_seen: float  # when the exporter started watching (startup grace counts from here)
    started: bool = False  # has ever been servable
    up: bool = False  # the last poll gave a usable reading
    last_poll: float | None = None
    error_reason: PollErrorReason | None = None  # set when the last poll failed: the poll_errors_total label
    snapshot: Snapshot | None = None  # last good reading, in the current process lifetime
    snapshot_at: float | None = None
    last_progress: float | None = None  # last read that saw progress, or saw nothing owed
    last_served: float | None = None  # last evidence the server serves: progress or a good canary
    last_good_read: float | None = None  # last poll with a usable reading (a page, or the model list)
    failed_reads: int = 0  # consecutive polls without one (exporter_late not counted)
    # The last read timed out while a second probe answered: a live server with a slow page, whose
    # next read gets SLOW_READ_FACTOR times the deadline (`read_deadline`). Cleared by a good read.
    slow: bool = False
    # The last time the server answered anything: a second probe that answered while the page was
    # slow. The down clock runs from this or the last good read, whichever is later: a server whose
    # slow pages come every other read (good reads ~2 × timeout apart) is alive in between, and one
    # connect hiccup there is a missed read, not `down`.
    last_answered: float | None = None
    reads_without_progress: int = 0  # consecutive reads with work pending and nothing moving
    stuck_seconds: float = 0.0
    restarts: int = 0
    last_restart_at: float | None = None
    last_unhealthy_at: float | None = None  # last verdict in an UNHEALTHY_STATES state
    canary_failures: int = 0  # consecutive
    # The last canary answered and was refused (4xx): what it said, until a canary answers or fails.
    canary_rejected: str | None = None
    last_canary_ok: float | None = None
    steps_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    models: tuple[str, ...] = ()
    # The unit (a vLLM engine, a Triton model, an SGLang rank) a `stuck` or `waiting_on_peer` verdict
    # rests on, as its labels read; None when the whole server is judged, or nothing is wrong.
    unit: str | None = None
    # Per unit of the last read (when it has several): (name, last progress, reads without progress).
    unit_clocks: tuple[tuple[str, float, int], ...] = ()
    # When the engine operations now in flight (a weight update, a wake-up: Snapshot.operations)
    # were first seen, over consecutive reads; None while none is. Past `pause_budget`: stuck.
    operation_since: float | None = None

    @property
    def process_start_time(self) -> float | None:
        return self.snapshot.process_start_time if self.snapshot else None

    def stuck_for(self, now: float) -> float:
        """Seconds work has been pending without progress: up to `now` while stuck, else as of the last poll."""
        if self.state == "stuck" and self.last_progress is not None:
            return now - self.last_progress
        return self.stuck_seconds


def initial(now: float) -> Verdict:
    """The verdict before the first poll."""
    return Verdict(state="starting", reason="startup", detail="not polled yet", since=now, first_seen=now)


def progressed(before: Snapshot, after: Snapshot) -> bool:
    """True when any of the engine's named work signals moved between two reads of one process lifetime.

    A counter moves when it grew, a gauge when it changed. Only signals both reads carry are
    compared: a series that appeared or went away (a Triton model loaded or unloaded) is not movement,
    nor is a series that started again from 0 (the model reloaded).
    """
    old_counters = before.monotone()
    for name, new in after.monotone().items():
        old = old_counters.get(name)
        if old is not None and new is not None and new > old:
            return True
    old_gauges = before.gauges()
    for name, new in after.gauges().items():
        old = old_gauges.get(name)
        if old is not None and new is not None and old != new:
            return True
    return False


def went_backwards(before: Snapshot, after: Snapshot, *, gap: bool = False) -> str | None:
    """Name of a monotone counter that shows the process started again, or None.

    A counter that fell, or a fresh page: every counter the earlier read had is gone (TGI shows a
    family only once it is first touched, so its new process has none). A counter only one read has
    is no reset by itself. `gap`: reads failed between the two (the server was away).

    Per series (Snapshot.series, named `unit|family`), a series falling is its unit (a Triton model)
    started again, and the process restarted only when every unit both reads carry did (a failure
    counter growing meanwhile is no series, so it hides nothing). A unit that had counted nothing
    cannot show a reset: with one on both pages and no gap, the fall is a reload, not a restart.
    """
    if before.series and after.series:
        return _series_reset(before.series, after.series, gap)
    old_counters = before.monotone()
    new_counters = after.monotone()
    for name, new in new_counters.items():
        old = old_counters.get(name)
        if old is not None and new is not None and new < old:
            return name
    had = [name for name, value in old_counters.items() if value is not None]
    if had and all(new_counters.get(name) is None for name in had):
        return f"{had[0]} (gone from the page)"
    return None


def _series_reset(before: tuple[tuple[str, float], ...], after: tuple[tuple[str, float], ...], gap: bool) -> str | None:
    old_series = dict(before)
    fell: dict[str, str] = {}
    shared: set[str] = set()
    counted: set[str] = set()
    for name, new in after:
        old = old_series.get(name)
        if old is None:
            continue
        unit = name.rpartition("|")[0]
        shared.add(unit)
        if old > 0:
            counted.add(unit)
        if new < old:
            fell.setdefault(unit, name)
    if not fell or not counted <= fell.keys() or (not gap and shared - counted):
        return None
    return next(iter(fell.values()))


def same_lifetime(before: Snapshot, after: Snapshot) -> bool | None:
    """True/False when the two reads say which process they come from, None when only counters can tell.

    An opaque restart token (llama.cpp's header) wins over a start time; either is compared for
    inequality only, so a token that is not a time (monotonic microseconds) is never misread.
    """
    if before.restart_token is not None and after.restart_token is not None:
        return before.restart_token == after.restart_token
    if before.process_start_time is not None and after.process_start_time is not None:
        return before.process_start_time == after.process_start_time
    return None


def _move(previous: Verdict, now: float, state: State, reason: Reason, detail: str, **changes: Any) -> Verdict:
    since = previous.since if state == previous.state else now
    last_unhealthy_at = now if state in UNHEALTHY_STATES else previous.last_unhealthy_at
    changes.setdefault("last_poll", now)
    return replace(previous, state=state, reason=reason, detail=detail, since=since,
                   last_unhealthy_at=last_unhealthy_at, **changes)


def recently_unhealthy(verdict: Verdict, now: float, window: float) -> bool:
    """Unhealthy now, or seen unhealthy within `window` seconds.

    When a fleet-wide fault clears, each target's poll sees the recovery at its own moment; for
    up to a poll interval one target can still read stuck while the others read healthy. The
    remediator's fleet gate counts targets that were unhealthy that recently, so a straggler of a
    fleet-wide fault is not restarted as if it had failed alone.
    """
    if verdict.state in UNHEALTHY_STATES:
        return True
    return verdict.last_unhealthy_at is not None and now - verdict.last_unhealthy_at <= window


def health_check_due(previous: Verdict, snap: Snapshot) -> bool:
    """Whether this poll should also ask the engine's health route (vLLM answers 503 when dead).

    - Work pending and nothing moved since the last read: is the engine dead, or only slow?
    - Nothing pending, but the last canary failed: an engine whose loop died may drop its queue to 0
      (vLLM 0.32 aborts every request when its Worker dies, and then reads idle), so an idle page is
      no proof of life. Its own health route says dead at once, where the canary would take
      `failures_before_unresponsive` intervals to say only `unresponsive`.
    """
    if not snap.pending:
        return previous.canary_failures > 0
    base = previous.snapshot
    if base is None:
        return False
    # One unit with work and nothing of its own moving asks too: a dead data-parallel engine is 503.
    return not progressed(base, snap) or (bool(snap.units) and any(
        unit.pending and old is not None and not _unit_moved(old, unit)
        for unit, old in _unit_pairs(base, snap)))


def pause_ask_due(verdict: Verdict, now: float, target: TargetSettings, poll_interval: float) -> bool:
    """Whether to ask the engine's pause route (vLLM's GET /is_paused) after the read that judged `verdict`.

    The answer is for the next read (the poller asks in the background, so a hung engine, which
    never answers, delays nothing). Never on every poll: only when the next read could be `stuck`
    (work pending, nothing moved at the last read, and `stuck_after` within two polls of passing) or
    already is; when an idle-looking server's canary failed (a paused vLLM queues it); or while the
    verdict rests on the route's word (`paused`, reason `paused`), so a pause stays a pause until
    the engine says it ended. The poller asks only engines whose table entry has a pause route.
    """
    if verdict.state == "paused" and verdict.reason == "paused":
        return True
    snap = verdict.snapshot
    if snap is None or not verdict.up:
        return False
    if not snap.pending:
        return verdict.state in ("idle", "unresponsive") and verdict.canary_failures > 0
    if verdict.state == "stuck":
        return verdict.reason == "no_progress"
    if verdict.reads_without_progress < 1 or verdict.last_progress is None:
        return False
    return now + 2 * poll_interval - verdict.last_progress >= target.stuck_after


def pause_exceeded(verdict: Verdict, target: TargetSettings, now: float) -> bool:
    """Paused for longer than the target's `pause_budget`: LLMServerPausedTooLong pages; never a restart."""
    return verdict.state == "paused" and now - verdict.since > target.pause_budget


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


def canary_overlapped(last_sent: float | None, in_flight: bool, since: float | None) -> bool:
    """Whether the exporter's own canary may have moved the counters since the read at `since`.

    A canary is sent right after a read (with its `now`), so one sent at or after `since`, or still
    in flight, ran inside the interval the next read measures.
    """
    return in_flight or (last_sent is not None and since is not None and last_sent >= since)


def judge(previous: Verdict | None, observation: Observation, now: float, target: TargetSettings,
          facts: EngineFacts | None = None, *, health: tuple[str, int] | None = None,
          canary_overlap: bool = False, paused: bool | None = None) -> Verdict:
    """The new verdict for `target` after one poll that saw `observation` at time `now`.

    `facts` are the engine table's facts about `target.engine` (given explicitly by table tests).
    `health` is (route, HTTP status) of the engine's health route in this poll, when it was asked
    (see `health_check_due`); None when it was not asked or did not answer. `canary_overlap`: the
    exporter's own canary ran since the last read (`canary_overlapped`), so counters it moved on an
    idle server are not work. `paused` is the engine's pause route's answer, asked since the last
    read (`pause_ask_due`): True, the engine paused on purpose; False or None (not asked, no answer:
    a hung vLLM EngineCore does not answer /is_paused) is no pause.
    """
    previous = previous or initial(now)
    facts = facts if facts is not None else engine_of(target.engine).facts
    if isinstance(observation, Snapshot) and health is not None and health[1] == 503:
        # The engine's word that it is dead. Any other answer (or none) is no news: it must not
        # replace the page just read, or a stuck server would read `down`, which liveness never acts on.
        return _on_error(previous, PollError("health_503", f"{health[0]} answered 503: the engine is dead"), now, target)
    if isinstance(observation, PollError):
        if observation.reason == "exporter_late":
            return _on_late(previous, observation, now)
        if observation.reason == "timeout" and observation.ready_route:
            # The page came in this very poll: the server answers, and only its model's readiness is
            # unknown (its HTTP threads slow under load). Held: no canary, no evidence toward down,
            # and never the unanswered page of a frozen server.
            return _unslowed(_on_error(replace(previous, last_answered=now), observation, now, target))
        if observation.reason == "timeout":
            # An engine whose own loop answers /metrics (llama.cpp, Triton's metrics threads) is not
            # slow because of load, and its health route may answer while that loop is wedged: its
            # unanswered page is frozen evidence by itself, once it has had the longer deadline
            # when a second probe answered (a page that arrives late still arrives).
            unanswered = observation.probe == "unanswered" or (
                facts.metrics_unanswered_is_stuck and (observation.probe is None or previous.slow))
            # A server last seen saturated may have given every HTTP thread to its own clients, on
            # any engine: its silence is judged as work owed, never as frozen after down_after.
            starved = unanswered and _unanswered_while_saturated(previous, observation)
            pending = starved or (unanswered and facts.metrics_unanswered_is_stuck
                                  and _unanswered_while_pending(previous, observation))
            if pending or (unanswered and _frozen_chain(previous)):
                return _on_unanswered(previous, observation, now, target, pending=pending, starved=starved)
            if observation.probe == "answered":
                if _slow_but_reading(previous):
                    return _on_slow(previous, observation, now)
                # Not (or no longer) a slow page but a failed read; the server answers elsewhere,
                # so its next read still gets the longer deadline.
                return replace(_on_error(previous, observation, now, target), slow=True)
        return _unslowed(_on_error(previous, observation, now, target))
    if isinstance(observation, ModelsOk):
        return _unslowed(_on_models(previous, observation, now, target))
    return _unslowed(_on_snapshot(previous, observation, now, target, canary_overlap, paused))


def _unslowed(verdict: Verdict) -> Verdict:
    # Slow is what the last read showed: any other answer (a page, or another failure) ends it.
    return replace(verdict, slow=False) if verdict.slow else verdict


# Errors that are the server's own word, not a read that went missing: `down` at once.
# A refused connection is the kernel's word that no process listens (a frozen one still accepts).
DOWN_AT_ONCE: frozenset[str] = frozenset({"health_503", "refused"})


def _on_error(previous: Verdict, error: PollError, now: float, target: TargetSettings, **changes: Any) -> Verdict:
    failed = previous.failed_reads + 1
    if not previous.started and now - previous.first_seen < target.startup_grace:
        return _move(previous, now, "starting", "startup", f"not servable yet ({error.reason}: {error.detail})",
                     up=False, error_reason=error.reason, failed_reads=failed, reads_without_progress=0,
                     last_progress=now, stuck_seconds=0.0, steps_per_second=None, generation_tokens_per_second=None,
                     **changes)
    last_good = previous.last_good_read if previous.last_good_read is not None else previous.first_seen
    unread_for = now - last_good
    alive_for = now - max(last_good, previous.last_answered or last_good)
    if (error.reason in DOWN_AT_ONCE or not previous.started or previous.state == "down"
            or alive_for >= target.down_after):
        # Gone for long enough (or dead by its own word): no progress can be judged while the server
        # cannot be read, so the stuck clock starts again from the next good read.
        detail = error.detail if error.reason in DOWN_AT_ONCE or not previous.started else (
            f"{error.detail} (no good read for {unread_for:.1f}s, {failed} failed read(s))")
        return _move(
            previous, now, "down", error.reason, detail,
            up=False, error_reason=error.reason, failed_reads=failed, reads_without_progress=0, last_progress=now,
            stuck_seconds=0.0, steps_per_second=None, generation_tokens_per_second=None, **changes,
        )
    # A missed read: no evidence either way. The state, the last good reading and the stuck clock
    # stay, so the next good page is compared with the last good one and a stuck episode stays stuck.
    detail = (f"{_still(previous, now)}; read failed ({error.reason}: {error.detail}): {failed} in a row, "
              f"no good read for {unread_for:.1f}s, down after {target.down_after:g}s")
    return _move(previous, now, previous.state, previous.reason, detail, up=False, error_reason=error.reason,
                 failed_reads=failed, steps_per_second=None, generation_tokens_per_second=None, **changes)


def _still(previous: Verdict, now: float) -> str:
    """What the held verdict rests on, for the detail of a poll that read nothing."""
    if previous.state == "stuck":
        return f"still stuck: no engine signal moved for {previous.stuck_for(now):.1f}s up to the last good read"
    return f"still {previous.state} ({previous.reason}) from the last good read"


def _on_late(previous: Verdict, error: PollError, now: float) -> Verdict:
    # The exporter's own lateness: counted (poll_errors_total{reason="exporter_late"}) and shown,
    # and nothing else: neither progress, nor a read without progress, nor a failure toward `down`,
    # nor a poll: `last_poll` stays where the last read that was not late left it, so a starved
    # exporter's timestamps go stale and LLMVitalsPollingStale says it is blind.
    return _move(previous, now, previous.state, previous.reason, f"{_still(previous, now)}; {error.detail}",
                 up=False, error_reason=error.reason, steps_per_second=None, generation_tokens_per_second=None,
                 last_poll=previous.last_poll)


# Reads in a row that may miss their deadline while the server answers elsewhere and still be a
# slow page: one at the configured timeout, then two at SLOW_READ_FACTOR times it. A page that has
# not come in all of them is not slow but not coming: those reads count toward `down` as any failure.
SLOW_READS_HELD = 3


def _slow_but_reading(previous: Verdict) -> bool:
    # Slow is a server once read whose pages still come, if late: counted in reads, not seconds, so
    # that the rule holds whatever the timeouts (a read after a slow one lasts 3 times longer).
    return previous.started and previous.last_good_read is not None and previous.failed_reads < SLOW_READS_HELD


def _on_slow(previous: Verdict, error: PollError, now: float) -> Verdict:
    # The page did not come in time, but the server answered a second probe: it is alive and slow
    # (a saturated vLLM's API server). Load is never a reason to be unready or restarted, so the
    # state, the stuck clock and the last good reading stay, this read counts toward nothing, and
    # the next read waits longer (`read_deadline`).
    last_good = previous.last_good_read if previous.last_good_read is not None else previous.first_seen
    detail = (f"{_still(previous, now)}; slow: {error.detail}, while a second probe answered "
              f"(no good read for {now - last_good:.1f}s; the next read waits {SLOW_READ_FACTOR:g} times longer)")
    return _move(previous, now, previous.state, previous.reason, detail, up=False, error_reason=error.reason,
                 failed_reads=previous.failed_reads + 1, steps_per_second=None, generation_tokens_per_second=None,
                 slow=True, last_answered=now)


def _unanswered_while_pending(previous: Verdict, error: PollError) -> bool:
    # `timeout` is a /metrics read that connected and got no answer in time (a refused connection
    # is `refused`, a connect that timed out `connect`); "pending" is what the last good read
    # showed, as long as every poll since then was pending or unanswered: a `down` in between
    # breaks the chain, and so does a refused connection or any other failure just before.
    return (error.reason == "timeout" and previous.snapshot is not None and previous.snapshot.pending
            and previous.state in ("busy", "stuck") and _frozen_chain(previous))


def saturated(snap: Snapshot | None) -> bool:
    """Work queued behind running work: every slot busy and requests waiting for one (llama.cpp's
    `requests_deferred`, vLLM's waiting queue), as one read shows it.

    Such a server's own clients may hold every thread of its HTTP front (llama-server gives each
    in-flight request one of its `--threads-http`), so a read that waits behind them is no sign
    that it froze. A server whose running requests hold every thread with none queued (threads at
    or below its slots) cannot be told apart from a frozen one by its page: it is not saturated here.
    """
    return snap is not None and snap.running > 0 and snap.waiting > 0


def _unanswered_while_saturated(previous: Verdict, error: PollError) -> bool:
    # The last good read saw the server saturated, and every poll since went unanswered (the chain
    # of `_unanswered_while_pending`): the reads may be queued behind the clients' own requests.
    return saturated(previous.snapshot) and _unanswered_while_pending(previous, error)


def _frozen_chain(previous: Verdict) -> bool:
    # Every read since the last good one connected and got no answer (or was the exporter's own
    # lateness): a server once servable, not `down` since, and not refusing (a frozen process accepts).
    return previous.started and previous.state != "down" and previous.error_reason in (None, "timeout", "exporter_late")


def _on_unanswered(previous: Verdict, error: PollError, now: float, target: TargetSettings, *,
                   pending: bool, starved: bool = False) -> Verdict:
    # A server that accepts the connection and never answers is frozen, not gone: a restart may fix
    # it, so it must never end as `down`, which liveness and the remediator leave alone. Frozen whole
    # (a second probe unanswered too, or an engine whose own loop answers /metrics) for `down_after`
    # since the last good read is `stuck`, whether it was last seen busy or idle; with work owed, on
    # an engine whose loop answers /metrics (llama.cpp), it is stuck once `stuck_after` has passed
    # over two reads, as one whose counters froze. The stuck clock keeps running from the last
    # progress, across reads, and nothing is re-based. A server last seen `saturated` is judged by
    # `stuck_after` alone, on any engine: its reads may wait behind its own clients' requests for as
    # long as they run, so `down_after` without an answer proves nothing there, while a server that
    # really stopped still reads stuck once `stuck_after` has passed since its last progress.
    last_good = previous.last_good_read if previous.last_good_read is not None else previous.first_seen
    unread_for = now - last_good
    failed = previous.failed_reads + 1  # all unanswered: the chain (_frozen_chain) admits nothing else
    reads = previous.reads_without_progress + 1
    last_progress = previous.last_progress if previous.last_progress is not None else now
    stuck_for = now - last_progress
    # Over two reads at least, as `stuck` always is: one lost read after a long gap proves nothing.
    frozen = not starved and unread_for >= target.down_after and failed >= 2
    if frozen or (pending and reads >= 2 and stuck_for >= target.stuck_after):
        state: State = "stuck"
    elif pending:
        state = "busy"
    else:
        detail = (f"{_still(previous, now)}; /metrics accepted the connection and never answered ({error.detail}), "
                  f"nor did a second probe: frozen if it lasts {target.down_after:g}s "
                  f"(no good read for {unread_for:.1f}s)")
        return _move(previous, now, previous.state, previous.reason, detail, up=False, error_reason=error.reason,
                     failed_reads=failed, steps_per_second=None, generation_tokens_per_second=None)
    owed = "while work was pending" if previous.snapshot is not None and previous.snapshot.pending else (
        "after an idle read")
    if starved and previous.snapshot is not None:
        owed = (f"after a saturated read ({previous.snapshot.load()}: the reads may wait behind the clients' "
                f"own requests; stuck once nothing moved for {target.stuck_after:g}s)")
    detail = (f"/metrics accepted the connection and never answered ({error.detail}) {owed}; "
              f"no good read for {unread_for:.1f}s over {failed} read(s), no progress seen for {stuck_for:.1f}s")
    return _move(previous, now, state, "metrics_unanswered", detail, up=False, error_reason=error.reason,
                 failed_reads=failed, reads_without_progress=reads, last_progress=last_progress,
                 stuck_seconds=stuck_for, steps_per_second=None, generation_tokens_per_second=None)


def _on_models(previous: Verdict, seen: ModelsOk, now: float, target: TargetSettings) -> Verdict:
    common = dict(up=True, started=True, error_reason=None, models=seen.models, last_progress=now,
                  last_good_read=now, failed_reads=0, reads_without_progress=0, stuck_seconds=0.0)
    if target.role == "proxy":
        return _move(previous, now, "idle", "proxy_models_ok", f"/v1/models lists {len(seen.models)} model(s)",
                     last_served=now, **common)
    # An engine with no /metrics looks idle; only the canary can show it cannot serve.
    if previous.canary_failures >= target.canary.failures_before_unresponsive:
        return _move(previous, now, "unresponsive", "canary_failed",
                     f"{previous.canary_failures} canaries in a row failed", **common)
    if previous.canary_rejected is not None:
        return _move(previous, now, "idle", "canary_rejected", _rejected_detail(previous.canary_rejected), **common)
    return _move(previous, now, "idle", "models_ok", f"/v1/models lists {len(seen.models)} model(s)", **common)


def _rate(before: float | None, after: float | None, seconds: float) -> float | None:
    # A sum that fell within one lifetime lost a series (a Triton model unloaded): no rate, never a negative one.
    if before is None or after is None or seconds <= 0 or after < before:
        return None
    return (after - before) / seconds


def _unit_pairs(base: Snapshot, snap: Snapshot) -> list[tuple[Unit, Unit | None]]:
    """Each unit of `snap` with the same unit in `base` (None where `base` did not have it)."""
    before = {unit.name: unit for unit in base.units}
    return [(unit, before.get(unit.name)) for unit in snap.units]


def _unit_moved(before: Unit, after: Unit) -> bool:
    """Any of the unit's own counters grew, or a gauge of its own changed."""
    return (any(old is not None and new is not None and new > old for old, new in zip(before.counters, after.counters, strict=False))
            or any(old is not None and new is not None and new != old for old, new in zip(before.gauges, after.gauges, strict=False)))


def _unit_restarted(before: Unit, after: Unit) -> bool:
    # A counter of the unit fell: it started again (a Triton model reloaded), a lifetime of its own.
    return any(old is not None and new is not None and new < old for old, new in zip(before.counters, after.counters, strict=False))


def unit_clocks(previous: Verdict, base: Snapshot | None, snap: Snapshot, now: float) -> tuple[tuple[str, float, int], ...]:
    """Each unit's stuck clock after this read: (name, its last progress, its reads without progress).

    A unit's clock runs while it has work pending and none of its own signals moves, as the
    target's does over the sums; `base` is the last read of this process lifetime (None: none).
    """
    if not snap.units:
        return ()
    clocks = {name: (since, reads) for name, since, reads in previous.unit_clocks}
    start = previous.snapshot_at if previous.snapshot_at is not None else now
    out = []
    for unit, old in (_unit_pairs(base, snap) if base is not None else [(unit, None) for unit in snap.units]):
        if old is None or not unit.pending or _unit_moved(old, unit) or _unit_restarted(old, unit):
            out.append((unit.name, now, 0))
        else:
            since, reads = clocks.get(unit.name, (start, 0))
            out.append((unit.name, since, reads + 1))
    return tuple(out)


def _worst_unit(snap: Snapshot, clocks: tuple[tuple[str, float, int], ...], now: float,
                target: TargetSettings) -> tuple[State, Unit, float, int] | None:
    """The unit that makes the target `stuck` (first) or `waiting_on_peer`, with its clock; None: none does."""
    worst: tuple[State, Unit, float, int] | None = None
    for unit, (_, since, reads) in zip(snap.units, clocks, strict=True):
        if reads < 2 or now - since < target.stuck_after:
            continue
        state: State = "waiting_on_peer" if _on_peer(unit.running, unit.deferred) else "stuck"
        rank = (state == "stuck", now - since)
        if worst is None or rank > (worst[0] == "stuck", now - worst[2]):
            worst = (state, unit, since, reads)
    return worst


def _on_peer(running: float, deferred: float) -> bool:
    # Nothing running and work the engine itself deferred (a remote KV transfer, a prefill peer's
    # handshake): what holds it up is outside this server, and a restart of it fixes nothing. The
    # capacity-waiting requests beside them may be held back by the deferred ones' KV blocks.
    return running == 0 and deferred > 0


def _unit_load(unit: Unit) -> str:
    text = f"running {unit.running:g}, waiting {unit.waiting:g}"
    return text + (f" ({unit.deferred:g} deferred by the engine)" if unit.deferred else "")


def _on_snapshot(previous: Verdict, snap: Snapshot, now: float, target: TargetSettings,
                 canary_overlap: bool = False, paused: bool | None = None) -> Verdict:
    base = previous.snapshot
    restarted = False
    if base is not None:
        lifetime = same_lifetime(base, snap)
        if lifetime is not None:
            restarted = not lifetime
            backwards = None if restarted else went_backwards(base, snap)
            if backwards:
                # Same lifetime, yet a counter fell: the page is not one process's counters (a proxy
                # mixing backends, a broken exporter). Re-base on it so one bad read stays one.
                return _on_error(
                    previous,
                    PollError("bad_metrics", f"counter {backwards} went backwards in the same process lifetime"),
                    now, target, snapshot=snap, snapshot_at=now,
                )
        else:
            # No start time nor token (e.g. --api-server-count > 1, SGLang, Triton, TGI): a monotone
            # counter that fell, or a fresh page, is a restart; reads that failed in between (the
            # server was away) let a model that counted nothing show no reset (Triton).
            restarted = went_backwards(base, snap, gap=previous.failed_reads > 0) is not None

    # Counters are compared only within one lifetime; the first read of a lifetime compares nothing.
    same_life = base if not restarted else None
    comparable = same_life is not None
    moved = same_life is not None and progressed(same_life, snap)
    if moved and same_life is not None and snap.unjudged is not None and not snap.pending:
        # An unjudged model's counters move as its requests go in, not as its responses go out
        # (exporter/decoupled.py): its own series moving is no progress on an idle-looking read.
        moved = _moved_beside(same_life, snap, snap.unjudged.unit)
    elapsed = now - previous.snapshot_at if comparable and previous.snapshot_at is not None else 0.0
    restarts = previous.restarts + (1 if restarted else 0)
    clocks = unit_clocks(previous, same_life, snap, now)
    changes: dict[str, Any] = dict(
        up=True, started=True, error_reason=None, snapshot=snap, snapshot_at=now, last_good_read=now, failed_reads=0,
        restarts=restarts,
        last_restart_at=now if restarted else previous.last_restart_at,
        steps_per_second=_rate(same_life.steps, snap.steps, elapsed) if same_life else None,
        generation_tokens_per_second=(
            _rate(same_life.generation_tokens, snap.generation_tokens, elapsed) if same_life else None
        ),
        unit=None, unit_clocks=clocks,
    )
    load = snap.load()

    if restarted:
        # A new process: `starting` until a read of its own shows it servable. `started` is the
        # process's, not the target's (a restarted container's startup probe waits for it again).
        # Canary failures and served evidence were about the old process, not this one: an idle
        # restarted server is ready once its own canary answers (sent once a second read shows it idle).
        changes.update(started=False, canary_failures=0, last_served=None, canary_rejected=None, last_progress=now,
                       reads_without_progress=0, stuck_seconds=0.0, operation_since=None)
        detail = f"process restarted (restart #{restarts}); {load}; judged from the next read of this process"
        return _move(previous, now, "starting", "restart", detail, **changes)

    if moved:
        changes.update(last_progress=now, last_served=now, reads_without_progress=0, stuck_seconds=0.0,
                       canary_failures=0)
    elif not snap.pending or not comparable:
        # Nothing owed (or nothing to compare with yet): the stuck clock starts from here.
        changes.update(last_progress=now, reads_without_progress=0, stuck_seconds=0.0)

    on_purpose = _on_purpose(previous, snap, now, target, moved, paused, changes)
    if on_purpose is not None:
        return on_purpose

    if snap.sleep_level:
        level = SLEEP_LEVEL_WORDS.get(snap.sleep_level, "")
        asleep = f"engine asleep at level {snap.sleep_level}{f' ({level})' if level else ''}"
        if not snap.pending:
            # Put to sleep on purpose (RL frameworks, model-swapping gateways): nothing is owed while it
            # sleeps, so it is never stuck and never a restart candidate, and it gets no canary (on a
            # GPU a request to a sleeping vLLM has crashed it: vLLM issue #15483). Not ready, still live.
            changes.update(canary_failures=0)
            return _move(previous, now, "asleep", "asleep", f"{asleep}; {load}", **changes)
        # Work pending on a sleeping engine is owed (a wake-up that hangs with requests queued): it
        # is judged as any pending work, so nothing moving for stuck_after is `stuck`, never `asleep`.
        load = f"{load}; {asleep}"

    if not snap.pending:
        if same_life is None:
            # The first read of this process: nothing to compare with, so no interval seen quiet yet.
            return _move(previous, now, "starting", "startup",
                         f"{load} on the first read; idle once a second read shows nothing moved", **changes)
        # Counters the exporter's own canary moved on an idle server are not work.
        own_canary = canary_overlap and previous.state in ("idle", "unresponsive") and not same_life.pending
        if moved and not own_canary:
            # Work flowed since the last read, though nothing is pending at this instant (vLLM's API
            # server may feed its engine one request at a time): busy, and no canary.
            return _move(previous, now, "busy", "progress",
                         f"{load} at this read, but engine signals moved since the last one", **changes)
        if same_life.pending:
            return _move(previous, now, "busy", "waiting_for_progress",
                         f"{load} now, with work pending at the last read; idle once a whole interval is quiet",
                         **changes)
        failures = previous.canary_failures if not moved else 0
        if failures >= target.canary.failures_before_unresponsive and snap.unjudged is None:
            return _move(previous, now, "unresponsive", "canary_failed",
                         f"idle-looking, but {failures} canaries in a row failed", **changes)
        if previous.canary_rejected is not None:
            return _move(previous, now, "idle", "canary_rejected", _rejected_detail(previous.canary_rejected), **changes)
        if snap.unjudged is not None:
            # Nothing pending and nothing moving says nothing about a model no signal follows: not
            # idle by evidence, and its canary may wait behind streams no counter shows.
            changes.update(unit=snap.unjudged.unit)
            return _move(previous, now, "idle", "unjudgeable", _unjudged_detail(snap.unjudged.why, failures), **changes)
        return _move(previous, now, "idle", "idle", "nothing running or waiting, and nothing moved since the last read",
                     **changes)

    worst = _worst_unit(snap, clocks, now, target) if clocks else None
    if moved or not comparable:
        state: State = "busy"
        reason: Reason = "progress"
        detail = f"{load}; engine signals moving"
    else:
        reads = previous.reads_without_progress + 1
        last_progress = previous.last_progress if previous.last_progress is not None else now
        stuck_for = now - last_progress
        changes.update(reads_without_progress=reads, last_progress=last_progress, stuck_seconds=stuck_for)
        if reads >= 2 and stuck_for >= target.stuck_after:
            if _on_peer(snap.running, snap.deferred) and (worst is None or worst[0] != "stuck"):
                changes.update(unit=worst[1].name if worst else None)
                return _move(previous, now, "waiting_on_peer", "waiting_on_peer",
                             f"{load}; nothing moved for {stuck_for:.1f}s over {reads} reads, with nothing running "
                             f"and {snap.deferred:g} request(s) the engine deferred (KV transfer, a peer): "
                             f"a restart of this server does not fix its peer", **changes)
            changes.update(unit=worst[1].name if worst else None)
            longest = f"; stuck longest: unit {worst[1].name}" if worst else ""
            return _move(previous, now, "stuck", "no_progress",
                         f"{load}; no engine signal moved for {stuck_for:.1f}s over {reads} reads{longest}", **changes)
        state, reason = "busy", "waiting_for_progress"
        detail = f"{load}; nothing moved for {stuck_for:.1f}s ({reads} read(s))"

    if worst is not None:
        # One unit hung beside others that move: the target is as bad as its worst unit, on that
        # unit's own clock (liveness and stuck_seconds count from its last progress).
        unit_state, unit, since, reads = worst
        stuck_for = now - since
        changes.update(unit=unit.name, last_progress=since, reads_without_progress=reads, stuck_seconds=stuck_for)
        if unit_state == "stuck":
            return _move(previous, now, "stuck", "no_progress",
                         f"unit {unit.name} stuck: {_unit_load(unit)}, and none of its own signals moved for "
                         f"{stuck_for:.1f}s over {reads} reads (the whole server: {load})", **changes)
        return _move(previous, now, "waiting_on_peer", "waiting_on_peer",
                     f"unit {unit.name} waiting on a peer: {_unit_load(unit)}, nothing running and nothing of its "
                     f"own moved for {stuck_for:.1f}s over {reads} reads (the whole server: {load})", **changes)
    return _move(previous, now, state, reason, detail, **changes)


def _on_purpose(previous: Verdict, snap: Snapshot, now: float, target: TargetSettings, moved: bool,
                paused: bool | None, changes: dict[str, Any]) -> Verdict | None:
    """The verdict of an engine that stopped on purpose (docs/states.md, "paused"), or None: judge it as any read.

    - An operation in flight (a weight update, a sleep or wake-up) for longer than `pause_budget`:
      `stuck` (reason operation_stuck), the engine wedged inside it, its stuck clock counting from
      the moment the budget ran out (so liveness gives the remediator its go first).
    - Else, nothing moved and the engine says it holds still on purpose: `paused`. An operation in
      flight; the pause route's True; requests it paused (SGLang); or asleep with requests kept
      (vLLM's /sleep?mode=keep, which leaves them pending on a sleeping engine). The stuck clock
      starts again from each paused read, so a hang right after a resume is found as fast as ever.
    """
    if moved and not snap.operations:
        changes["operation_since"] = None  # the common read: work moving, no operation on the page
        return None
    ops = snap.in_flight()
    since = (previous.operation_since if previous.operation_since is not None else now) if ops else None
    changes.update(operation_since=since)
    load = snap.load()
    if ops and since is not None and now - since >= target.pause_budget:
        wedged_at = since + target.pause_budget
        changes.update(last_progress=wedged_at, stuck_seconds=now - wedged_at,
                       reads_without_progress=previous.reads_without_progress + 1)
        return _move(previous, now, "stuck", "operation_stuck",
                     f"{', '.join(ops)} still in flight after {now - since:.1f}s, past pause_budget "
                     f"{target.pause_budget:g}s: the engine is wedged inside it; {load}", **changes)
    if moved:
        return None
    if ops:
        reason: Reason = "operation_in_flight"
        why = f"{', '.join(ops)} in flight for {now - (since or now):.1f}s"
    elif paused:
        reason, why = "paused", "the engine says it is paused (its pause route answered true)"
    elif snap.paused:
        reason, why = "paused", f"{snap.paused:g} request(s) paused by the engine (a weight sync)"
    elif snap.sleep_level and snap.pending:
        reason, why = "sleep_kept", f"engine asleep at level {snap.sleep_level} with its requests kept"
    else:
        return None
    # Nothing is owed while it holds still on purpose: the stuck clock starts again from here, and
    # canaries sent meanwhile (queued behind the pause) say nothing about the server.
    changes.update(last_progress=now, reads_without_progress=0, stuck_seconds=0.0, canary_failures=0)
    held = now - (previous.since if previous.state == "paused" else now)
    over = (f"; paused {held:.1f}s, past pause_budget {target.pause_budget:g}s: pages (LLMServerPausedTooLong), "
            f"never restarted") if held > target.pause_budget else ""
    return _move(previous, now, "paused", reason, f"{why}; {load}: paused on purpose, not stuck{over}", **changes)
def _moved_beside(before: Snapshot, after: Snapshot, unit: str) -> bool:
    """Whether a signal moved other than `unit`'s own series (`unit`: `model="m"`, its series `model="m",version=...|family`)."""
    if not after.series:
        return progressed(before, after)
    prefix = unit + ","
    old = {name: value for name, value in before.series if not name.startswith(prefix)}
    if any(name in old and value > old[name] for name, value in after.series if not name.startswith(prefix)):
        return True
    old_gauges = before.gauges()
    return any(old_gauges.get(name) is not None and new is not None and old_gauges[name] != new
               for name, new in after.gauges().items())


def _unjudged_detail(why: str, failures: int) -> str:
    tail = f"; {failures} canaries in a row failed: look at its load before restarting it" if failures else ""
    return f"not judged: {why}{tail}"


def _rejected_detail(rejected: str) -> str:
    return (f"idle; the canary was rejected ({rejected}): a restart cannot fix this, "
            f"check the target's model, API key and canary.endpoint")


def record_canary(previous: Verdict, outcome: CanaryOutcome, now: float, target: TargetSettings) -> Verdict:
    """Fold one canary result into the verdict: repeated failures on an idle-looking server are `unresponsive`.

    A rejected canary (the server answered 4xx) is no failure: the server answered at once, and
    what it refused a restart cannot fix. It is shown as reason `canary_rejected` on an idle
    server (a reason, not a state: it says nothing about the engine's progress, and a state would
    count toward the fleet gate and the restartable states), ends a run of failures, and lifts an
    `unresponsive` built of earlier failures back to idle: the canary can no longer tell.
    """
    if outcome.result == "ok":
        verdict = replace(previous, canary_failures=0, last_canary_ok=now, last_served=now, canary_rejected=None)
        if verdict.state == "unresponsive" or verdict.reason == "canary_rejected":
            return replace(verdict, state="idle", reason="canary_ok", detail="canary answered again",
                           since=now if verdict.state != "idle" else verdict.since)
        return verdict
    if outcome.result == "rejected":
        verdict = replace(previous, canary_failures=0, canary_rejected=outcome.detail)
        if previous.state in ("idle", "unresponsive"):
            return replace(verdict, state="idle", reason="canary_rejected", detail=_rejected_detail(outcome.detail),
                           since=now if previous.state != "idle" else previous.since)
        return verdict
    if previous.state == "paused":
        # Queued behind a pause on purpose: a failure says nothing about the server.
        return previous
    failures = previous.canary_failures + 1
    verdict = replace(previous, canary_failures=failures, canary_rejected=None)
    if previous.reason == "canary_rejected":
        detail = f"idle-looking; the last canary failed ({outcome.result} {outcome.detail})".strip()
        verdict = replace(verdict, reason="idle", detail=detail)
    unjudged = previous.snapshot.unjudged if previous.snapshot is not None else None
    if previous.reason == "unjudgeable" and unjudged is not None:
        # Its load is unknown (exporter/decoupled.py): a failure is shown, and never `unresponsive`.
        return replace(verdict, detail=f"{_unjudged_detail(unjudged.why, failures)} (last: {outcome.result} {outcome.detail})")
    if failures >= target.canary.failures_before_unresponsive and previous.state == "idle":
        return replace(verdict, state="unresponsive", reason="canary_failed", since=now, last_unhealthy_at=now,
                       detail=f"idle-looking, but {failures} canaries in a row failed (last: {outcome.result} {outcome.detail})".strip())
    return verdict


def is_started(verdict: Verdict) -> bool:
    """Startup probe: the server has been servable at least once."""
    return verdict.started


def is_ready(verdict: Verdict, target: TargetSettings, now: float, draining: bool, gpu_fault: bool = False) -> bool:
    """Readiness: started, not down/stuck/unresponsive, fresh evidence when idle, not draining, no GPU fault. Never load."""
    if draining or gpu_fault or not verdict.started or verdict.state in NOT_READY_STATES:
        return False
    if verdict.state == "paused":
        # Ready as the engine itself says: vLLM's /health answers 200 while paused (its requests
        # wait and are served on /resume); one whose page says it sleeps is not, as `asleep` is not.
        return not (verdict.snapshot is not None and verdict.snapshot.sleep_level)
    if (verdict.state == "idle" and target.sends_canary and verdict.canary_rejected is None
            and verdict.reason != "unjudgeable"):
        # A rejected canary (our model name, key or endpoint is wrong) can vouch neither way: it is
        # alerted for a human, and not held against the server, or one rotated key would take every
        # replica out of its Service at once. Nor can an unjudged model's (exporter/decoupled.py),
        # which may wait behind streams no counter shows: load is never a reason to be unready.
        return verdict.last_served is not None and now - verdict.last_served <= target.canary.freshness
    return True


def drain_holds(draining: bool, before: Verdict, after: Verdict) -> bool:
    """Is the target still draining after a poll that judged `before` into `after`?

    A drain is asked of one server process: the kubelet runs a container's preStop hook (which
    drains) on every stop of that container, a liveness restart included. Once a restart is
    detected the process it was asked of is gone, and the new one is not draining, or a pod whose
    server the kubelet restarted would never be ready again (seen on a real kubelet 1.20).
    """
    return draining and after.restarts == before.restarts


def is_live(verdict: Verdict, target: TargetSettings, now: float, *, holding: bool = False,
            held_at: float | None = None) -> bool:
    """Liveness fails only on sustained, shown lack of progress: stuck for longer than the budget.

    With the remediator's gate (exporter/backstop.py): never while the backstop is `holding`, and the
    budget counts from the end of the last hold (`held_at`) too, so the remediator, whose alert fires
    on the same stuck server, has the first go once a hold ends."""
    if verdict.state != "stuck" or verdict.last_progress is None or holding:
        return True
    since = verdict.last_progress if held_at is None else max(verdict.last_progress, held_at)
    return now - since <= target.liveness


def canary_due(
    verdict: Verdict,
    observation: Observation,
    last_sent: float | None,
    now: float,
    target: TargetSettings,
    *,
    poll_interval: float,
    in_flight: bool = False,
) -> bool:
    """May a canary go out with the poll that just judged `observation` into `verdict`?

    The product's key rule: never to a server this very poll saw working, so the canary cannot
    queue behind the load it guards. `last_sent` is when the previous canary went out (None: never).
    """
    if not target.sends_canary or in_flight or verdict.state == "asleep":
        return False
    # A canary to the process before the last detected restart says nothing about this one: a
    # new process must show it serves before an idle server is ready, so its canary goes at once.
    before_restart = last_sent is not None and verdict.last_restart_at is not None and last_sent < verdict.last_restart_at
    # Due from half a poll before the interval is up: a canary can only go out with a poll, so
    # waiting for the full interval made every gap interval + up to one poll (4 s for 3 s on
    # the real vLLM); with the half-poll allowance the gaps average the configured interval.
    due_after = target.canary.interval - poll_interval / 2
    if last_sent is not None and not before_restart and now - last_sent < due_after:
        return False
    if isinstance(observation, Snapshot):
        # Idle by the verdict: a whole interval with nothing pending and nothing moving, not just
        # gauges at 0 at the instant of this read.
        return not observation.pending and verdict.state in ("idle", "unresponsive")
    # An engine with no /metrics cannot show its load; its models answer is the best we have.
    return isinstance(observation, ModelsOk) and engine_of(target.engine).parse is None
