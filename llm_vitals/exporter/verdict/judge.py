"""The verdict of a poll that read a page (or a proxy's model list), and of a canary's answer. Pure."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from llm_vitals.exporter.engines import EngineFacts, PageReading
from llm_vitals.exporter.engines.table import engine_of
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict.compare import Comparison, compare, moved_beside, on_peer, unit_load, worst_unit
from llm_vitals.exporter.verdict.model import SLEEP_LEVEL_WORDS, CanaryOutcome, ModelsOk, PollError, Verdict, initial, move, move_with
from llm_vitals.exporter.verdict.unread import on_error, on_failure, unslowed
from llm_vitals.targets import Reason, State

if TYPE_CHECKING:
    from llm_vitals.exporter.verdict.model import Observation


def judge(previous: Verdict | None, observation: Observation, now: float, target: TargetSettings,
          facts: EngineFacts | None = None, *, health: tuple[str, int] | None = None,
          canary_overlap: bool = False, paused: bool | None = None, comparison: Comparison | None = None) -> Verdict:
    """The new verdict for `target` after one poll that saw `observation` at time `now`.

    `facts` are the engine table's facts about `target.engine` (given explicitly by table tests).
    `health` is (route, HTTP status) of the engine's health route in this poll, when it was asked
    (see `health_check_due`); None when it was not asked or did not answer. `canary_overlap`: the
    exporter's own canary ran since the last read (`canary_overlapped`), so counters it moved on an
    idle server are not work. `paused` is the engine's pause route's answer, asked since the last
    read (`pause_ask_due`): True, the engine paused on purpose; False or None (not asked, no answer:
    a hung vLLM EngineCore does not answer /is_paused) is no pause. `comparison` is the page's against
    the last good read, as the health-check decision took it (`compare(previous, observation)`, which
    works it out where it is not given).
    """
    previous = previous or initial(now)
    facts = facts if facts is not None else engine_of(target.engine).facts
    if isinstance(observation, PageReading) and health is not None and health[1] == 503:
        # The engine's word that it is dead. Any other answer (or none) is no news: it must not
        # replace the page just read, or a stuck server would read `down`, which liveness never acts on.
        return on_error(previous, PollError("health_503", f"{health[0]} answered 503: the engine is dead"), now, target)
    if isinstance(observation, PollError):
        return on_failure(previous, observation, now, target, facts)
    if isinstance(observation, ModelsOk):
        return unslowed(_on_models(previous, observation, now, target))
    if comparison is None:
        comparison = compare(previous, observation)
    return unslowed(_on_snapshot(previous, observation, now, target, comparison, canary_overlap, paused))


def _on_models(previous: Verdict, seen: ModelsOk, now: float, target: TargetSettings) -> Verdict:
    common = dict(up=True, started=True, error_reason=None, models=seen.models, last_progress=now,
                  last_good_read=now, failed_reads=0, reads_without_progress=0, stuck_seconds=0.0)
    if target.role == "proxy":
        return move(previous, now, "idle", "proxy_models_ok", f"/v1/models lists {len(seen.models)} model(s)",
                    last_served=now, **common)
    # An engine with no /metrics looks idle; only the canary can show it cannot serve.
    if previous.canary_failures >= target.canary.failures_before_unresponsive:
        return move(previous, now, "unresponsive", "canary_failed",
                    f"{previous.canary_failures} canaries in a row failed", **common)
    if previous.canary_rejected is not None:
        return move(previous, now, "idle", "canary_rejected", _rejected_detail(previous.canary_rejected), **common)
    return move(previous, now, "idle", "models_ok", f"/v1/models lists {len(seen.models)} model(s)", **common)


def _on_snapshot(previous: Verdict, snap: PageReading, now: float, target: TargetSettings, comparison: Comparison,
                 canary_overlap: bool = False, paused: bool | None = None) -> Verdict:
    if comparison.backwards is not None:
        # Same lifetime, yet a counter fell: the page is not one process's counters (a proxy
        # mixing backends, a broken exporter). Re-base on it so one bad read stays one.
        return on_error(previous, PollError(
            "bad_metrics", f"counter {comparison.backwards} went backwards in the same process lifetime"),
            now, target, snapshot=snap, snapshot_at=now)
    restarted = comparison.restarted
    # Counters are compared only within one lifetime; the first read of a lifetime compares nothing.
    same_life = previous.snapshot if not restarted else None
    moved = same_life is not None and comparison.progressed
    if moved and same_life is not None and snap.unjudged is not None and not snap.pending:
        # An unjudged model's counters move as its requests go in, not as its responses go out
        # (exporter/decoupled.py): its own series moving is no progress on an idle-looking read.
        moved = moved_beside(same_life, snap, snap.unjudged.unit)
    changes = _good_read(previous, snap, now, comparison, same_life is not None)
    load = snap.load

    if restarted:
        # A new process: `starting` until a read of its own shows it servable. `started` is the
        # process's, not the target's (a restarted container's startup probe waits for it again).
        # Canary failures and served evidence were about the old process, not this one: an idle
        # restarted server is ready once its own canary answers (sent once a second read shows it idle).
        changes.update(started=False, canary_failures=0, last_served=None, canary_rejected=None, last_progress=now,
                       reads_without_progress=0, stuck_seconds=0.0, operation_since=None)
        detail = f"process restarted (restart #{changes['restarts']}); {load}; judged from the next read of this process"
        return move_with(previous, now, "starting", "restart", detail, changes)

    if moved:
        changes.update(last_progress=now, last_served=now, reads_without_progress=0, stuck_seconds=0.0,
                       canary_failures=0)
    elif not snap.pending or same_life is None:
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
            return move_with(previous, now, "asleep", "asleep", f"{asleep}; {load}", changes)
        # Work pending on a sleeping engine is owed (a wake-up that hangs with requests queued): it
        # is judged as any pending work, so nothing moving for stuck_after is `stuck`, never `asleep`.
        load = f"{load}; {asleep}"

    if not snap.pending:
        return _on_quiet(previous, snap, now, target, same_life, moved, canary_overlap, load, changes)
    return _on_pending(previous, snap, now, target, moved, same_life is not None, load, changes)


def _good_read(previous: Verdict, snap: PageReading, now: float, comparison: Comparison, same_life: bool) -> dict[str, Any]:
    """What every good read sets: the reading, its rates against the last one of this lifetime, the units' clocks."""
    elapsed = now - previous.snapshot_at if same_life and previous.snapshot_at is not None else 0.0
    restarted = comparison.restarted
    # A dict display, not dict(...) with keywords: they would be gathered into one dict, then copied.
    return {
        "up": True, "started": True, "error_reason": None, "snapshot": snap, "snapshot_at": now, "last_good_read": now,
        "failed_reads": 0, "restarts": previous.restarts + (1 if restarted else 0),
        "last_restart_at": now if restarted else previous.last_restart_at,
        "steps_per_second": _per_second(comparison.steps_grew, elapsed),
        "generation_tokens_per_second": _per_second(comparison.generation_tokens_grew, elapsed),
        "unit": None, "unit_clocks": _unit_clocks(previous, snap, comparison.unit_resets, now) if snap.units else (),
    }


