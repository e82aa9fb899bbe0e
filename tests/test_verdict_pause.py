"""Issue 38: a pause on purpose is a state (`paused`), not a hang; tables over real pages.

The vLLM pages are real 0.32 pages (tests/fixtures/vllm/): a paused vLLM (`POST /pause?mode=keep`)
shows its requests pending with nothing moving, as the EngineCore SIGSTOP page does; only its
`GET /is_paused` tells the two apart, so the tables give the route's answer as the poller would.
The operation gauges are vLLM's own (vllm/entrypoints/rl/online/metrics.py and
vllm/entrypoints/serve/dev/sleep/metrics.py of 0.32), added to a real page as vLLM writes them.
The SGLang pages are real 0.5.23 pages with the values named in each helper's call.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_verdict_units import (
    SGLANG_FROZEN,
    SGLANG_IDLE,
    VLLM_FROZEN,
    VLLM_IDLE,
    observe,
    setting,
    stepping,
    target,
)

from llm_vitals.exporter.engines import PageReading
from llm_vitals.exporter.engines.table import engine_of
from llm_vitals.exporter.settings import parse_settings
from llm_vitals.exporter.state import StateStore, target_view
from llm_vitals.exporter.verdict import (
    CanaryOutcome,
    Verdict,
    canary_due,
    is_live,
    is_ready,
    judge,
    pause_ask_due,
    pause_exceeded,
    record_canary,
)
from llm_vitals.exporter.verdict.plan import follow_ups
from llm_vitals.remediator.exporter_client import parse_targets
from llm_vitals.targets import NOT_READY_STATES, RESTARTABLE_STATES, STATES, UNHEALTHY_STATES

STUCK_AFTER = 60.0  # as test_verdict_units' target()


def ops(text: str, family: str, **in_flight: float) -> str:
    """`text` with vLLM's operations-in-flight gauge `family`, one series per operation, as vLLM writes it."""
    lines = [f"# HELP {family} Operations currently awaited.", f"# TYPE {family} gauge"]
    lines += [f'{family}{{operation="{op}"}} {value:g}' for op, value in in_flight.items()]
    return text + "\n".join(lines) + "\n"


WEIGHT_OPS = "vllm:rl_weight_update_operations_in_flight"
SLEEP_OPS = "vllm:sleep_mode_operations_in_flight"


def run(engine: str, reads: list[tuple[float, str, bool | None]], **overrides: object) -> list[Verdict]:
    """Judge pages at their times, each with the pause route's answer the poller got (None: not asked)."""
    settings = target(engine, **overrides)
    verdict, out = None, []
    for at, page, paused in reads:
        snap = observe(engine, page)
        assert isinstance(snap, PageReading), snap
        verdict = judge(verdict, snap, at, settings, paused=paused)
        out.append(verdict)
    return out


POLL = 5.0


def asked(engine: str, reads: list[tuple[float, str, bool]], **overrides: object) -> list[tuple[bool, Verdict]]:
    """As the poller does: after each read, ask the pure core whether to ask the pause route (in the
    background); the next read is judged with the answer, the route's state at that next read."""
    settings = target(engine, **overrides)
    verdict: Verdict | None = None
    due, out = False, []
    for i, (at, page, answer) in enumerate(reads):
        snap = observe(engine, page)
        assert isinstance(snap, PageReading), snap
        verdict = judge(verdict, snap, at, settings, paused=answer if due else None)
        out.append((due, verdict))
        # The table's reads stand for polls: the poll interval is the gap to the next one.
        poll = reads[i + 1][0] - at if i + 1 < len(reads) else POLL
        due = pause_ask_due(verdict, at, settings, poll)
    return out


# -- vLLM's pause (mode=keep): the route is asked only when the verdict would otherwise be stuck --------

