"""How one read is carried out: its I/O steps in order (`observe`, a generator that yields each
request and receives its answer), its deadline, its second probe, the exporter's own lateness and
when the health route is asked beside the page. Pure: the poller does the I/O; plan.py's `read`
drives this and concludes (the verdict, the pause ask, the canary)."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

from llm_vitals.exporter.engines import PageReading
from llm_vitals.exporter.verdict.compare import Comparison, compare
from llm_vitals.exporter.verdict.model import Observation, PollError, Verdict

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


# -- the read's steps, as the requests it makes of the poller ----------------------------------
# Plain data: the poller carries each out and sends back its answer (the sans-I/O shape of h11).
# Requests are dataclasses, never tuples: two requests of one shape (a deadline) must not compare equal.


@dataclass(frozen=True, slots=True)
class ReadPage:
    """Read the target's page (or, for an engine judged by its model list, that list) within `deadline`.

    Answered with what it saw (a PageReading or ModelsOk) or with how it failed (`Failed`).
    """

    deadline: float


class Failed(NamedTuple):
    """A read that failed, as the poller saw it."""

    error: PollError
    loop_lag: float | None  # the exporter's event loop's worst lag since the read began (None: not known)
    timeout: float  # the failed request's own
    metrics: bool = False  # the /metrics read itself (only its failure may call for a second probe)


@dataclass(frozen=True, slots=True)
class AskHealth:
    """Ask the engine's health routes: answered with the first (path, 503), else the last (path, status), or None."""


@dataclass(frozen=True, slots=True)
class AskReady:
    """Ask the model's ready route, where the engine has one: answered with None (ready, or no route) or `Failed`."""


@dataclass(frozen=True, slots=True)
class SecondProbe:
    """One more request after a /metrics read that connected and got no answer, within `deadline`: answered with `Probed`."""

    deadline: float


class Probed(NamedTuple):
    """What the second probe got at `path`: its HTTP status, or its own failure."""

    path: str
    answer: int | PollError
    loop_lag: float | None  # the loop's worst lag during the probe (None: not known)
    health_route: bool  # `path` is a health route (its 503 is the engine's word that it is dead)


ASK_HEALTH = AskHealth()
ASK_READY = AskReady()
Step = ReadPage | AskHealth | AskReady | SecondProbe
Seen = tuple[Observation, tuple[str, int] | None, Comparison | None]


def observe(previous: Verdict, metrics_timeout: float) -> Generator[Step, Any, Seen]:
    """One read's I/O steps after the verdict `previous`, in order; returns what it saw: the observation
    (a PageReading, the model list, or a PollError as judged), the health route's answer when asked,
    and the page's one comparison with the last good read (`compare`), which `judge` takes as it is.

    The page first, within `read_deadline`; beside a page, the health route when `health_check_due`;
    then, with nothing pending, the model's ready route (a Triton page is up before its model is
    loaded), whose failure is the read's. A failure is judged for the exporter's lateness, and a
    /metrics read that connected and got no answer gets a second probe (`_failure`).
    """
    deadline = read_deadline(previous, metrics_timeout)
    seen = yield ReadPage(deadline)
    if isinstance(seen, Failed):
        return (yield from _failure(seen, deadline)), None, None
    if not isinstance(seen, PageReading):
        return seen, None, None  # the model list: no page to compare, no health route beside it
    comparison = compare(previous, seen)
    health = (yield ASK_HEALTH) if health_check_due(previous, seen, comparison) else None
    if not seen.pending:
        ready = yield ASK_READY
        if ready is not None:
            return (yield from _failure(ready, deadline)), None, None
    return seen, health, comparison


def _failure(failed: Failed, deadline: float) -> Generator[Step, Any, PollError]:
    """A failed read as judged: `exporter_late` given the loop's lag, then, where `second_probe_due`
    (only the /metrics read), with what one more request within the read's own `deadline` saw."""
    error = failed.error
    if failed.loop_lag is not None:
        error = exporter_late(error, failed.loop_lag, failed.timeout)
    if not (failed.metrics and second_probe_due(error)):
        return error
    probed: Probed = yield SecondProbe(deadline)
    answer = probed.answer
    if isinstance(answer, PollError) and probed.loop_lag is not None:
        answer = exporter_late(answer, probed.loop_lag, deadline)  # judged as the read was
    return with_second_probe(error, probed.path, answer, health_route=probed.health_route)
