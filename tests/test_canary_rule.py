"""The canary rule (`verdict.canary_due`), as a table: never canary a busy server, and not too often."""

from __future__ import annotations

import pytest

from llm_vitals.exporter.engines import PageReading
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import ModelsOk, Observation, PollError, canary_due, initial, judge

T0 = 1000.0
POLL = 5.0
IDLE = PageReading(running=0, waiting=0)
BUSY = PageReading(running=1, waiting=0)
QUEUED = PageReading(running=0, waiting=3)


def target(**overrides: object) -> TargetSettings:
    config: dict[str, object] = {"name": "gpu-a", "url": "http://127.0.0.1:9", "canary": {"interval": 30}}
    config.update(overrides)
    return TargetSettings.model_validate(config)


# (case id, observation, seconds since the last canary (None: never sent), target overrides, in flight, due)
CASES: list[tuple[str, Observation, float | None, dict[str, object], bool, bool]] = [
    ("interval 30 s, poll 5 s: not before 30 - 5/2", IDLE, 27.4, {}, False, False),
    ("from half a poll early, so the gaps average the interval", IDLE, 27.5, {}, False, True),
    ("overdue and idle", IDLE, 31.0, {}, False, True),
    ("never to a server with work running, however overdue", BUSY, 45.0, {}, False, False),
    ("never to a server with work waiting", QUEUED, 45.0, {}, False, False),
    ("the first canary goes at once", IDLE, None, {}, False, True),
    ("one at a time", IDLE, None, {}, True, False),
    ("canary disabled", IDLE, None, {"canary": {"enabled": False}}, False, False),
    ("never to a proxy", ModelsOk(("m",)), None, {"role": "proxy"}, False, False),
    ("an openai engine is judged by its models answer", ModelsOk(("m",)), None, {"engine": "openai"}, False, True),
    ("not on a failed poll", PollError("connect", "refused"), None, {}, False, False),
    ("a vllm target's models answer is no load reading", ModelsOk(("m",)), None, {}, False, False),
    # A request to a sleeping vLLM has crashed it (vLLM issue #15483): it sleeps on purpose, unprobed.
    ("never to a sleeping engine, however overdue", PageReading(running=0, waiting=0, sleep_level=1), 600.0, {}, False,
     False),
]


@pytest.mark.parametrize("observation, since_last, overrides, in_flight, due", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_canary_due(observation: Observation, since_last: float | None, overrides: dict[str, object],
                    in_flight: bool, due: bool) -> None:
    settings = target(**overrides)
    # Two reads of the same thing: an idle server is one seen quiet for a whole interval.
    verdict = judge(judge(initial(T0 - 60), observation, T0 + 55, settings), observation, T0 + 60, settings)
    last_sent = None if since_last is None else T0 + 60 - since_last
    assert canary_due(verdict, observation, last_sent, T0 + 60, settings, poll_interval=POLL, in_flight=in_flight) is due


def test_a_restarted_process_gets_its_canary_at_its_first_quiet_interval_even_within_the_interval() -> None:
    settings = target()
    old = PageReading(running=0, waiting=0, steps=5, process_start_time=900.0)
    first = judge(judge(None, old, T0 - 5, settings), old, T0, settings)
    assert canary_due(first, old, T0 - 1, T0, settings, poll_interval=POLL) is False
    new = PageReading(running=0, waiting=0, steps=0, process_start_time=1004.0)
    restarted = judge(first, new, T0 + 5, settings)
    assert restarted.reason == "restart"
    assert canary_due(restarted, new, T0 - 1, T0 + 5, settings, poll_interval=POLL) is False  # no quiet interval yet
    quiet = judge(restarted, new, T0 + 10, settings)
    assert canary_due(quiet, new, T0 - 1, T0 + 10, settings, poll_interval=POLL) is True
    # A busy restart read sends none, nor the read whose counters moved; the next quiet one does,
    # the old canary being the old process's.
    busy = judge(first, PageReading(running=2, waiting=0, steps=0, process_start_time=1004.0), T0 + 5, settings)
    assert canary_due(busy, BUSY, T0 - 1, T0 + 5, settings, poll_interval=POLL) is False
    done = PageReading(running=0, waiting=0, steps=9, process_start_time=1004.0)
    moved = judge(busy, done, T0 + 10, settings)
    assert canary_due(moved, done, T0 - 1, T0 + 10, settings, poll_interval=POLL) is False
    later = judge(moved, done, T0 + 15, settings)
    assert canary_due(later, done, T0 - 1, T0 + 15, settings, poll_interval=POLL) is True
    # Once the new process had its canary, the interval applies again.
    assert canary_due(later, done, T0 + 11, T0 + 15, settings, poll_interval=POLL) is False


@pytest.mark.parametrize(("case", "reads", "due"), [
    ("the first read of a lifetime: no interval seen quiet yet", [IDLE], False),
    ("a whole quiet interval", [IDLE, IDLE], True),
    # vLLM's API server feeding its engine one request at a time: gauges at 0 at each read.
    ("counters moved since the last read, gauges at 0", [PageReading(0, 0, steps=5), PageReading(0, 0, steps=9)], False),
    ("work pending at the last read, none now", [BUSY, IDLE], False),
])
def test_the_canary_needs_a_whole_interval_with_nothing_pending_and_nothing_moving(case, reads, due) -> None:
    settings = target()
    verdict = None
    for n, read in enumerate(reads):
        verdict = judge(verdict, read, T0 + 5 * n, settings)
    assert verdict is not None
    assert canary_due(verdict, reads[-1], None, T0 + 5 * len(reads), settings, poll_interval=POLL) is due, case