def test_a_paused_vllm_under_load_is_paused_for_three_stuck_afters_then_busy_after_resume() -> None:
    # Frozen page while paused (the route says true), for 3 x stuck_after; then /resume: it steps.
    reads = [(0, VLLM_FROZEN, True), (5, VLLM_FROZEN, True), (35, VLLM_FROZEN, True), (70, VLLM_FROZEN, True),
             (130, VLLM_FROZEN, True), (190, VLLM_FROZEN, True), (250, VLLM_FROZEN, True),
             (255, stepping(VLLM_FROZEN, 10600), False)]
    seen = asked("vllm", reads)
    # Asked (after the read before) only for a read that could be stuck (35 s: a poll of 30 s brings
    # stuck_after within two polls), then while the verdict rests on the route's word, up to the read
    # that shows the pause ended.
    assert [due for due, _ in seen] == [False, False, True, True, True, True, True, True]
    states = [(v.state, v.reason) for _, v in seen]
    assert states[:2] == [("busy", "progress"), ("busy", "waiting_for_progress")]
    assert states[2:7] == [("paused", "paused")] * 5
    assert states[-1] == ("busy", "progress")
    assert not any(v.state in RESTARTABLE_STATES for _, v in seen)
    settings = target("vllm")
    assert all(is_live(v, settings, 250) for _, v in seen)


def test_without_the_routes_word_the_same_pages_are_stuck() -> None:
    # Today's main: a pause read stuck at stuck_after. A route not asked, unanswered (a hung vLLM
    # EngineCore does not answer /is_paused) or answering false is no pause.
    for answer in (None, False):
        last = run("vllm", [(0, VLLM_FROZEN, None), (5, VLLM_FROZEN, None), (35, VLLM_FROZEN, None),
                            (70, VLLM_FROZEN, answer)])[-1]
        assert (last.state, last.reason) == ("stuck", "no_progress")


def test_a_hang_right_after_a_resume_is_stuck_within_stuck_after_from_the_last_paused_read() -> None:
    reads = [(0, VLLM_FROZEN, True), (5, VLLM_FROZEN, True), (35, VLLM_FROZEN, True), (70, VLLM_FROZEN, True),
             (75, stepping(VLLM_FROZEN, 10600), False),  # resumed, stepping
             (80, stepping(VLLM_FROZEN, 10600), False),  # hung (SIGSTOP): /is_paused unanswered or false
             (110, stepping(VLLM_FROZEN, 10600), False), (140, stepping(VLLM_FROZEN, 10600), False)]
    seen = asked("vllm", reads)
    assert [v.state for _, v in seen][3:] == ["paused", "busy", "busy", "busy", "stuck"]
    assert seen[-1][1].last_progress == 75  # the stuck clock counts from the last read that moved


@pytest.mark.parametrize(("state", "reason", "page", "failures", "reads", "at", "due"), [
    # The next read could be stuck (work pending, nothing moved at the last read, stuck_after within two polls).
    ("busy", "waiting_for_progress", VLLM_FROZEN, 0, 1, 55, True),
    # stuck_after not within two polls yet: do not ask.
    ("busy", "waiting_for_progress", VLLM_FROZEN, 0, 1, 45, False),
    # Moving at the last read: never.
    ("busy", "progress", VLLM_FROZEN, 0, 0, 55, False),
    # Stuck already: keep asking (a pause an earlier ask missed is still found).
    ("stuck", "no_progress", VLLM_FROZEN, 0, 3, 90, True),
    # Idle with nothing failed: never (not on every poll).
    ("idle", "idle", VLLM_IDLE, 0, 0, 70, False),
    # Idle-looking and its canary failed (a paused vLLM queues the canary): ask.
    ("idle", "idle", VLLM_IDLE, 1, 0, 70, True),
    # Resting on the route's word: ask until it says the pause ended.
    ("paused", "paused", VLLM_IDLE, 0, 0, 70, True),
    # Paused by the page's own word (asleep with requests kept): the page says it, no route needed.
    ("paused", "sleep_kept", VLLM_FROZEN, 0, 0, 70, False),
])
def test_the_pause_route_is_asked_only_when_the_next_read_could_be_stuck(
        state: str, reason: str, page: str, failures: int, reads: int, at: float, due: bool) -> None:
    settings = target("vllm")
    snap = observe("vllm", page)
    assert isinstance(snap, PageReading)
    verdict = replace(judge(None, snap, 0, settings), state=state, reason=reason, up=True,  # type: ignore[arg-type]
                      canary_failures=failures, reads_without_progress=reads, last_progress=0.0)
    assert pause_ask_due(verdict, at, settings, POLL) is due
    # A failed read is no ground to ask.
    assert not pause_ask_due(replace(verdict, up=False, state="busy", reason="progress"), at, settings, POLL)


