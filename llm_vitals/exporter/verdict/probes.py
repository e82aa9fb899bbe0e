"""What the probes and the fleet gate read off a verdict: started, ready, live, draining, recently
unhealthy, paused too long. Pure."""

from __future__ import annotations

from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict.model import Verdict
from llm_vitals.targets import NOT_READY_STATES, UNHEALTHY_STATES


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


def pause_exceeded(verdict: Verdict, target: TargetSettings, now: float) -> bool:
    """Paused for longer than the target's `pause_budget`: LLMServerPausedTooLong pages; never a restart."""
    return verdict.state == "paused" and now - verdict.since > target.pause_budget


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

    With the remediator's gate (exporter/backstop_rule.py): never while the backstop is `holding`, and the
    budget counts from the end of the last hold (`held_at`) too, so the remediator, whose alert fires
    on the same stuck server, has the first go once a hold ends."""
    if verdict.state != "stuck" or verdict.last_progress is None or holding:
        return True
    since = verdict.last_progress if held_at is None else max(verdict.last_progress, held_at)
    return now - since <= target.liveness
