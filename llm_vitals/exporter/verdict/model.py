"""What a verdict is made of: what one poll saw (a page, the model list, or a failed read), the
verdict itself, and the one way a verdict moves to a new state (`move`). Pure data, no rule."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from llm_vitals.exporter.engines import PageReading
from llm_vitals.targets import UNHEALTHY_STATES, PollErrorReason, Reason, State

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


Observation = PageReading | PollError | ModelsOk


# Not slots, unlike the other records here: a verdict held in its __dict__ moves (`move`) by one dict
# merge, in C, where 32 slots took one Python call each (see `_replaced`).
@dataclass(frozen=True)
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
    snapshot: PageReading | None = None  # last good reading, in the current process lifetime
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
    # When the engine operations now in flight (a weight update, a wake-up: PageReading.operations)
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


def move(previous: Verdict, now: float, state: State, reason: Reason, detail: str, **changes: Any) -> Verdict:
    """The verdict moved to `state` at `now` (its `since` kept in the same state), with `changes` set."""
    return move_with(previous, now, state, reason, detail, changes)


def move_with(previous: Verdict, now: float, state: State, reason: Reason, detail: str, changes: dict[str, Any]) -> Verdict:
    """`move`, its changes given as a dict that it takes over (and changes): the caller's own, built for this move.

    judge builds some 20 changes a read in one dict; passed as `**changes` they were spread into keywords
    and gathered into a new dict again, each name checked against the parameters' (19,800 instructions
    a read of the backtest, callgrind: a tenth of it)."""
    changes.setdefault("last_poll", now)
    changes["state"], changes["reason"], changes["detail"] = state, reason, detail
    changes["since"] = previous.since if state == previous.state else now
    changes["last_unhealthy_at"] = now if state in UNHEALTHY_STATES else previous.last_unhealthy_at
    return _replaced(previous, changes)


# What `move` needs of dataclasses.replace, for the one class it moves. Every poll moves its target's
# verdict (32 fields): replace looks each field's kind up again and calls the frozen __init__, which
# sets each field through object.__setattr__, and setting 32 slots one call each still took 4.0 us a
# move; the previous verdict's __dict__ merged with the changes takes 1.2 us (timeit). A move took
# 90,000 instructions with replace, 47,600 with the slots (callgrind, the backtest's reads).
_NAMES = frozenset(field.name for field in fields(Verdict))
_new = object.__new__
_set = object.__setattr__


def _replaced(previous: Verdict, changes: dict[str, Any]) -> Verdict:
    """`dataclasses.replace(previous, **changes)`, the same Verdict (it has no __post_init__), made quicker."""
    if not changes.keys() <= _NAMES:
        unknown = min(changes.keys() - _NAMES)
        raise TypeError(f"Verdict has no field {unknown!r}")  # as replace would say
    verdict = _new(Verdict)
    _set(verdict, "__dict__", previous.__dict__ | changes)
    return verdict