@pytest.mark.parametrize(("state", "pending", "last_sent", "now", "in_flight", "ask", "send"), [
    # Idle, the next canary due at 27.5 (30 s interval, half a 5 s poll early): asked one poll before it ...
    ("idle", False, 0.0, 20.0, False, False, False),
    ("idle", False, 0.0, 25.0, False, True, False),
    # ... and the canary goes with the read after (the route said not paused), with no ask beside it.
    ("idle", False, 0.0, 30.0, False, False, True),
    # A quiet read after work (the next may be idle, and its canary due): asked.
    ("busy", False, 0.0, 25.0, False, True, False),
    # Work pending: the canary rule sends none, and the stuck rule alone asks (not within two polls here).
    ("busy", True, 0.0, 25.0, False, False, False),
    # A canary still out: none may go with the next read, so no ask for it.
    ("idle", False, 0.0, 25.0, True, False, False),
])
def test_the_pause_route_is_asked_a_poll_before_a_canary_may_go(state: str, pending: bool, last_sent: float,
                                                                 now: float, in_flight: bool, ask: bool,
                                                                 send: bool) -> None:
    settings = target("vllm", canary={"enabled": True, "interval": 30})
    snap = observe("vllm", VLLM_FROZEN if pending else VLLM_IDLE)
    assert isinstance(snap, PageReading)
    verdict = replace(judge(None, snap, 0, settings), state=state, reason=state, up=True,  # type: ignore[arg-type]
                      reads_without_progress=0, last_progress=now)
    assert follow_ups(verdict, snap, now, settings, engine_of(settings.engine), POLL, pause_route=True, last_canary_sent=last_sent,
                      canary_in_flight=in_flight) == (ask, send)
    # Without a pause route nothing is asked, and the canary rule is the same.
    assert follow_ups(verdict, snap, now, settings, engine_of(settings.engine), POLL, pause_route=False, last_canary_sent=last_sent,
                      canary_in_flight=in_flight) == (False, send)


def test_sglang_s_ready_is_not_asked_before_a_canary() -> None:
    # SGLang 0.5.23's /ready is 503 while paused and also after a /health_generate timed out, until one
    # succeeds: its real tier, after the hang drill, read an idle server `paused` for good, canaries stopped.
    settings = target("sglang", canary={"enabled": True, "interval": 30})
    snap = observe("sglang", SGLANG_IDLE)
    assert isinstance(snap, PageReading)
    verdict = replace(judge(None, snap, 0, settings), state="idle", reason="idle", up=True)
    assert follow_ups(verdict, snap, 25.0, settings, engine_of(settings.engine), POLL, pause_route=True, last_canary_sent=0.0,
                      canary_in_flight=False) == (False, False)
    # The rules before it stay: asked once an idle-looking SGLang's canary failed.
    failed = replace(verdict, canary_failures=1)
    assert follow_ups(failed, snap, 25.0, settings, engine_of(settings.engine), POLL, pause_route=True, last_canary_sent=0.0,
                      canary_in_flight=False) == (True, False)


def test_a_vllm_paused_while_its_page_reads_nothing_pending_gets_no_canary() -> None:
    # A real run (CI, vLLM 0.32 on CPU): /pause?mode=keep landed as the six clients' requests ended and
    # the next six went in; the page read 0 running, 0 waiting for 11 s (a paused vLLM takes no step,
    # so its page keeps its last step's counts) while they sat kept in the paused engine. The route, asked a poll
    # before each canary, says paused: no canary goes to queue behind the pause, and nothing restarts.
    settings = target("vllm", canary={"enabled": True, "interval": 30})
    snap = observe("vllm", VLLM_IDLE)
    assert isinstance(snap, PageReading)
    verdict, ask, last_sent, sent = None, False, None, []
    for at in range(0, 300, 5):
        paused = (at >= 50) if ask else None  # paused at 50 s; the route's answer only where it was asked
        verdict = judge(verdict, snap, at, settings, paused=paused)
        ask, send = follow_ups(verdict, snap, at, settings, engine_of(settings.engine), POLL, pause_route=True, last_canary_sent=last_sent,
                               canary_in_flight=False)
        if send:
            last_sent = at
            sent.append(at)
    assert sent == [5, 35] and last_sent is not None  # idle: one canary each interval, up to the pause
    assert (verdict.state, verdict.reason) == ("paused", "paused")
    assert not any(at >= 50 for at in sent)


