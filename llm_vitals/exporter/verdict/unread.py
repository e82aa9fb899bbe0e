"""The verdict of a poll that read no page (docs/states.md, "partial evidence"): a missed read, a
slow page, a frozen server, the exporter's own lateness, or a server gone. Pure."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llm_vitals.exporter.engines import EngineFacts
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict.compare import saturated
from llm_vitals.exporter.verdict.model import PollError, Verdict, move
from llm_vitals.exporter.verdict.reads import SLOW_READ_FACTOR
from llm_vitals.targets import State


def unslowed(verdict: Verdict) -> Verdict:
    # Slow is what the last read showed: any other answer (a page, or another failure) ends it.
    return replace(verdict, slow=False) if verdict.slow else verdict


# Errors that are the server's own word, not a read that went missing: `down` at once.
# A refused connection is the kernel's word that no process listens (a frozen one still accepts).
DOWN_AT_ONCE: frozenset[str] = frozenset({"health_503", "refused"})


def on_error(previous: Verdict, error: PollError, now: float, target: TargetSettings, **changes: Any) -> Verdict:
    failed = previous.failed_reads + 1
    if not previous.started and now - previous.first_seen < target.startup_grace:
        return move(previous, now, "starting", "startup", f"not servable yet ({error.reason}: {error.detail})",
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
        return move(
            previous, now, "down", error.reason, detail,
            up=False, error_reason=error.reason, failed_reads=failed, reads_without_progress=0, last_progress=now,
            stuck_seconds=0.0, steps_per_second=None, generation_tokens_per_second=None, **changes,
        )
    # A missed read: no evidence either way. The state, the last good reading and the stuck clock
    # stay, so the next good page is compared with the last good one and a stuck episode stays stuck.
    detail = (f"{held_detail(previous, now)}; read failed ({error.reason}: {error.detail}): {failed} in a row, "
              f"no good read for {unread_for:.1f}s, down after {target.down_after:g}s")
    return move(previous, now, previous.state, previous.reason, detail, up=False, error_reason=error.reason,
                failed_reads=failed, steps_per_second=None, generation_tokens_per_second=None, **changes)


def held_detail(previous: Verdict, now: float) -> str:
    """What the held verdict rests on, for the detail of a poll that read nothing."""
    if previous.state == "stuck":
        return f"still stuck: no engine signal moved for {previous.stuck_for(now):.1f}s up to the last good read"
    return f"still {previous.state} ({previous.reason}) from the last good read"


def _on_late(previous: Verdict, error: PollError, now: float) -> Verdict:
    # The exporter's own lateness: counted (poll_errors_total{reason="exporter_late"}) and shown,
    # and nothing else: neither progress, nor a read without progress, nor a failure toward `down`,
    # nor a poll: `last_poll` stays where the last read that was not late left it, so a starved
    # exporter's timestamps go stale and LLMVitalsPollingStale says it is blind.
    return move(previous, now, previous.state, previous.reason, f"{held_detail(previous, now)}; {error.detail}",
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
    detail = (f"{held_detail(previous, now)}; slow: {error.detail}, while a second probe answered "
              f"(no good read for {now - last_good:.1f}s; the next read waits {SLOW_READ_FACTOR:g} times longer)")
    return move(previous, now, previous.state, previous.reason, detail, up=False, error_reason=error.reason,
                failed_reads=previous.failed_reads + 1, steps_per_second=None, generation_tokens_per_second=None,
                slow=True, last_answered=now)


def _unanswered_while_pending(previous: Verdict, error: PollError) -> bool:
    # `timeout` is a /metrics read that connected and got no answer in time (a refused connection
    # is `refused`, a connect that timed out `connect`); "pending" is what the last good read
    # showed, as long as every poll since then was pending or unanswered: a `down` in between
    # breaks the chain, and so does a refused connection or any other failure just before.
    return (error.reason == "timeout" and previous.snapshot is not None and previous.snapshot.pending
            and previous.state in ("busy", "stuck") and _frozen_chain(previous))


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
        detail = (f"{held_detail(previous, now)}; /metrics accepted the connection and never answered ({error.detail}), "
                  f"nor did a second probe: frozen if it lasts {target.down_after:g}s "
                  f"(no good read for {unread_for:.1f}s)")
        return move(previous, now, previous.state, previous.reason, detail, up=False, error_reason=error.reason,
                    failed_reads=failed, steps_per_second=None, generation_tokens_per_second=None)
    owed = "while work was pending" if previous.snapshot is not None and previous.snapshot.pending else (
        "after an idle read")
    if starved and previous.snapshot is not None:
        owed = (f"after a saturated read ({previous.snapshot.load}: the reads may wait behind the clients' "
                f"own requests; stuck once nothing moved for {target.stuck_after:g}s)")
    detail = (f"/metrics accepted the connection and never answered ({error.detail}) {owed}; "
              f"no good read for {unread_for:.1f}s over {failed} read(s), no progress seen for {stuck_for:.1f}s")
    return move(previous, now, state, "metrics_unanswered", detail, up=False, error_reason=error.reason,
                failed_reads=failed, reads_without_progress=reads, last_progress=last_progress,
                stuck_seconds=stuck_for, steps_per_second=None, generation_tokens_per_second=None)


def on_failure(previous: Verdict, error: PollError, now: float, target: TargetSettings, facts: EngineFacts) -> Verdict:
    """The verdict after a poll whose read failed with `error` (judge's rule for every PollError)."""
    if error.reason == "exporter_late":
        return _on_late(previous, error, now)
    if error.reason == "timeout" and error.ready_route:
        # The page came in this very poll: the server answers, and only its model's readiness is
        # unknown (its HTTP threads slow under load). Held: no canary, no evidence toward down,
        # and never the unanswered page of a frozen server.
        return unslowed(on_error(replace(previous, last_answered=now), error, now, target))
    if error.reason == "timeout":
        # An engine whose own loop answers /metrics (llama.cpp, Triton's metrics threads) is not
        # slow because of load, and its health route may answer while that loop is wedged: its
        # unanswered page is frozen evidence by itself, once it has had the longer deadline
        # when a second probe answered (a page that arrives late still arrives).
        unanswered = error.probe == "unanswered" or (
            facts.metrics_unanswered_is_stuck and (error.probe is None or previous.slow))
        # A server last seen saturated may have given every HTTP thread to its own clients, on
        # any engine: its silence is judged as work owed, never as frozen after down_after.
        starved = unanswered and _unanswered_while_saturated(previous, error)
        pending = starved or (unanswered and facts.metrics_unanswered_is_stuck
                              and _unanswered_while_pending(previous, error))
        if pending or (unanswered and _frozen_chain(previous)):
            return _on_unanswered(previous, error, now, target, pending=pending, starved=starved)
        if error.probe == "answered":
            if _slow_but_reading(previous):
                return _on_slow(previous, error, now)
            # Not (or no longer) a slow page but a failed read; the server answers elsewhere,
            # so its next read still gets the longer deadline.
            return replace(on_error(previous, error, now, target), slow=True)
    return unslowed(on_error(previous, error, now, target))