def _per_second(grew: float | None, elapsed: float) -> float | None:
    return grew / elapsed if grew is not None and elapsed > 0 else None


def _unit_clocks(previous: Verdict, snap: PageReading, resets: tuple[bool, ...], now: float) -> tuple[tuple[str, float, int], ...]:
    """Each unit's stuck clock after this read: (name, its last progress, its reads without progress).

    A unit's clock runs while it has work pending and none of its own signals moves, as the
    target's does over the sums (`resets`: the clocks that start again, Comparison.unit_resets).
    """
    clocks = {name: (since, reads) for name, since, reads in previous.unit_clocks}
    start = previous.snapshot_at if previous.snapshot_at is not None else now
    out = []
    for unit, reset in zip(snap.units, resets, strict=True):
        if reset:
            out.append((unit.name, now, 0))
        else:
            since, reads = clocks.get(unit.name, (start, 0))
            out.append((unit.name, since, reads + 1))
    return tuple(out)


def _on_quiet(previous: Verdict, snap: PageReading, now: float, target: TargetSettings, same_life: PageReading | None,
              moved: bool, canary_overlap: bool, load: str, changes: dict[str, Any]) -> Verdict:
    """A read with nothing pending: starting, busy (work flowed since the last read), unresponsive or idle."""
    if same_life is None:
        # The first read of this process: nothing to compare with, so no interval seen quiet yet.
        return move_with(previous, now, "starting", "startup",
                         f"{load} on the first read; idle once a second read shows nothing moved", changes)
    # Counters the exporter's own canary moved on an idle server are not work.
    own_canary = canary_overlap and previous.state in ("idle", "unresponsive") and not same_life.pending
    if moved and not own_canary:
        # Work flowed since the last read, though nothing is pending at this instant (vLLM's API
        # server may feed its engine one request at a time): busy, and no canary.
        return move_with(previous, now, "busy", "progress",
                         f"{load} at this read, but engine signals moved since the last one", changes)
    if same_life.pending:
        return move_with(previous, now, "busy", "waiting_for_progress",
                         f"{load} now, with work pending at the last read; idle once a whole interval is quiet",
                         changes)
    failures = previous.canary_failures if not moved else 0
    if failures >= target.canary.failures_before_unresponsive and snap.unjudged is None:
        return move_with(previous, now, "unresponsive", "canary_failed",
                         f"idle-looking, but {failures} canaries in a row failed", changes)
    if previous.canary_rejected is not None:
        return move_with(previous, now, "idle", "canary_rejected", _rejected_detail(previous.canary_rejected), changes)
    if snap.unjudged is not None:
        # Nothing pending and nothing moving says nothing about a model no signal follows: not
        # idle by evidence, and its canary may wait behind streams no counter shows.
        changes.update(unit=snap.unjudged.unit)
        return move_with(previous, now, "idle", "unjudgeable", _unjudged_detail(snap.unjudged.why, failures), changes)
    return move_with(previous, now, "idle", "idle", "nothing running or waiting, and nothing moved since the last read",
                     changes)