def test_an_idle_paused_vllm_is_paused_and_gets_no_canary_and_its_canary_failure_does_not_count() -> None:
    settings = target("vllm", canary={"enabled": True})
    verdict = judge(None, observe("vllm", VLLM_IDLE), 0, settings)  # type: ignore[arg-type]
    verdict = judge(verdict, observe("vllm", VLLM_IDLE), 5, settings)  # type: ignore[arg-type]
    verdict = record_canary(verdict, CanaryOutcome("timeout", "queued behind the pause"), 6, settings)
    assert pause_ask_due(verdict, 6, settings, POLL)
    snap = observe("vllm", VLLM_IDLE)
    assert isinstance(snap, PageReading)
    verdict = judge(verdict, snap, 10, settings, paused=True)
    assert (verdict.state, verdict.reason, verdict.canary_failures) == ("paused", "paused", 0)
    assert not canary_due(verdict, snap, None, 10, settings, poll_interval=5)
    # A canary still out when it paused fails: no news about a server paused on purpose.
    assert record_canary(verdict, CanaryOutcome("timeout"), 11, settings).canary_failures == 0


def test_the_pause_routes_answers_read_as_each_engine_writes_them() -> None:
    vllm, sglang = engine_of("vllm"), engine_of("sglang")
    assert (vllm.pause_path, sglang.pause_path) == ("/is_paused", "/ready")
    assert vllm.pause_answer is not None and sglang.pause_answer is not None
    assert [vllm.pause_answer(status, body) for status, body in (
        (200, b'{"is_paused":true}'), (200, b'{"is_paused": false}'), (200, b'{"error": "x"}'), (200, b'{"is_paused": 1}'),
        (200, b"not json"), (200, b"[]"), (500, b'{"is_paused": true}'))] == [True, False, None, None, None, None, None]
    # SGLang 0.5.23: /ready is 503 between /pause_generation and /continue_generation, 200 otherwise.
    assert [sglang.pause_answer(status, b"") for status in (503, 200, 404, 500)] == [True, False, None, None]
    assert all(engine_of(name).pause_path is None for name in ("llamacpp", "triton", "tgi", "openai"))


def test_a_paused_sglang_scheduler_with_its_page_frozen_is_paused_by_its_ready_route() -> None:
    # /pause_generation (in_place) stops the scheduler before it batches: the page freezes as a hung
    # scheduler's does (the real SIGSTOP page), and only /ready (503) tells the two apart.
    reads = [(0, SGLANG_FROZEN, True), (35, SGLANG_FROZEN, True), (70, SGLANG_FROZEN, True), (100, SGLANG_FROZEN, True)]
    assert [(v.state, v.reason) for _, v in asked("sglang", reads)][-2:] == [("paused", "paused")] * 2
    hung = [(at, page, False) for at, page, _ in reads]
    assert asked("sglang", hung)[-1][1].state == "stuck"


# -- pause_budget: a long pause pages, never restarts; an operation wedged past it is stuck ----------

def test_a_pause_past_pause_budget_pages_and_is_never_restartable() -> None:
    reads = [(0, VLLM_FROZEN, True), (5, VLLM_FROZEN, True), (35, VLLM_FROZEN, True), (70, VLLM_FROZEN, True),
             (200, VLLM_FROZEN, True), (400, VLLM_FROZEN, True)]
    verdicts = run("vllm", reads, pause_budget="300s")
    settings = target("vllm", pause_budget="300s")
    assert [pause_exceeded(v, settings, at) for v, (at, _, _) in zip(verdicts, reads, strict=True)] == [
        False, False, False, False, False, True]
    last = verdicts[-1]
    assert (last.state, last.reason) == ("paused", "paused") and "LLMServerPausedTooLong" in last.detail
    assert last.state not in RESTARTABLE_STATES | UNHEALTHY_STATES
    assert is_live(last, settings, 400) and is_ready(last, settings, 400, draining=False)
    # The view and the metric carry it (the alert's condition).
    store = StateStore(parse_settings({"targets": [{"name": "t", "url": "http://127.0.0.1:8000",
                                                    "pause_budget": "300s"}]}), now=0.0)
    record = next(iter(store))
    record.record_poll(last, 400.0, 0.01)
    view = target_view(record, 400.0)
    assert (view.state, view.paused_too_long) == ("paused", True)


