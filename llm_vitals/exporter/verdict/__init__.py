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

The package, one job a module, each importing only those below it:
- `plan`: one read, driven (`read`: a generator yielding each request, returning the `Conclusion`), and what follows its verdict;
- `judge`: the verdict of a read that saw a page or the model list, and of a canary's answer;
- `unread`: the verdict of a read that failed (missed, slow, frozen, late, gone);
- `reads`: the read's I/O steps (`observe`) and their rules (deadline, second probe, lateness, when to ask health);
- `probes`: what the probes and the fleet gate read off a verdict;
- `compare`: two readings of one server compared, once per read (`Comparison`: moved, restarted, units);
- `model`: what a poll saw, the Verdict, and `move`.
"""

from __future__ import annotations

from llm_vitals.exporter.verdict.compare import Comparison, compare, progressed, same_lifetime, saturated, went_backwards
from llm_vitals.exporter.verdict.judge import judge, record_canary
from llm_vitals.exporter.verdict.model import (
    SLEEP_LEVEL_WORDS,
    CanaryOutcome,
    ModelsOk,
    Observation,
    PollError,
    Verdict,
    initial,
)
from llm_vitals.exporter.verdict.plan import (
    ASK_NOW,
    AskNow,
    Conclusion,
    Moment,
    canary_due,
    canary_overlapped,
    conclude,
    follow_ups,
    pause_ask_due,
    read,
)
from llm_vitals.exporter.verdict.probes import (
    drain_holds,
    is_live,
    is_ready,
    is_started,
    pause_exceeded,
    recently_unhealthy,
)
from llm_vitals.exporter.verdict.reads import (
    ASK_HEALTH,
    ASK_READY,
    LATE_SHARE,
    SLOW_READ_FACTOR,
    AskHealth,
    AskReady,
    Failed,
    Probed,
    ReadPage,
    SecondProbe,
    exporter_late,
    health_check_due,
    read_deadline,
    second_probe_due,
    with_second_probe,
)
from llm_vitals.exporter.verdict.unread import DOWN_AT_ONCE, SLOW_READS_HELD
from llm_vitals.targets import NOT_READY_STATES, STATES, UNHEALTHY_STATES

__all__ = [  # the verdict's public names, wherever in the package they live
    "ASK_HEALTH", "ASK_NOW", "ASK_READY", "DOWN_AT_ONCE", "LATE_SHARE", "NOT_READY_STATES", "SLEEP_LEVEL_WORDS",
    "SLOW_READS_HELD", "SLOW_READ_FACTOR", "STATES", "UNHEALTHY_STATES", "AskHealth", "AskNow", "AskReady", "CanaryOutcome",
    "Comparison", "Conclusion", "Failed", "ModelsOk", "Moment", "Observation", "PollError", "Probed", "ReadPage",
    "SecondProbe", "Verdict", "canary_due", "canary_overlapped", "compare", "conclude", "drain_holds", "exporter_late",
    "follow_ups", "health_check_due", "initial", "is_live", "is_ready", "is_started", "judge", "pause_ask_due",
    "pause_exceeded", "progressed", "read", "read_deadline", "recently_unhealthy", "record_canary", "same_lifetime",
    "saturated", "second_probe_due", "went_backwards", "with_second_probe",
]
