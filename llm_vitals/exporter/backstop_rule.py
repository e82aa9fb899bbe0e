"""The kubelet's liveness backstop obeys the remediator's gate: what the shim heard, and the pure rule.

A shim (the exporter beside one server, whose `/probe/<t>/live` the kubelet asks) learns the gate's
word for its target's workload from the remediator (GET /api/v1/backstop with the read token; the
word is computed by llm_vitals/remediator/gate_word.py, and read by llm_vitals/backstop_word.py's
`word_in`, the one wire shape). Only one actor may decide a restart:

- `hold`: the remediator holds the workload (paused, paged, circuit open, a restart of it running or
  in cooldown, the fleet gate refused, ...): liveness answers 200 however long the server is stuck;
  readiness and the stuck alert are untouched;
- `act`: liveness fails as it always did, once stuck for `liveness_budget`, counted from the last
  progress *and* from the end of the last hold, so that once a hold ends (a pause lifted, a restart
  done) the remediator's alert gets the first go and the kubelet does not fire at once;
- `armed`: the shim has not heard the remediator for `backstop.after`: the alerting chain is down,
  and the backstop acts as it always did.

Doubt resolves toward `hold` only when the remediator is known to be alive (it answered within
`backstop.after`); without an answer for that long, toward `armed`:

  the remediator answered within `after` ...        mode
    with a readable `act`                           act
    with a readable `hold`                          hold (its reason)
    with an unreadable, contradictory or foreign    hold (`word_unreadable`): the remediator is up
      word, a 4xx/5xx (a wrong token, a lost state)   and its gate refuses what it cannot read either
  no answer within `after` (or never, `after`       armed (`remediator_silent`): nothing holds the
    since the shim started)                           workload, the backstop is all there is

One restart per hang: once the remediator said `restart_in_progress`, the shim holds (that reason)
until it reads the new process (its verdict counts a restart), whatever the word says meanwhile
(the remediator's claim ends when the eviction is accepted, long before the new process serves),
for at most `after`, so a restart that never came (refused, failed) holds no longer than silence.

Times: `heard_at` and `answered_at` are the shim's monotonic clock; a word's `since` is the
remediator's wall clock, only shown.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from llm_vitals.backstop_word import BackstopWord

Mode = Literal["act", "hold", "armed"]
MODES: tuple[Mode, ...] = ("act", "hold", "armed")


@dataclass(frozen=True, slots=True)
class Heard:
    """What the shim heard from the remediator: the last answer of any kind, and the word it carried.

    `word` is None when the last answer could not be read (`unreadable` says why)."""

    answered_at: float | None = None  # monotonic: the remediator's last answer, readable or not
    word: BackstopWord | None = None
    heard_at: float | None = None  # monotonic: when the last readable word came
    unreadable: str | None = None
    held_at: float | None = None  # monotonic: the last instant the backstop was found holding
    # The remediator said `restart_in_progress`: when the shim first heard it, and the restarts its
    # verdict had counted then. Held until a new process is read (at most `after`).
    restart_heard_at: float | None = None
    restarts_then: int = 0
    restart_since: float | None = None  # the word's `since`: a word about the same restart never latches again


@dataclass(frozen=True, slots=True)
class Backstop:
    """The backstop's mode now, with why: what liveness obeys and the gauges and status page show."""

    mode: Mode
    reason: str
    detail: str = ""


def restart_pending(heard: Heard, now: float, after: float, restarts: int) -> bool:
    """The remediator restarted this workload and the shim has not read the new process yet (for at most `after`)."""
    return (heard.restart_heard_at is not None and restarts <= heard.restarts_then
            and now - heard.restart_heard_at <= after)


def heard(previous: Heard, answer: BackstopWord | str | None, now: float, restarts: int = 0, after: float = 0.0) -> Heard:
    """`previous` after an ask at `now`: a word, why an answer was unreadable, or None (no answer at all).
    `restarts`: the restarts the shim's verdict has counted, for `restart_in_progress`."""
    if answer is None:
        return previous
    if isinstance(answer, str):
        return replace(previous, answered_at=now, unreadable=answer)
    if answer.reason == "restart_in_progress" and (previous.restart_heard_at is None
                                                   or answer.since != previous.restart_since):
        # A restart not latched yet. The same restart's word, heard again once its new process was
        # read, must not hold the new process until `after`.
        return replace(previous, answered_at=now, word=answer, heard_at=now, unreadable=None, restart_heard_at=now,
                       restarts_then=restarts, restart_since=answer.since)
    return replace(previous, answered_at=now, word=answer, heard_at=now, unreadable=None)


def backstop(heard: Heard, now: float, after: float, started_at: float, restarts: int = 0) -> Backstop:
    """The backstop's mode at `now` (the table in the module docstring); `restarts`: the verdict's count."""
    last = heard.answered_at
    if last is None or now - last > after:
        since = "since it started" if last is None else f"for {now - last:.0f}s"
        if last is None and now - started_at <= after:
            # Not heard yet, but not for `after` either: a shim that just started holds nothing it
            # never heard, and acts as it always did.
            return Backstop("act", "not_heard_yet", "the remediator has not answered yet")
        return Backstop("armed", "remediator_silent", f"no answer from the remediator {since}: the backstop acts alone")
    if heard.unreadable is not None or heard.word is None:
        return Backstop("hold", "word_unreadable", f"the remediator answers but its word cannot be read: {heard.unreadable}")
    if restart_pending(heard, now, after, restarts):
        return Backstop("hold", "restart_in_progress", "the remediator restarted this workload: held until its new"
                                                       " process is read")
    if heard.word.word == "hold":
        return Backstop("hold", heard.word.reason, heard.word.detail)
    return Backstop("act", "", heard.word.detail)


def held(heard: Heard, now: float, after: float, started_at: float, restarts: int = 0) -> Heard:
    """`heard` with `held_at` at the last instant up to `now` the backstop held: call it before taking a
    new answer in, so that a hold that an `act` ends, ends at the instant that answer came."""
    at = last_held(heard, now, after, started_at, restarts)
    return heard if at == heard.held_at else replace(heard, held_at=at)


def last_held(heard: Heard, now: float, after: float, started_at: float, restarts: int = 0) -> float | None:
    """The last instant up to `now` the backstop held (None: never): what the liveness budget counts from.

    A hold that ended because the remediator fell silent ended `after` past its last answer."""
    if backstop(heard, now, after, started_at, restarts).mode == "hold":
        return now
    meant_hold = heard.unreadable is not None or (heard.word is not None and heard.word.word == "hold")
    ended = heard.answered_at + after if meant_hold and heard.answered_at is not None else None
    candidates = [t for t in (heard.held_at, ended) if t is not None and t <= now]
    return max(candidates) if candidates else None