@pytest.mark.parametrize(("family", "op", "name"), [
    (WEIGHT_OPS, "update", "weight_update:update"),
    (WEIGHT_OPS, "start", "weight_update:start"),
    (SLEEP_OPS, "wake", "sleep_mode:wake"),
])
def test_an_operation_in_flight_is_paused_then_stuck_past_pause_budget(family: str, op: str, name: str) -> None:
    busy = ops(VLLM_FROZEN, family, **{op: 1})
    reads = [(0, VLLM_FROZEN, None), (5, busy, None), (100, busy, None), (305, busy, None), (310, busy, None)]
    verdicts = run("vllm", reads, pause_budget="300s")
    assert [(v.state, v.reason) for v in verdicts] == [
        ("busy", "progress"), ("paused", "operation_in_flight"), ("paused", "operation_in_flight"),
        ("stuck", "operation_stuck"), ("stuck", "operation_stuck")]
    last = verdicts[-1]
    assert name in last.detail and "wedged" in last.detail and last.state in RESTARTABLE_STATES
    # Stuck from the moment the budget ran out: liveness counts from there, not from the start.
    assert last.last_progress == 305 and last.stuck_seconds == 5
    settings = target("vllm", pause_budget="300s")
    assert is_live(last, settings, 310) and not is_live(last, settings, 305 + settings.liveness + 1)
    # Over: the operation clock starts again.
    done = run("vllm", [*reads[:3], (110, ops(VLLM_FROZEN, family, **{op: 0}), None)])[-1]
    assert done.operation_since is None


def test_an_operation_gauge_at_zero_is_no_operation() -> None:
    snap = observe("vllm", ops(ops(VLLM_IDLE, WEIGHT_OPS, update=0, finish=0), SLEEP_OPS, wake=0, sleep=0))
    assert isinstance(snap, PageReading) and snap.in_flight == ()
    snap = observe("vllm", ops(VLLM_IDLE, SLEEP_OPS, wake=1, sleep=0))
    assert isinstance(snap, PageReading) and snap.in_flight == ("sleep_mode:wake",)


def test_a_wake_up_that_hangs_reads_paused_then_stuck_not_asleep_forever() -> None:
    asleep = setting(setting(VLLM_IDLE, 'vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="awake"', 0),
                     'vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="weights_offloaded"', 1)
    waking = ops(asleep, SLEEP_OPS, wake=1)
    verdicts = run("vllm", [(0, asleep, None), (5, asleep, None), (10, waking, None), (1805, waking, None),
                            (1815, waking, None)])
    assert [v.state for v in verdicts] == ["asleep", "asleep", "paused", "paused", "stuck"]
    assert verdicts[-1].reason == "operation_stuck"


# -- SGLang: paused requests, and the disaggregation queues under every name --------------------------

def sglang_page(text: str, **values: float) -> str:
    """A real SGLang page with scheduler gauges set (running, queue, paused, or a queue name)."""
    for name, value in values.items():
        text = setting(text, f'sglang:{name}{{engine_type="unified"', value)
    return text


def with_gauge(text: str, name: str, value: float) -> str:
    """A gauge an older release wrote and 0.5.23 does not, with 0.5.23's scheduler labels."""
    labels = 'engine_type="unified",model_name="tiny-llama",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    return text + f"# HELP sglang:{name} The number of requests.\n# TYPE sglang:{name} gauge\nsglang:{name}{{{labels}}} {value:g}\n"