def _on_pending(previous: Verdict, snap: PageReading, now: float, target: TargetSettings, moved: bool, comparable: bool,
                load: str, changes: dict[str, Any]) -> Verdict:
    """A read with work pending: busy while it moves, stuck or waiting on a peer once nothing moved for stuck_after."""
    clocks = changes["unit_clocks"]
    worst = worst_unit(snap, clocks, now, target) if clocks else None
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
            if on_peer(snap.running, snap.deferred) and (worst is None or worst[0] != "stuck"):
                changes.update(unit=worst[1].name if worst else None)
                return move_with(previous, now, "waiting_on_peer", "waiting_on_peer",
                                 f"{load}; nothing moved for {stuck_for:.1f}s over {reads} reads, with nothing running "
                                 f"and {snap.deferred:g} request(s) the engine deferred (KV transfer, a peer): "
                                 f"a restart of this server does not fix its peer", changes)
            changes.update(unit=worst[1].name if worst else None)
            longest = f"; stuck longest: unit {worst[1].name}" if worst else ""
            return move_with(previous, now, "stuck", "no_progress",
                             f"{load}; no engine signal moved for {stuck_for:.1f}s over {reads} reads{longest}", changes)
        state, reason = "busy", "waiting_for_progress"
        detail = f"{load}; nothing moved for {stuck_for:.1f}s ({reads} read(s))"

    if worst is not None:
        # One unit hung beside others that move: the target is as bad as its worst unit, on that
        # unit's own clock (liveness and stuck_seconds count from its last progress).
        unit_state, unit, since, reads = worst
        stuck_for = now - since
        changes.update(unit=unit.name, last_progress=since, reads_without_progress=reads, stuck_seconds=stuck_for)
        if unit_state == "stuck":
            return move_with(previous, now, "stuck", "no_progress",
                             f"unit {unit.name} stuck: {unit_load(unit)}, and none of its own signals moved for "
                             f"{stuck_for:.1f}s over {reads} reads (the whole server: {load})", changes)
        return move_with(previous, now, "waiting_on_peer", "waiting_on_peer",
                         f"unit {unit.name} waiting on a peer: {unit_load(unit)}, nothing running and nothing of its "
                         f"own moved for {stuck_for:.1f}s over {reads} reads (the whole server: {load})", changes)
    return move_with(previous, now, state, reason, detail, changes)


def _on_purpose(previous: Verdict, snap: PageReading, now: float, target: TargetSettings, moved: bool,
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
    ops = snap.in_flight
    since = (previous.operation_since if previous.operation_since is not None else now) if ops else None
    changes.update(operation_since=since)
    load = snap.load
    if ops and since is not None and now - since >= target.pause_budget:
        wedged_at = since + target.pause_budget
        changes.update(last_progress=wedged_at, stuck_seconds=now - wedged_at,
                       reads_without_progress=previous.reads_without_progress + 1)
        return move_with(previous, now, "stuck", "operation_stuck",
                         f"{', '.join(ops)} still in flight after {now - since:.1f}s, past pause_budget "
                         f"{target.pause_budget:g}s: the engine is wedged inside it; {load}", changes)
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
    return move_with(previous, now, "paused", reason, f"{why}; {load}: paused on purpose, not stuck{over}", changes)


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
