"""The pure state machine: (previous verdict, what one poll saw, now, target settings) -> new verdict.

No I/O and no clock of its own: every case is a table test with an injected `now`. `now` is a
monotonic reading (llm_vitals/exporter/clock.py): every time a Verdict holds is one, and every span it
measures (stuck seconds, liveness, down_after, the canary's interval) is a difference of two; the
views turn the instants they show into wall time.

Partial evidence (DESIGN §10):
- a failed read is not evidence: the verdict keeps its state, its last good reading and its stuck
  clock, so the next good page is compared with the last good one; only failures that last
  `down_after` (no good read for that long) make the target `down`. The engine's own word that it
  is dead (a health route's 503) is `down` at once;
- a read that timed out while the exporter's own event loop lagged is `exporter_late`
  (`exporter_late()`): counted and shown, and evidence of nothing, not even toward `down`, and
  not a poll either (`last_poll` stays, so LLMVitalsPollingStale sees a starved exporter);
- refused, frozen and slow are told apart by evidence, not by one timeout (DESIGN §11):
  a refused connection (no process listens) is `down` at once; a read that connected and got no
  answer, while a second probe on a fresh connection got none either, is a frozen process: held
  until no good read came for `down_after`, then `stuck` (`metrics_unanswered`), which liveness and
  the remediator act on, whether it was last seen busy or idle; a read that timed out while the
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

from llm_vitals.exporter.engines import EngineFacts, Snapshot
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


@dataclass(frozen=True, slots=True)
class ModelsOk:
    """A good `/v1/models` answer: all a proxy (or an engine with no `/metrics`) is judged by."""

    models: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CanaryOutcome:
    result: Literal["ok", "error", "timeout"]
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
    reads_without_progress: int = 0  # consecutive reads with work pending and nothing moving
    stuck_seconds: float = 0.0
    restarts: int = 0
    last_restart_at: float | None = None
    last_unhealthy_at: float | None = None  # last verdict in an UNHEALTHY_STATES state
    canary_failures: int = 0  # consecutive
    last_canary_ok: float | None = None
    steps_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    models: tuple[str, ...] = ()

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


def went_backwards(before: Snapshot, after: Snapshot) -> str | None:
    """Name of a monotone counter that decreased, or None (a counter only one read has is no reset).

    Per series (Snapshot.series), one series falling is its model reloaded between the two reads; a
    restart is every series both reads carry that had counted anything falling together.
    """
    old_counters = before.monotone()
    fell, counted = [], []
    for name, new in after.monotone().items():
        old = old_counters.get(name)
        if old is None or new is None:
            continue
        if new < old:
            fell.append(name)
        if old > 0:
            counted.append(name)
    if not fell:
        return None
    if before.series and after.series and not set(counted) <= set(fell):
        return None
    return fell[0]


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
    return base is not None and not progressed(base, snap)


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
    connected and got no answer is `unanswered` (frozen whole); any other failure, or one the
    exporter was too late for, is no evidence either way, and `error` stays as it was.
    """
    if isinstance(answer, int):
        if health_route and answer == 503:
            return PollError("health_503", f"{path} answered 503: the engine is dead")
        return PollError(error.reason, f"{error.detail}; {path} answered HTTP {answer}", probe="answered")
    if answer.reason == "refused":
        return PollError("refused", f"{error.detail}; then {answer.detail}")
    if answer.reason == "timeout":
        return PollError(error.reason, f"{error.detail}, and {answer.detail} too", probe="unanswered")
    return error


def canary_overlapped(last_sent: float | None, in_flight: bool, since: float | None) -> bool:
    """Whether the exporter's own canary may have moved the counters since the read at `since`.

    A canary is sent right after a read (with its `now`), so one sent at or after `since`, or still
    in flight, ran inside the interval the next read measures.
    """
    return in_flight or (last_sent is not None and since is not None and last_sent >= since)


