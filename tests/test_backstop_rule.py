"""The kubelet's liveness backstop obeys the remediator's gate (llm_vitals/exporter/backstop_rule.py), reading
the word by its one wire shape (llm_vitals/backstop_word.py).

Tables with the time as an input, over the stuck time, the word, the word's age and whether the
remediator answers at all. Before this, `/probe/<t>/live` read only the shim's own verdict: a server
stuck past its budget failed liveness whatever the gate said (paused, paged, a storm), and the
kubelet restarted it.
"""

from __future__ import annotations

import pytest

from llm_vitals.backstop_word import BackstopWord, word_in
from llm_vitals.exporter.backstop_rule import Heard, backstop, heard, held, last_held
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.state import TargetRecord, backstop_view
from llm_vitals.exporter.verdict import Verdict, is_live

W = "Deployment/llm/vllm"
AFTER = 600.0  # backstop.after
TARGET = TargetSettings(name="vllm", url="http://127.0.0.1:8000", engine="vllm", stuck_after=120, workload=W)
BUDGET = TARGET.liveness  # 240 s


def said(word: str, reason: str = "", since: float | None = None, detail: str = "") -> BackstopWord:
    """A word for this test's workload, as the remediator would send it."""
    return BackstopWord(workload=W, word=word, reason=reason, since=since, detail=detail)


HOLD = said("hold", "paused", 1.7e9, "paused for maintenance")
ACT = said("act")


def stuck_since(progress: float) -> Verdict:
    return Verdict(state="stuck", reason="no_progress", detail="", since=progress + 120, first_seen=0.0,
                   started=True, up=True, last_progress=progress)


def record(answers, *, after: float | None = AFTER, verdict: Verdict | None = None) -> TargetRecord:
    """A shim's record started at 0 that took `answers` [(time, Word | why unreadable | None)] in order."""
    rec = TargetRecord(TARGET, Verdict(state="starting", reason="startup", detail="", since=0.0, first_seen=0.0),
                       backstop_after=after)
    for at, answer in answers:
        rec.take_answer(answer, at)
    if verdict is not None:
        rec.record_poll(verdict, 0.0, 0.01)
    return rec


T = 10_000.0  # the time each case is judged at; the server is stuck since T - 3000 unless said
CASES = [
    # (id, answers, stuck since, now, mode, reason, live)
    ("fresh act, stuck past the budget: fails as always", [(T - 10, ACT)], T - 3000, T, "act", "", False),
    ("fresh act, stuck within the budget", [(T - 10, ACT)], T - 200, T, "act", "", True),
    ("fresh hold, stuck for an hour: held", [(T - 10, HOLD)], T - 3600, T, "hold", "paused", True),
    ("hold heard just within backstop.after", [(T - AFTER, HOLD)], T - 3000, T, "hold", "paused", True),
    # The remediator fell silent: the hold ended `after` past its last answer, and the budget counts from then.
    ("hold gone silent, budget not spent since", [(T - AFTER - 100, HOLD)], T - 3000, T, "armed", "remediator_silent",
     True),
    ("hold gone silent, budget spent since", [(T - AFTER - BUDGET - 1, HOLD)], T - 3000, T, "armed",
     "remediator_silent", False),
    ("act gone silent: armed, fails as always", [(T - AFTER - 1, ACT)], T - 3000, T, "armed", "remediator_silent", False),
    # Unreadable from a remediator known alive: toward hold; once it is silent for `after`: armed.
    ("an HTTP 503 (lost state) from a live remediator", [(T - 10, "the remediator answered HTTP 503")], T - 3000, T,
     "hold", "word_unreadable", True),
    ("an HTTP 401 (wrong token) from a live remediator", [(T - 10, "the remediator answered HTTP 401")], T - 3000, T,
     "hold", "word_unreadable", True),
    ("unreadable, then silent past after and the budget", [(T - AFTER - BUDGET - 1, "not JSON")], T - 3000, T,
     "armed", "remediator_silent", False),
    ("an act, then garbage: the garbage wins (the remediator is alive)", [(T - 100, ACT), (T - 10, "not JSON")],
     T - 3000, T, "hold", "word_unreadable", True),
    # No answer at all (refused, timed out) changes nothing: the last answer's age decides.
    ("a hold, then no answers", [(T - 300, HOLD), (T - 200, None), (T - 10, None)], T - 3000, T, "hold", "paused", True),
    ("never answered, shim older than after: armed", [(T - 10, None)], T - 3000, T, "armed", "remediator_silent", False),
    ("never answered, shim just started: acts as always", [(10, None)], -3000, 100, "act", "not_heard_yet", False),
    # A hold that ends: the remediator has the first go, the kubelet's budget counts from the end.
    ("hold ended by an act, within the budget", [(T - 600, HOLD), (T - 100, ACT)], T - 3000, T, "act", "", True),
    ("hold ended by an act, budget spent", [(T - 600, HOLD), (T - BUDGET - 1, ACT)], T - 3000, T, "act", "", False),
    # A hold that went silent before the act came ended `after` past its last answer.
    ("hold silent, then an act", [(T - 1000, HOLD), (T - 100, ACT)], T - 3000, T, "act", "", False),
    ("hold silent, then an act, budget not spent", [(T - 800, HOLD), (T - 100, ACT)], T - 3000, T, "act", "", True),
    ("a restart in progress holds", [(T - 10, said("hold", "restart_in_progress", 1.7e9))], T - 3000, T, "hold",
     "restart_in_progress", True),
]


