"""Two reads of one server compared: did its work move, did it start again, which of its units is
stuck. Pure, on the engines' readings alone (llm_vitals/exporter/engines/)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from llm_vitals.exporter.engines import PageReading, Unit

if TYPE_CHECKING:
    from llm_vitals.exporter.settings import TargetSettings
    from llm_vitals.exporter.verdict.model import Verdict
    from llm_vitals.targets import State

def progressed(before: PageReading, after: PageReading) -> bool:
    """True when any of the engine's named work signals moved between two reads of one process lifetime.

    A counter moves when it grew, a gauge when it changed. Only signals both reads carry are
    compared: a series that appeared or went away (a Triton model loaded or unloaded) is not movement,
    nor is a series that started again from 0 (the model reloaded).
    """
    old_counters = before.monotone
    for name, new in after.monotone.items():
        old = old_counters.get(name)
        if old is not None and new is not None and new > old:
            return True
    old_gauges = before.gauges
    for name, new in after.gauges.items():
        old = old_gauges.get(name)
        if old is not None and new is not None and old != new:
            return True
    return False


def went_backwards(before: PageReading, after: PageReading, *, gap: bool = False) -> str | None:
    """Name of a monotone counter that shows the process started again, or None.

    A counter that fell, or a fresh page: every counter the earlier read had is gone (TGI shows a
    family only once it is first touched, so its new process has none). A counter only one read has
    is no reset by itself. `gap`: reads failed between the two (the server was away).

    Per series (PageReading.series, named `unit|family`), a series falling is its unit (a Triton model)
    started again, and the process restarted only when every unit both reads carry did (a failure
    counter growing meanwhile is no series, so it hides nothing). A unit that had counted nothing
    cannot show a reset: with one on both pages and no gap, the fall is a reload, not a restart.
    """
    if before.series and after.series:
        return _series_reset(before.series, after.series, gap)
    old_counters = before.monotone
    new_counters = after.monotone
    for name, new in new_counters.items():
        old = old_counters.get(name)
        if old is not None and new is not None and new < old:
            return name
    # Gone only if every counter the earlier read had is gone: one still on the page ends the look
    # (at once on a busy read, with no list of them built each poll).
    first = None
    for name, old in old_counters.items():
        if old is not None:
            if new_counters.get(name) is not None:
                return None
            if first is None:
                first = name
    return f"{first} (gone from the page)" if first is not None else None


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


def same_lifetime(before: PageReading, after: PageReading) -> bool | None:
    """True/False when the two reads say which process they come from, None when only counters can tell.

    An opaque restart token (llama.cpp's header) wins over a start time; either is compared for
    inequality only, so a token that is not a time (monotonic microseconds) is never misread.
    """
    if before.restart_token is not None and after.restart_token is not None:
        return before.restart_token == after.restart_token
    if before.process_start_time is not None and after.process_start_time is not None:
        return before.process_start_time == after.process_start_time
    return None


class Comparison(NamedTuple):
    """A read's page against the verdict's last good one, worked out once per read (`compare`): the
    health-check decision (reads.health_check_due) and `judge` both take it as it is. A NamedTuple, as
    `Unit` is: made at every poll, and a frozen dataclass's __init__ cost four times as much (callgrind)."""

    # A new process: its start time or restart token changed, or (neither on the page) a monotone
    # counter fell or every one went (went_backwards, with the gap of failed reads in between).
    restarted: bool
    # A counter that fell although the start time says one lifetime: the page is no one process's counters.
    backwards: str | None
    # Any work signal moved since the last read (progressed), whatever the lifetimes (False: no last read).
    progressed: bool
    # A unit with work pending and none of its own signals moved since the last read.
    unit_stalled: bool
    # What steps and generated tokens grew by within this lifetime (None: no earlier read of it, a
    # signal missing, or a sum that fell because a series went: no rate, never a negative one).
    steps_grew: float | None
    generation_tokens_grew: float | None
    # For each unit of the page, in order: whether its stuck clock starts again at this read (no
    # earlier read of it in this lifetime, nothing pending, or it moved or started again).
    unit_resets: tuple[bool, ...]


def compare(previous: Verdict, snap: PageReading) -> Comparison:
    """`snap` against `previous.snapshot`, the last good read (failed reads in between: `previous.failed_reads`)."""
    base = previous.snapshot
    if base is None:
        return Comparison(False, None, False, False, None, None, (True,) * len(snap.units))
    lifetime = same_lifetime(base, snap)
    backwards = None
    if lifetime is None:
        # No start time nor token (e.g. --api-server-count > 1, SGLang, Triton, TGI): a monotone
        # counter that fell, or a fresh page, is a restart; reads that failed in between (the
        # server was away) let a model that counted nothing show no reset (Triton).
        restarted = went_backwards(base, snap, gap=previous.failed_reads > 0) is not None
    else:
        restarted = not lifetime
        if lifetime:
            backwards = went_backwards(base, snap)
    stalled = False
    resets = []
    for unit, old in unit_pairs(base, snap) if snap.units else ():
        moved = old is not None and unit_moved(old, unit)
        stalled = stalled or (unit.pending and old is not None and not moved)
        resets.append(restarted or old is None or not unit.pending or moved or unit_restarted(old, unit))
    same_life = not restarted
    return Comparison(
        restarted, backwards, progressed(base, snap), stalled,
        _grew(base.steps, snap.steps) if same_life else None,
        _grew(base.generation_tokens, snap.generation_tokens) if same_life else None,
        tuple(resets))


def _grew(before: float | None, after: float | None) -> float | None:
    # A sum that fell within one lifetime lost a series (a Triton model unloaded): no growth.
    return None if before is None or after is None or after < before else after - before


def saturated(snap: PageReading | None) -> bool:
    """Work queued behind running work: every slot busy and requests waiting for one (llama.cpp's
    `requests_deferred`, vLLM's waiting queue), as one read shows it.

    Such a server's own clients may hold every thread of its HTTP front (llama-server gives each
    in-flight request one of its `--threads-http`), so a read that waits behind them is no sign
    that it froze. A server whose running requests hold every thread with none queued (threads at
    or below its slots) cannot be told apart from a frozen one by its page: it is not saturated here.
    """
    return snap is not None and snap.running > 0 and snap.waiting > 0


def unit_pairs(base: PageReading, snap: PageReading) -> list[tuple[Unit, Unit | None]]:
    """Each unit of `snap` with the same unit in `base` (None where `base` did not have it)."""
    before = {unit.name: unit for unit in base.units}
    return [(unit, before.get(unit.name)) for unit in snap.units]


def unit_moved(before: Unit, after: Unit) -> bool:
    """Any of the unit's own counters grew, or a gauge of its own changed."""
    return (any(old is not None and new is not None and new > old for old, new in zip(before.counters, after.counters, strict=False))
            or any(old is not None and new is not None and new != old for old, new in zip(before.gauges, after.gauges, strict=False)))


def unit_restarted(before: Unit, after: Unit) -> bool:
    # A counter of the unit fell: it started again (a Triton model reloaded), a lifetime of its own.
    return any(old is not None and new is not None and new < old for old, new in zip(before.counters, after.counters, strict=False))


def worst_unit(snap: PageReading, clocks: tuple[tuple[str, float, int], ...], now: float,
               target: TargetSettings) -> tuple[State, Unit, float, int] | None:
    """The unit that makes the target `stuck` (first) or `waiting_on_peer`, with its clock; None: none does."""
    worst: tuple[State, Unit, float, int] | None = None
    for unit, (_, since, reads) in zip(snap.units, clocks, strict=True):
        if reads < 2 or now - since < target.stuck_after:
            continue
        state: State = "waiting_on_peer" if on_peer(unit.running, unit.deferred) else "stuck"
        rank = (state == "stuck", now - since)
        if worst is None or rank > (worst[0] == "stuck", now - worst[2]):
            worst = (state, unit, since, reads)
    return worst


def on_peer(running: float, deferred: float) -> bool:
    # Nothing running and work the engine itself deferred (a remote KV transfer, a prefill peer's
    # handshake): what holds it up is outside this server, and a restart of it fixes nothing. The
    # capacity-waiting requests beside them may be held back by the deferred ones' KV blocks.
    return running == 0 and deferred > 0


def unit_load(unit: Unit) -> str:
    text = f"running {unit.running:g}, waiting {unit.waiting:g}"
    return text + (f" ({unit.deferred:g} deferred by the engine)" if unit.deferred else "")


def moved_beside(before: PageReading, after: PageReading, unit: str) -> bool:
    """Whether a signal moved other than `unit`'s own series (`unit`: `model="m"`, its series `model="m",version=...|family`)."""
    if not after.series:
        return progressed(before, after)
    prefix = unit + ","
    old = {name: value for name, value in before.series if not name.startswith(prefix)}
    if any(name in old and value > old[name] for name, value in after.series if not name.startswith(prefix)):
        return True
    old_gauges = before.gauges
    return any(old_gauges.get(name) is not None and new is not None and old_gauges[name] != new
               for name, new in after.gauges.items())