def judge(previous: Verdict | None, observation: Observation, now: float, target: TargetSettings,
          facts: EngineFacts | None = None, *, health: tuple[str, int] | None = None,
          canary_overlap: bool = False) -> Verdict:
    """The new verdict for `target` after one poll that saw `observation` at time `now`.

    `facts` are the engine table's facts about `target.engine` (given explicitly by table tests).
    `health` is (route, HTTP status) of the engine's health route in this poll, when it was asked
    (see `health_check_due`); None when it was not asked or did not answer. `canary_overlap`: the
    exporter's own canary ran since the last read (`canary_overlapped`), so counters it moved on an
    idle server are not work.
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
        if observation.reason == "timeout":
            # An engine whose own loop answers /metrics (llama.cpp, Triton's metrics threads) is not
            # slow because of load, and its health route may answer while that loop is wedged: its
            # unanswered page is frozen evidence by itself, once it has had the longer deadline
            # when a second probe answered (a page that arrives late still arrives).
            unanswered = observation.probe == "unanswered" or (
                facts.metrics_unanswered_is_stuck and (observation.probe is None or previous.slow))
            pending = unanswered and facts.metrics_unanswered_is_stuck and _unanswered_while_pending(previous, observation)
            if pending or (unanswered and _frozen_chain(previous)):
                return _on_unanswered(previous, observation, now, target, pending=pending)
            if observation.probe == "answered":
                if _slow_but_reading(previous):
                    return _on_slow(previous, observation, now)
                # Not (or no longer) a slow page but a failed read; the server answers elsewhere,
                # so its next read still gets the longer deadline.
                return replace(_on_error(previous, observation, now, target), slow=True)
        return _unslowed(_on_error(previous, observation, now, target))
    if isinstance(observation, ModelsOk):
        return _unslowed(_on_models(previous, observation, now, target))
    return _unslowed(_on_snapshot(previous, observation, now, target, canary_overlap))


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
    if (error.reason in DOWN_AT_ONCE or not previous.started or previous.state == "down"
            or unread_for >= target.down_after):
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
                 slow=True)


def _unanswered_while_pending(previous: Verdict, error: PollError) -> bool:
    # `timeout` is a /metrics read that connected and got no answer in time (a refused connection
    # is `refused`, a connect that timed out `connect`); "pending" is what the last good read
    # showed, as long as every poll since then was pending or unanswered: a `down` in between
    # breaks the chain, and so does a refused connection or any other failure just before.
    return (error.reason == "timeout" and previous.snapshot is not None and previous.snapshot.pending
            and previous.state in ("busy", "stuck") and _frozen_chain(previous))


def _frozen_chain(previous: Verdict) -> bool:
    # Every read since the last good one connected and got no answer (or was the exporter's own
    # lateness): a server once servable, not `down` since, and not refusing (a frozen process accepts).
    return previous.started and previous.state != "down" and previous.error_reason in (None, "timeout", "exporter_late")


def _on_unanswered(previous: Verdict, error: PollError, now: float, target: TargetSettings, *,
                   pending: bool) -> Verdict:
    # A server that accepts the connection and never answers is frozen, not gone: a restart may fix
    # it, so it must never end as `down`, which liveness and the remediator leave alone. Frozen whole
    # (a second probe unanswered too, or an engine whose own loop answers /metrics) for `down_after`
    # since the last good read is `stuck`, whether it was last seen busy or idle; with work owed, on
    # an engine whose loop answers /metrics (llama.cpp), it is stuck once `stuck_after` has passed
    # over two reads, as one whose counters froze. The stuck clock keeps running from the last
    # progress, across reads, and nothing is re-based.
    last_good = previous.last_good_read if previous.last_good_read is not None else previous.first_seen
    unread_for = now - last_good
    failed = previous.failed_reads + 1  # all unanswered: the chain (_frozen_chain) admits nothing else
    reads = previous.reads_without_progress + 1
    last_progress = previous.last_progress if previous.last_progress is not None else now
    stuck_for = now - last_progress
    # Over two reads at least, as `stuck` always is: one lost read after a long gap proves nothing.
    frozen = unread_for >= target.down_after and failed >= 2
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
    return _move(previous, now, "idle", "models_ok", f"/v1/models lists {len(seen.models)} model(s)", **common)


def _rate(before: float | None, after: float | None, seconds: float) -> float | None:
    # A sum that fell within one lifetime lost a series (a Triton model unloaded): no rate, never a negative one.
    if before is None or after is None or seconds <= 0 or after < before:
        return None
    return (after - before) / seconds


def _on_snapshot(previous: Verdict, snap: Snapshot, now: float, target: TargetSettings,
                 canary_overlap: bool = False) -> Verdict:
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
            # No start time nor token (e.g. --api-server-count > 1, SGLang, Triton): a monotone
            # counter that fell is a restart.
            restarted = went_backwards(base, snap) is not None

    # Counters are compared only within one lifetime; the first read of a lifetime compares nothing.
    same_life = base if not restarted else None
    comparable = same_life is not None
    moved = same_life is not None and progressed(same_life, snap)
    elapsed = now - previous.snapshot_at if comparable and previous.snapshot_at is not None else 0.0
    restarts = previous.restarts + (1 if restarted else 0)
    changes: dict[str, Any] = dict(
        up=True, started=True, error_reason=None, snapshot=snap, snapshot_at=now, last_good_read=now, failed_reads=0,
        restarts=restarts,
        last_restart_at=now if restarted else previous.last_restart_at,
        steps_per_second=_rate(same_life.steps, snap.steps, elapsed) if same_life else None,
        generation_tokens_per_second=(
            _rate(same_life.generation_tokens, snap.generation_tokens, elapsed) if same_life else None
        ),
    )
    load = snap.load()

    if snap.sleep_level:
        # Put to sleep on purpose (RL frameworks, model-swapping gateways): nothing is owed while it
        # sleeps, so it is never stuck and never a restart candidate, and it gets no canary (on a
        # GPU a request to a sleeping vLLM has crashed it: vLLM issue #15483). Not ready, still live.
        changes.update(last_progress=now, reads_without_progress=0, stuck_seconds=0.0, canary_failures=0)
        if restarted:
            changes.update(last_served=None)
        level = SLEEP_LEVEL_WORDS.get(snap.sleep_level, "")
        detail = f"engine asleep at level {snap.sleep_level}{f' ({level})' if level else ''}; {load}"
        return _move(previous, now, "asleep", "asleep", detail, **changes)

    if moved:
        changes.update(last_progress=now, last_served=now, reads_without_progress=0, stuck_seconds=0.0,
                       canary_failures=0)
    elif not snap.pending or not comparable:
        # Nothing owed (or nothing to compare with yet): the stuck clock starts from here.
        changes.update(last_progress=now, reads_without_progress=0, stuck_seconds=0.0)

    if restarted:
        # Canary failures and served evidence were about the old process, not this one: an idle
        # restarted server is ready once its own canary answers (sent once a second read shows it idle).
        changes.update(canary_failures=0, last_served=None)
        detail = f"process restarted (restart #{restarts}); {load}"
        return _move(previous, now, "busy" if snap.pending else "starting", "restart", detail, **changes)

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
        if failures >= target.canary.failures_before_unresponsive:
            return _move(previous, now, "unresponsive", "canary_failed",
                         f"idle-looking, but {failures} canaries in a row failed", **changes)
        return _move(previous, now, "idle", "idle", "nothing running or waiting, and nothing moved since the last read",
                     **changes)

    if moved or not comparable:
        return _move(previous, now, "busy", "progress", f"{load}; engine signals moving", **changes)

    reads = previous.reads_without_progress + 1
    last_progress = previous.last_progress if previous.last_progress is not None else now
    stuck_for = now - last_progress
    changes.update(reads_without_progress=reads, last_progress=last_progress, stuck_seconds=stuck_for)
    if reads >= 2 and stuck_for >= target.stuck_after:
        return _move(previous, now, "stuck", "no_progress",
                     f"{load}; no engine signal moved for {stuck_for:.1f}s over {reads} reads", **changes)
    return _move(previous, now, "busy", "waiting_for_progress",
                 f"{load}; nothing moved for {stuck_for:.1f}s ({reads} read(s))", **changes)


def record_canary(previous: Verdict, outcome: CanaryOutcome, now: float, target: TargetSettings) -> Verdict:
    """Fold one canary result into the verdict: repeated failures on an idle-looking server are `unresponsive`."""
    if outcome.result == "ok":
        verdict = replace(previous, canary_failures=0, last_canary_ok=now, last_served=now)
        if verdict.state == "unresponsive":
            return replace(verdict, state="idle", reason="canary_ok", detail="canary answered again", since=now)
        return verdict
    failures = previous.canary_failures + 1
    verdict = replace(previous, canary_failures=failures)
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
    if verdict.state == "idle" and target.sends_canary:
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


def is_live(verdict: Verdict, target: TargetSettings, now: float) -> bool:
    """Liveness fails only on sustained, shown lack of progress: stuck for longer than the budget."""
    if verdict.state != "stuck" or verdict.last_progress is None:
        return True
    return now - verdict.last_progress <= target.liveness


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