def test_sglang_requests_paused_for_a_weight_sync_are_paused_not_stuck() -> None:
    page = sglang_page(SGLANG_FROZEN, num_running_reqs=0, num_queue_reqs=0, num_paused_reqs=3)
    snap = observe("sglang", page)
    assert isinstance(snap, PageReading) and snap.paused == 3 and snap.pending and "3 paused" in snap.load
    verdicts = run("sglang", [(0, page, None), (35, page, None), (70, page, None), (200, page, None)])
    assert {(v.state, v.reason) for v in verdicts} == {("paused", "paused")}
    # The same page with those requests running and nothing paused: stuck, as before.
    frozen = sglang_page(SGLANG_FROZEN, num_paused_reqs=0)
    assert run("sglang", [(0, frozen, None), (35, frozen, None), (70, frozen, None)])[-1].state == "stuck"
    # An idle server with requests paused is owed them: no canary.
    idle = observe("sglang", sglang_page(SGLANG_IDLE, num_paused_reqs=2))
    assert isinstance(idle, PageReading) and idle.pending


SGLANG_QUEUES_0_5_23 = ["num_prefill_bootstrap_queue_reqs", "num_prefill_inflight_queue_reqs",
                        "num_decode_prealloc_queue_reqs", "num_decode_transfer_queue_reqs",
                        "num_decode_host_receive_queue_reqs"]
SGLANG_QUEUES_OLDER = ["num_prefill_prealloc_queue_reqs", "num_prefill_infight_queue_reqs"]


@pytest.mark.parametrize("queue", SGLANG_QUEUES_0_5_23 + SGLANG_QUEUES_OLDER)
def test_every_sglang_disaggregation_queue_name_waits_on_a_peer(queue: str) -> None:
    quiet = sglang_page(SGLANG_FROZEN, num_running_reqs=0, num_queue_reqs=0)
    page = sglang_page(quiet, **{queue: 4}) if queue in SGLANG_QUEUES_0_5_23 else with_gauge(quiet, queue, 4)
    snap = observe("sglang", page)
    assert isinstance(snap, PageReading) and snap.deferred == 4
    last = run("sglang", [(0, page, None), (35, page, None), (70, page, None)])[-1]
    assert (last.state, last.reason) == ("waiting_on_peer", "waiting_on_peer")


# -- `paused` through every reader: known, never restartable, ready as the engine says ---------------

def test_paused_is_a_known_state_neither_restartable_nor_unhealthy_and_ready_unless_asleep() -> None:
    assert "paused" in STATES
    assert "paused" not in RESTARTABLE_STATES | UNHEALTHY_STATES | NOT_READY_STATES
    settings = target("vllm")
    kept = setting(setting(VLLM_FROZEN, 'vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="awake"', 0),
                   'vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="weights_offloaded"', 1)
    asleep = run("vllm", [(0, kept, None), (35, kept, None)])[-1]
    assert (asleep.state, asleep.reason) == ("paused", "sleep_kept")
    assert not is_ready(asleep, settings, 35, draining=False)


def test_the_remediator_reads_paused_as_a_known_state_and_never_restarts_it() -> None:
    from llm_vitals.remediator.gate import TargetStatus  # noqa: F401  (the type parse_targets gives)

    last = run("vllm", [(0, VLLM_FROZEN, True), (5, VLLM_FROZEN, True), (35, VLLM_FROZEN, True),
                        (70, VLLM_FROZEN, True)])[-1]
    store = StateStore(parse_settings({"targets": [{"name": "t", "url": "http://127.0.0.1:8000"}]}), now=0.0)
    record = next(iter(store))
    record.record_poll(last, 70.0, 0.01)
    answer = {"targets": [target_view(record, 71.0).model_dump(mode="json")]}
    status = parse_targets(answer)["t"]
    assert (status.state, status.unknown_verdict) == ("paused", None)
    assert status.state not in RESTARTABLE_STATES


def test_a_pause_answer_is_used_by_the_next_read_only_once_it_came_in() -> None:
    from llm_vitals.exporter.poller import PauseAsk

    assert PauseAsk(10.0, answer=True).fresh_for(10.0) is True  # asked right after the read judged at 10
    assert PauseAsk(10.0, answer=True).fresh_for(15.0) is None  # asked before the last read: stale
    assert PauseAsk(10.0, answer=True).fresh_for(None) is None
    assert PauseAsk(10.0, answer=None).fresh_for(10.0) is None  # unanswered (a hung EngineCore)
    in_flight = PauseAsk(10.0, task=object(), answer=True)  # type: ignore[arg-type]
    assert in_flight.fresh_for(10.0) is None  # still out at the next read: judged without it