@pytest.mark.parametrize("answers, progress, now, mode, reason, live", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_liveness_obeys_the_word(answers, progress, now, mode, reason, live):
    rec = record(answers, verdict=stuck_since(progress))
    said = rec.backstop(now)
    assert (said.mode, said.reason) == (mode, reason)
    assert rec.live(now) is live
    # Readiness is not the backstop's: a stuck server is never ready, held or not.
    assert rec.ready(now) is False


def test_without_the_backstop_section_liveness_is_what_it_was():
    rec = record([(T - 10, HOLD)], after=None, verdict=stuck_since(T - 3000))
    assert rec.backstop(T) is None and backstop_view(rec, T) is None
    assert rec.live(T) is False
    assert rec.live(T) is is_live(stuck_since(T - 3000), TARGET, T)


def test_a_hold_never_makes_a_healthy_server_fail():
    healthy = Verdict(state="busy", reason="progress", detail="", since=0.0, first_seen=0.0, started=True, up=True,
                      last_progress=T - 1)
    for answers in ([(T - 10, HOLD)], [(T - 10, ACT)], [(T - 10, "not JSON")], []):
        assert record(answers, verdict=healthy).live(T)


@pytest.mark.parametrize("answer, expected", [
    ({"words": [{"workload": W, "word": "act", "reason": "", "since": None}]}, ACT),
    ({"words": [{"workload": W, "word": "hold", "reason": "paused", "since": 5, "detail": "d"}]},
     said("hold", "paused", 5.0, "d")),
    ({"words": [{"workload": "Deployment/llm/other", "word": "act"}]}, "the answer holds 0 words for " + W),
    ({"words": [{"workload": W, "word": "act"}, {"workload": W, "word": "hold", "reason": "paused"}]},
     "the answer holds 2 words for " + W),
    ({"words": [{"workload": W, "word": "act", "reason": "paused"}]}, "contradictory word: act with reason 'paused'"),
    ({"words": [{"workload": W, "word": "hold", "reason": ""}]}, "contradictory word: hold with reason ''"),
    ({"words": [{"workload": W, "word": "restart"}]}, "unknown word 'restart'"),
    ({"words": [{"workload": W, "word": "hold", "reason": "paused", "since": "yesterday"}]}, "`since` is not a number"),
    ({"words": [{"workload": W, "word": "hold", "reason": "paused", "since": True}]}, "`since` is not a number"),
    ({"words": "act"}, "the answer holds no `words` list"),
    ([], "the answer holds no `words` list"),
])
def test_a_word_is_read_only_when_it_is_whole_and_ours(answer, expected):
    assert word_in(answer, W) == expected


def test_the_end_of_a_hold_is_kept_across_answers():
    h = Heard()
    h = heard(held(h, 100, AFTER, 0), HOLD, 100)
    h = heard(held(h, 200, AFTER, 0), ACT, 200)  # the hold was in force until this answer
    assert h.held_at == 200 and backstop(h, 250, AFTER, 0).mode == "act"
    assert last_held(h, 250, AFTER, 0) == 200
    assert last_held(Heard(), 250, AFTER, 0) is None


def test_the_view_shows_the_word_and_its_age():
    rec = record([(T - 30, HOLD), (T - 5, None)], verdict=stuck_since(T - 3000))
    view = backstop_view(rec, T)
    assert view is not None
    assert (view.mode, view.reason, view.word_since, view.word_age_seconds, view.answered_age_seconds) == (
        "hold", "paused", 1.7e9, 30.0, 30.0)


def test_the_gauges_show_the_mode_the_reason_and_when_the_word_came():
    from llm_vitals.exporter.collector import format_value
    from llm_vitals.exporter.page import PageCache, render_target

    rec = record([(T - 30, HOLD), (T - 5, None)], verdict=stuck_since(T - 3000))
    text = b"".join(render_target(rec, T, wall=T + 1e9).texts).decode()
    for line in ('llm_vitals_backstop_state{state="hold",target="vllm"} 1.0',
                 'llm_vitals_backstop_state{state="armed",target="vllm"} 0.0',
                 'llm_vitals_backstop_hold_reason{reason="paused",target="vllm"} 1.0',
                 'llm_vitals_backstop_held_back{target="vllm"} 1.0',
                 f'llm_vitals_backstop_word_timestamp_seconds{{target="vllm"}} {format_value(T - 30 + 1e9)}',
                 'llm_vitals_live{target="vllm"} 1.0'):
        assert line in text, line
    # Silence arms it with no change to the record: a scrape renders the target again.
    cache = PageCache()
    cache.current(rec, T)
    later = T - 30 + AFTER + 1
    armed = b"".join(cache.current(rec, later).texts).decode()
    assert 'llm_vitals_backstop_state{state="armed",target="vllm"} 1.0' in armed
    assert "llm_vitals_backstop_hold_reason" not in armed
    assert 'llm_vitals_backstop_held_back{target="vllm"} 0.0' in armed
    # Held, but stuck within the budget: nothing held back yet (the scrape sees the budget pass).
    young = record([(T - 30, HOLD)], verdict=stuck_since(T - 100))
    assert 'llm_vitals_backstop_held_back{target="vllm"} 0.0' in b"".join(cache.current(young, T).texts).decode()
    assert 'llm_vitals_backstop_held_back{target="vllm"} 1.0' in b"".join(cache.current(young, T + 141).texts).decode()
    plain = b"".join(render_target(record([], after=None), T).texts).decode()
    assert "llm_vitals_backstop" not in plain


RESTARTING = said("hold", "restart_in_progress", 1.7e9, "the remediator is restarting it")
COOLDOWN = said("hold", "cooldown", 1.7e9, "global cooldown")


def test_one_restart_per_hang_the_shim_holds_until_it_reads_the_new_process():
    """The remediator's claim ends once the eviction is accepted, long before the new process serves:
    the shim holds `restart_in_progress` until its verdict counts the restart, whatever the word says."""
    rec = record([(T - 100, RESTARTING), (T - 90, ACT)], verdict=stuck_since(T - 3000))
    assert (rec.backstop(T).mode, rec.backstop(T).reason) == ("hold", "restart_in_progress") and rec.live(T)
    # The new process is read (a restart counted): the hold ends, the word is the word again.
    restarted = Verdict(state="stuck", reason="no_progress", detail="", since=T, first_seen=0.0, started=True,
                        up=True, last_progress=T - 1000, restarts=1)
    rec.record_poll(restarted, T, 0.01)
    assert rec.backstop(T).mode == "act"
    assert rec.live(T)  # the budget counts from the hold's end
    assert not rec.live(T + BUDGET + 1)
    # The same restart's word heard again does not hold the new process.
    rec.take_answer(RESTARTING, T + 5)
    assert rec.backstop(T + 5).mode == "hold"  # the word itself holds while it says so
    rec.take_answer(ACT, T + 10)
    assert rec.backstop(T + 10).mode == "act"


def test_a_restart_that_never_came_holds_no_longer_than_after():
    rec = record([(T - 100, RESTARTING), (T - 90, ACT), (T - 100 + AFTER, ACT)], verdict=stuck_since(T - 3000))
    assert rec.backstop(T - 100 + AFTER).reason == "restart_in_progress"
    rec.take_answer(ACT, T - 100 + AFTER + 1)
    assert rec.backstop(T - 100 + AFTER + 1).mode == "act"
    # Held until the last ask that found it held (T - 100 + AFTER): the budget counts from there.
    assert rec.live(T - 100 + AFTER + BUDGET) and not rec.live(T - 100 + AFTER + BUDGET + 1)


def test_a_new_restart_latches_again():
    rec = record([(T - 100, RESTARTING)], verdict=stuck_since(T - 3000))
    rec.record_poll(Verdict(state="stuck", reason="no_progress", detail="", since=T, first_seen=0.0, started=True,
                            up=True, last_progress=T - 1000, restarts=1), T, 0.01)
    rec.take_answer(ACT, T)
    rec.take_answer(said("hold", "restart_in_progress", 1.7e9 + 900), T + 900)
    rec.take_answer(ACT, T + 910)
    assert rec.backstop(T + 910).reason == "restart_in_progress"
