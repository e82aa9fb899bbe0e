"""Issue 29, as tables over real pages: progress per unit, restarts without a start time, deferred work.

Every page here is a real one (tests/fixtures/), or real ones put together the way the engine writes
more units: a vLLM page with two data-parallel engines is two real single-engine pages, the second's
`engine="0"` series relabelled `engine="1"`; an SGLang page with two data-parallel ranks is two real
pages with `dp_rank` added to the scheduler's series (SGLang adds it when `--dp-size` > 1); the Triton
pages already hold two models. A value changed by hand is named in the helper's call.
"""

from __future__ import annotations

import re

import pytest
from conftest import FIXTURES
from prometheus_client.parser import text_string_to_metric_families

from llm_vitals.exporter.engines import Page, PageError, PageReading
from llm_vitals.exporter.engines.table import engine_of, read_page
from llm_vitals.exporter.settings import TargetSettings, parse_settings
from llm_vitals.exporter.state import StateStore, target_view
from llm_vitals.exporter.verdict import PollError, Verdict, drain_holds, health_check_due, is_ready, judge
from llm_vitals.targets import NOT_READY_STATES, RESTARTABLE_STATES, UNHEALTHY_STATES, TargetView

STUCK_AFTER = 60.0


def fixture(engine: str, name: str) -> str:
    prefix = {"vllm": "vllm-0.32.0-cpu-metrics", "triton": "triton-2.51.0-cpu-metrics",
              "sglang": "sglang-0.5.23-cpu-metrics", "tgi": "tgi-from-source-metrics"}[engine]
    return (FIXTURES / engine / f"{prefix}-{name}.txt").read_text()


def target(engine: str, **overrides: object) -> TargetSettings:
    config: dict[str, object] = {"name": "t", "url": "http://127.0.0.1:8000", "engine": engine,
                                 "stuck_after": f"{STUCK_AFTER:g}s", "canary": {"enabled": False}}
    config.update(overrides)
    return TargetSettings.model_validate(config)


def setting(text: str, sample: str, value: float) -> str:
    """`text` with every line of `sample` (its name and the start of its labels, as written) at `value`."""
    pattern = re.compile(rf"^({re.escape(sample)}[^\n]*?) \S+$", re.MULTILINE)
    changed, count = pattern.subn(lambda m: f"{m.group(1)} {value:g}", text)
    assert count, f"no line {sample} on the page"
    return changed


def observe(engine: str, text: str) -> PageReading | PollError:
    try:
        return read_page(engine_of(engine), Page(text.encode()))
    except PageError as exc:
        return PollError(exc.reason, exc.detail)


def run(engine: str, reads: list[tuple[float, str | PollError]], settings: TargetSettings | None = None) -> list[Verdict]:
    """Judge pages (or failed reads) at their times as one target's polls; every verdict."""
    settings = settings or target(engine)
    verdict, out = None, []
    for at, seen in reads:
        verdict = judge(verdict, observe(engine, seen) if isinstance(seen, str) else seen, at, settings)
        out.append(verdict)
    return out


def client_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as prometheus-client reads the page: the built pages must stay valid pages."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


# -- vLLM: data-parallel engines --------------------------------------------------------------------

VLLM_BUSY = fixture("vllm", "busy")  # engine 0: running 2, waiting 6, 462 steps
VLLM_FROZEN = fixture("vllm", "enginecore-sigstop")  # running 2, waiting 8, engine core stopped
VLLM_IDLE = fixture("vllm", "idle")


def two_engines(first: str, second: str) -> str:
    """A page of two data-parallel engines: `first` whole, each `engine="0"` line of `second` after its twin as engine 1."""
    theirs = {line.rpartition(" ")[0]: line for line in second.splitlines() if 'engine="0"' in line}
    lines = []
    for line in first.splitlines():
        lines.append(line)
        if 'engine="0"' in line and not line.startswith("#"):
            twin = theirs[line.rpartition(" ")[0]]
            lines.append(twin.replace('engine="0"', 'engine="1"'))
    return "\n".join(lines) + "\n"


def stepping(text: str, steps: float) -> str:
    """The busy engine some steps on (its step counter, generated tokens and KV usage moved)."""
    text = setting(text, 'vllm:iteration_tokens_total_count{engine="0"', steps)
    return setting(text, 'vllm:generation_tokens_total{engine="0"', 2 * steps)


def deferred(text: str, running: float, waiting: float, held: float) -> str:
    """The page with its requests split as vLLM 0.32 splits them: `held` of `waiting` deferred (a KV transfer)."""
    text = setting(text, "vllm:num_requests_running{", running)
    text = setting(text, "vllm:num_requests_waiting{", waiting)
    text = setting(text, 'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"', waiting - held)
    return setting(text, 'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="deferred"', held)


def test_the_two_engine_page_is_a_valid_page_with_both_engines() -> None:
    page = two_engines(VLLM_BUSY, VLLM_FROZEN)
    values = client_values(page)
    running = {dict(labels)["engine"]: v for (name, labels), v in values.items() if name == "vllm:num_requests_running"}
    assert running == {"0": 2.0, "1": 2.0}
    snap = observe("vllm", page)
    assert isinstance(snap, PageReading)
    assert (snap.running, snap.waiting) == (4, 14)  # the sums stay for the rates and the API
    assert [(u.name, u.running, u.waiting, u.counters[0]) for u in snap.units] == [
        ('engine="0"', 2, 6, 462), ('engine="1"', 2, 8, 10547)]
    assert observe("vllm", VLLM_BUSY).units == ()  # one engine: no per-unit work


VLLM_UNIT_CASES = [
    # id, reads (seconds, page), state, reason, unit
    ("one_engine_frozen_with_work_beside_one_stepping_is_stuck_naming_it",
     [(0, two_engines(VLLM_BUSY, VLLM_FROZEN)), (35, two_engines(stepping(VLLM_BUSY, 600), VLLM_FROZEN)),
      (70, two_engines(stepping(VLLM_BUSY, 700), VLLM_FROZEN))], "stuck", "no_progress", 'engine="1"'),
    ("the_frozen_engine_is_not_stuck_over_one_read_nor_before_stuck_after",
     [(0, two_engines(VLLM_BUSY, VLLM_FROZEN)), (35, two_engines(stepping(VLLM_BUSY, 600), VLLM_FROZEN))],
     "busy", "progress", None),
    ("both_engines_stepping_is_busy",
     [(0, two_engines(VLLM_BUSY, VLLM_BUSY)), (35, two_engines(stepping(VLLM_BUSY, 600), stepping(VLLM_BUSY, 600))),
      (70, two_engines(stepping(VLLM_BUSY, 700), stepping(VLLM_BUSY, 700)))], "busy", "progress", None),
    ("an_idle_engine_standing_still_beside_a_stepping_one_is_busy",
     [(0, two_engines(VLLM_BUSY, VLLM_IDLE)), (35, two_engines(stepping(VLLM_BUSY, 600), VLLM_IDLE)),
      (70, two_engines(stepping(VLLM_BUSY, 700), VLLM_IDLE))], "busy", "progress", None),
    ("the_frozen_engine_stepping_again_is_busy",
     [(0, two_engines(VLLM_BUSY, VLLM_FROZEN)), (35, two_engines(stepping(VLLM_BUSY, 600), VLLM_FROZEN)),
      (70, two_engines(stepping(VLLM_BUSY, 700), VLLM_FROZEN)),
      (75, two_engines(stepping(VLLM_BUSY, 800), stepping(VLLM_FROZEN, 10600)))], "busy", "progress", None),
    ("an_engine_whose_work_is_all_deferred_beside_a_stepping_one_waits_on_a_peer",
     [(0, two_engines(VLLM_BUSY, deferred(VLLM_FROZEN, 0, 8, 8))),
      (35, two_engines(stepping(VLLM_BUSY, 600), deferred(VLLM_FROZEN, 0, 8, 8))),
      (70, two_engines(stepping(VLLM_BUSY, 700), deferred(VLLM_FROZEN, 0, 8, 8)))],
     "waiting_on_peer", "waiting_on_peer", 'engine="1"'),
]


def test_a_stuck_engine_counts_on_its_own_clock_for_liveness_and_the_api() -> None:
    verdicts = run("vllm", [(0, two_engines(VLLM_BUSY, VLLM_FROZEN)),
                            (35, two_engines(stepping(VLLM_BUSY, 600), VLLM_FROZEN)),
                            (70, two_engines(stepping(VLLM_BUSY, 700), VLLM_FROZEN)),
                            (100, two_engines(stepping(VLLM_BUSY, 800), VLLM_FROZEN))])
    last = verdicts[-1]
    assert last.state == "stuck" and last.last_progress == 0 and last.stuck_for(130) == 130
    assert last.steps_per_second == pytest.approx(100 / 30)  # the sums' rate, as before


def test_a_unit_pending_without_its_own_progress_asks_the_health_route() -> None:
    settings = target("vllm")
    first = judge(None, observe("vllm", two_engines(VLLM_BUSY, VLLM_FROZEN)), 0, settings)
    moving = observe("vllm", two_engines(stepping(VLLM_BUSY, 600), VLLM_FROZEN))
    assert isinstance(moving, PageReading) and health_check_due(first, moving)
    both = observe("vllm", two_engines(stepping(VLLM_BUSY, 600), stepping(VLLM_FROZEN, 10600)))
    assert isinstance(both, PageReading) and not health_check_due(first, both)


# -- vLLM: deferred work on one engine ---------------------------------------------------------------

DEFERRED_CASES = [
    ("requests_deferred_on_a_kv_transfer_with_nothing_moving_wait_on_a_peer",
     [(0, deferred(VLLM_FROZEN, 0, 8, 8)), (35, deferred(VLLM_FROZEN, 0, 8, 8)), (70, deferred(VLLM_FROZEN, 0, 8, 8))],
     "waiting_on_peer", "waiting_on_peer"),
    ("deferred_and_capacity_waiting_with_nothing_running_wait_on_a_peer",
     [(0, deferred(VLLM_FROZEN, 0, 8, 3)), (35, deferred(VLLM_FROZEN, 0, 8, 3)), (70, deferred(VLLM_FROZEN, 0, 8, 3))],
     "waiting_on_peer", "waiting_on_peer"),
    ("deferred_requests_with_running_ones_frozen_is_stuck",
     [(0, deferred(VLLM_FROZEN, 2, 8, 8)), (35, deferred(VLLM_FROZEN, 2, 8, 8)), (70, deferred(VLLM_FROZEN, 2, 8, 8))],
     "stuck", "no_progress"),
    ("deferred_requests_within_stuck_after_are_waiting_for_progress",
     [(0, deferred(VLLM_FROZEN, 0, 8, 8)), (35, deferred(VLLM_FROZEN, 0, 8, 8))], "busy", "waiting_for_progress"),
    ("deferred_requests_while_the_engine_steps_are_busy",
     [(0, deferred(VLLM_FROZEN, 0, 8, 8)), (35, stepping(deferred(VLLM_FROZEN, 0, 8, 8), 10600)),
      (70, stepping(deferred(VLLM_FROZEN, 0, 8, 8), 10700))], "busy", "progress"),
    ("capacity_waiting_only_with_nothing_moving_is_still_stuck",
     [(0, deferred(VLLM_FROZEN, 0, 8, 0)), (35, deferred(VLLM_FROZEN, 0, 8, 0)), (70, deferred(VLLM_FROZEN, 0, 8, 0))],
     "stuck", "no_progress"),
]


@pytest.mark.parametrize(("reads", "state", "reason"), [case[1:] for case in DEFERRED_CASES],
                         ids=[case[0] for case in DEFERRED_CASES])
def test_work_the_engine_deferred_waits_on_a_peer_never_a_restart(reads, state: str, reason: str) -> None:
    last = run("vllm", reads)[-1]
    assert (last.state, last.reason) == (state, reason), last.detail
    if state == "waiting_on_peer":
        assert "deferred" in last.detail and last.state not in RESTARTABLE_STATES | UNHEALTHY_STATES


def test_the_deferred_count_is_read_and_shown() -> None:
    snap = observe("vllm", deferred(VLLM_FROZEN, 0, 8, 3))
    assert isinstance(snap, PageReading) and (snap.waiting, snap.deferred) == (8, 3)
    assert observe("vllm", VLLM_BUSY).deferred == 0  # type: ignore[union-attr]
    assert "3 deferred" in snap.load


def test_waiting_on_peer_is_a_known_state_neither_restartable_nor_unhealthy_and_stays_ready() -> None:
    settings = target("vllm")
    last = run("vllm", [(0, deferred(VLLM_FROZEN, 0, 8, 8)), (35, deferred(VLLM_FROZEN, 0, 8, 8)),
                        (70, deferred(VLLM_FROZEN, 0, 8, 8))], settings)[-1]
    assert last.state == "waiting_on_peer"
    assert last.state not in RESTARTABLE_STATES | UNHEALTHY_STATES | NOT_READY_STATES
    assert is_ready(last, settings, 70, draining=False)
    # The remediator reads the state through the one contract: known, so never an `unknown_verdict`.
    store = StateStore(parse_settings({"targets": [{"name": "t", "url": "http://127.0.0.1:8000"}]}), now=0.0)
    record = next(iter(store))
    record.record_poll(last, 70.0, 0.01)
    view = TargetView.model_validate_json(target_view(record, 71.0).model_dump_json())
    assert (view.state, view.deferred, view.unit) == ("waiting_on_peer", 8, None)


def test_the_api_names_the_stuck_unit() -> None:
    last = run("vllm", [(0, two_engines(VLLM_BUSY, VLLM_FROZEN)), (35, two_engines(stepping(VLLM_BUSY, 600), VLLM_FROZEN)),
                        (70, two_engines(stepping(VLLM_BUSY, 700), VLLM_FROZEN))])[-1]
    store = StateStore(parse_settings({"targets": [{"name": "t", "url": "http://127.0.0.1:8000"}]}), now=0.0)
    record = next(iter(store))
    record.record_poll(last, 70.0, 0.01)
    view = TargetView.model_validate_json(target_view(record, 71.0).model_dump_json())
    assert (view.state, view.unit) == ("stuck", 'engine="1"')


# -- Triton: models --------------------------------------------------------------------------------

TRITON_BUSY = fixture("triton", "busy-1")  # toy_lm: 1 queued, 1 done; toy_lm_stream: 1 done
TOY_LM = 'model="toy_lm",version="1"'
STREAM = 'model="toy_lm_stream",version="1"'


def triton(text: str, model: str, **values: float) -> str:
    """The page with `model`'s samples of each family (`exec_count=5`, `pending_request_count=16`, ...) set."""
    for family, value in values.items():
        if family.startswith("failure_"):
            text = setting(text, f'nv_inference_request_failure{{model="{model}",reason="{family[8:].upper()}"', value)
        else:
            text = setting(text, f'nv_inference_{family}{{model="{model}",', value)
    return text


def queued_on_toy_lm(stream_done: float, **more: float) -> str:
    """toy_lm with 16 queued and nothing of its own completing; toy_lm_stream completing `stream_done`."""
    page = triton(TRITON_BUSY, "toy_lm", pending_request_count=16, **more)
    return triton(page, "toy_lm_stream", exec_count=stream_done, request_success=stream_done,
                  compute_infer_duration_us=1000 * stream_done)


TRITON_UNIT_CASES = [
    ("a_model_with_16_queued_and_nothing_completing_beside_one_completing_is_stuck",
     [(0, queued_on_toy_lm(1)), (35, queued_on_toy_lm(5)), (70, queued_on_toy_lm(9))], "stuck", "no_progress", TOY_LM),
    ("its_failures_moving_are_not_progress_either",
     [(0, queued_on_toy_lm(1)), (35, queued_on_toy_lm(5, failure_rejected=7)),
      (70, queued_on_toy_lm(9, failure_rejected=20, failure_canceled=3))], "stuck", "no_progress", TOY_LM),
    ("both_models_completing_is_busy",
     [(0, queued_on_toy_lm(1)), (35, triton(queued_on_toy_lm(5), "toy_lm", exec_count=3, request_success=3)),
      (70, triton(queued_on_toy_lm(9), "toy_lm", exec_count=6, request_success=6))], "busy", "progress", None),
]


# Each row: the engine whose units (vLLM's engines, Triton's models) the pages list, then a case above.
UNIT_CASES = [("vllm", *case) for case in VLLM_UNIT_CASES] + [("triton", *case) for case in TRITON_UNIT_CASES]


@pytest.mark.parametrize(("engine", "reads", "state", "reason", "unit"), [(case[0], *case[2:]) for case in UNIT_CASES],
                         ids=[f"{case[0]}-{case[1]}" for case in UNIT_CASES])
def test_units_are_judged_each_on_its_own(engine: str, reads, state: str, reason: str, unit: str | None) -> None:
    verdicts = run(engine, reads)
    last = verdicts[-1]
    assert (last.state, last.reason, last.unit) == (state, reason, unit), last.detail
    assert {v.restarts for v in verdicts} == {0}
    if unit is not None:
        assert f"unit {unit}" in last.detail


def test_failures_are_never_progress_on_a_lone_hung_model() -> None:
    # Only failures move (a queue policy REJECTs, clients CANCEL): 20 minutes of that is stuck, not busy.
    hung = triton(TRITON_BUSY, "toy_lm", pending_request_count=16)
    reads = [(0.0, hung)] + [(60.0 * minute, triton(hung, "toy_lm", failure_rejected=5 * minute, failure_canceled=minute))
                            for minute in range(1, 21)]
    verdicts = run("triton", reads)
    assert [v.state for v in verdicts[2:]] == ["stuck"] * 19
    assert verdicts[-1].stuck_seconds == 1200 and {v.restarts for v in verdicts} == {0}


# -- Restarts without a start time ------------------------------------------------------------------

TRITON_IDLE = fixture("triton", "idle-after-busy")  # toy_lm 4 done, toy_lm_stream 1
TRITON_RESTARTED = fixture("triton", "restarted-idle")  # every counter 0
ONLY_TOY_LM = triton(TRITON_IDLE, "toy_lm_stream", exec_count=0, request_success=0, compute_infer_duration_us=0,
                     count=0, request_duration_us=0, queue_duration_us=0, compute_input_duration_us=0,
                     compute_output_duration_us=0)
REFUSED = PollError("connect", "connection refused")

RESTART_CASES = [
    # id, engine, reads, restarts at the end, state at the end
    ("tgi_fresh_page_after_a_crash_is_a_restart", "tgi",
     [(0, fixture("tgi", "busy-1")), (5, fixture("tgi", "busy-2")), (30, fixture("tgi", "idle"))], 1, "starting"),
    ("tgi_fresh_page_then_quiet_is_idle_with_one_restart", "tgi",
     [(0, fixture("tgi", "busy-2")), (30, fixture("tgi", "idle")), (35, fixture("tgi", "idle"))], 1, "idle"),
    ("tgi_fresh_page_then_its_first_request_is_still_one_restart", "tgi",
     [(0, fixture("tgi", "busy-2")), (30, fixture("tgi", "idle")), (35, fixture("tgi", "restarted-idle")),
      (40, fixture("tgi", "restarted-idle"))], 1, "idle"),
    ("tgi_a_page_before_any_request_then_counters_is_no_restart", "tgi",
     [(0, fixture("tgi", "idle")), (5, fixture("tgi", "idle-after-one-request")),
      (10, fixture("tgi", "idle-after-one-request"))], 0, "idle"),
    ("triton_exec_count_reset_while_failures_grew_is_a_restart", "triton",
     [(0, triton(fixture("triton", "busy-before-kill"), "toy_lm", failure_rejected=2)),
      (40, triton(TRITON_RESTARTED, "toy_lm", failure_rejected=5))], 1, "starting"),
    ("triton_only_counted_model_reloaded_at_the_same_version_is_no_restart", "triton",
     [(0, ONLY_TOY_LM), (5, ONLY_TOY_LM), (10, TRITON_RESTARTED), (15, TRITON_RESTARTED)], 0, "idle"),
    ("triton_only_counted_model_reloaded_three_times_is_no_restart_loop", "triton",
     [(0, ONLY_TOY_LM), (5, TRITON_RESTARTED), (10, ONLY_TOY_LM), (15, TRITON_RESTARTED), (20, ONLY_TOY_LM),
      (25, TRITON_RESTARTED)], 0, "idle"),
    ("triton_the_same_fall_after_the_server_was_away_is_a_restart", "triton",
     [(0, ONLY_TOY_LM), (5, REFUSED), (10, REFUSED), (15, TRITON_RESTARTED)], 1, "starting"),
    ("triton_every_model_reset_is_a_restart", "triton",
     [(0, TRITON_IDLE), (5, TRITON_RESTARTED)], 1, "starting"),
    ("sglang_counters_reset_is_a_restart", "sglang",
     [(0, fixture("sglang", "busy-before-kill")), (60, fixture("sglang", "restarted-idle"))], 1, "starting"),
    ("sglang_restart_then_quiet_is_idle", "sglang",
     [(0, fixture("sglang", "busy-before-kill")), (60, fixture("sglang", "restarted-idle")),
      (65, fixture("sglang", "restarted-idle"))], 1, "idle"),
]


@pytest.mark.parametrize(("engine", "reads", "restarts", "state"), [case[1:] for case in RESTART_CASES],
                         ids=[case[0] for case in RESTART_CASES])
def test_restarts_without_a_start_time(engine: str, reads, restarts: int, state: str) -> None:
    verdicts = run(engine, reads, target(engine, down_after="60s"))
    last = verdicts[-1]
    assert (last.restarts, last.state) == (restarts, state), last.detail
    assert all(v.steps_per_second is None or v.steps_per_second >= 0 for v in verdicts)


def test_a_restarted_process_is_not_started_until_a_read_of_its_own_shows_it_servable() -> None:
    settings = target("tgi")
    verdicts = run("tgi", [(0, fixture("tgi", "busy-2")), (30, fixture("tgi", "idle")), (35, fixture("tgi", "idle"))],
                   settings)
    assert [v.started for v in verdicts] == [True, False, True]
    assert [v.state for v in verdicts] == ["busy", "starting", "idle"]
    assert not is_ready(verdicts[1], settings, 30, draining=False)


def test_a_drain_ends_at_a_tgi_fresh_page() -> None:
    # The preStop hook drained the old process; the kubelet's restart brings a TGI with no counters
    # yet. The drain was asked of the old process: the new one must be allowed to turn Ready.
    settings = target("tgi")
    before, fresh, quiet = run("tgi", [(0, fixture("tgi", "busy-2")), (30, fixture("tgi", "idle")),
                                       (35, fixture("tgi", "idle"))], settings)
    assert drain_holds(True, before, before)
    still = drain_holds(True, before, fresh)
    assert not still
    assert is_ready(quiet, settings, 35, draining=drain_holds(still, fresh, quiet))


# -- SGLang: data-parallel ranks and transfer queues -------------------------------------------------

SGLANG_BUSY = fixture("sglang", "busy-1")
SGLANG_FROZEN = fixture("sglang", "scheduler-sigstop")
SGLANG_IDLE = fixture("sglang", "idle")


def two_ranks(first: str, second: str) -> str:
    """Two data-parallel ranks: the scheduler's series of `first` as dp_rank 0, of `second` as dp_rank 1."""
    theirs = {line.rpartition(" ")[0]: line for line in second.splitlines() if 'tp_rank="0"' in line}
    lines = []
    for line in first.splitlines():
        if 'tp_rank="0"' in line and not line.startswith("#"):
            twin = theirs.get(line.rpartition(" ")[0])
            lines.append(line.replace('tp_rank="0"', 'tp_rank="0",dp_rank="0"'))
            if twin is not None:
                lines.append(twin.replace('tp_rank="0"', 'tp_rank="0",dp_rank="1"'))
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def sglang_steps(text: str, steps: float) -> str:
    return setting(text, 'sglang:cuda_graph_passes_total{engine_type="unified",mode="decode_none"', steps)


def test_the_two_rank_page_is_a_valid_page_with_both_ranks() -> None:
    page = two_ranks(SGLANG_BUSY, SGLANG_FROZEN)
    ranks = {dict(labels).get("dp_rank") for (name, labels) in client_values(page) if name == "sglang:num_running_reqs"}
    assert ranks == {"0", "1"}
    snap = observe("sglang", page)
    assert isinstance(snap, PageReading) and [u.name for u in snap.units] == ['dp_rank="0"', 'dp_rank="1"']
    assert observe("sglang", SGLANG_BUSY).units == ()  # type: ignore[union-attr]


def sglang_rank_frozen(steps: float) -> str:
    """Rank 0 stepping on (its step counter at `steps`, set on both ranks, then rank 1's put back)."""
    page = two_ranks(sglang_steps(SGLANG_BUSY, steps), SGLANG_FROZEN)
    frozen = re.search(r'^sglang:cuda_graph_passes_total\{engine_type="unified",mode="decode_none"[^\n]*dp_rank="1"\} (\S+)$',
                       two_ranks(SGLANG_BUSY, SGLANG_FROZEN), re.MULTILINE)
    assert frozen is not None
    return re.sub(r'^(sglang:cuda_graph_passes_total\{engine_type="unified",mode="decode_none"[^\n]*dp_rank="1"\}) \S+$',
                  lambda m: f"{m.group(1)} {frozen.group(1)}", page, flags=re.MULTILINE)


def test_an_sglang_rank_frozen_with_work_beside_one_stepping_is_stuck_naming_it() -> None:
    verdicts = run("sglang", [(0, sglang_rank_frozen(2095)), (35, sglang_rank_frozen(2200)), (70, sglang_rank_frozen(2300))])
    last = verdicts[-1]
    assert (last.state, last.reason, last.unit) == ("stuck", "no_progress", 'dp_rank="1"'), last.detail
    assert verdicts[1].state == "busy"


def transfer_queued(text: str, queue: str, count: float) -> str:
    """The page of a disaggregated server with `count` requests in one transfer queue, none running nor queued."""
    text = setting(text, "sglang:num_running_reqs{", 0)
    text = setting(text, "sglang:num_queue_reqs{", 0)
    return setting(text, f"sglang:{queue}{{", count)


@pytest.mark.parametrize("queue", ["num_decode_transfer_queue_reqs", "num_prefill_inflight_queue_reqs",
                                   "num_prefill_bootstrap_queue_reqs", "num_decode_prealloc_queue_reqs"])
def test_sglang_requests_in_a_transfer_queue_with_nothing_moving_wait_on_a_peer(queue: str) -> None:
    page = transfer_queued(SGLANG_IDLE, queue, 4)
    snap = observe("sglang", page)
    assert isinstance(snap, PageReading) and snap.deferred == 4 and snap.pending
    last = run("sglang", [(0, page), (35, page), (70, page)])[-1]
    assert (last.state, last.reason) == ("waiting_on_peer", "waiting_on_peer"), last.detail


# -- Sleep: a wake-up that hangs with work pending ----------------------------------------------------

def asleep(text: str, waiting: float) -> str:
    """The real idle vLLM page asleep at level 1 (vLLM's engine_sleep_state series), `waiting` requests queued."""
    text = setting(text, "vllm:num_requests_waiting{", waiting)
    text = setting(text, 'vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="awake"', 0)
    return setting(text, 'vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="weights_offloaded"', 1)


def test_requests_kept_asleep_are_paused_not_stuck() -> None:
    # vLLM's /sleep?mode=keep leaves its requests pending on a sleeping engine: on purpose (issue 38).
    verdicts = run("vllm", [(0, asleep(VLLM_IDLE, 0)), (5, asleep(VLLM_IDLE, 3)), (40, asleep(VLLM_IDLE, 3)),
                            (70, asleep(VLLM_IDLE, 3))])
    assert [(v.state, v.reason) for v in verdicts] == [("asleep", "asleep")] + [("paused", "sleep_kept")] * 3
    assert verdicts[-1].stuck_seconds == 0
    # Asleep with nothing owed stays asleep, however long.
    assert run("vllm", [(0, asleep(VLLM_IDLE, 0)), (3600, asleep(VLLM_IDLE, 0))])[-1].state == "asleep"


# -- The whole exporter on loopback: the API names the unit -----------------------------------------

async def test_the_exporter_polling_a_two_model_triton_names_the_stuck_model(aiohttp_server, aiohttp_client) -> None:
    """toy_lm holds 16 queued and completes nothing; toy_lm_stream completes one more at every read."""
    from aiohttp import web
    from test_exporter_helpers import make_settings, make_target, record, start_exporter, wait_for

    reads = 0

    async def metrics(request: web.Request) -> web.Response:
        nonlocal reads
        reads += 1
        return web.Response(text=queued_on_toy_lm(reads), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    settings = make_settings([make_target("tr", str(server.make_url("")), engine="triton", canary={"enabled": False},
                                          metrics_url=str(server.make_url("/metrics")), stuck_after=1.0)])
    client = await start_exporter(aiohttp_client, settings)
    await wait_for(lambda: record(client, "tr").verdict.state == "stuck", timeout=10, what="stuck")
    view = await (await client.get("/api/v1/targets/tr")).json()
    assert (view["state"], view["reason"], view["unit"]) == ("stuck", "no_progress", TOY_LM)
    assert f"unit {TOY_LM}" in view["detail"] and view["waiting"] == 16


# -- The simulator: a decode server whose prefill peer is gone ----------------------------------------

async def test_a_decode_server_whose_peer_is_gone_waits_on_it_and_is_never_stuck(aiohttp_client) -> None:
    """The simulator's `peer` fault: its waiting requests are deferred (vLLM 0.32's waiting_by_reason) and
    nothing moves: `waiting_on_peer`, ready and live, never stuck; back to work once the peer is back."""
    from test_exporter_helpers import make_settings, make_target, record, requests_in_flight, start_exporter, target_json
    from test_exporter_helpers import wait_for as wait_until_true

    from llm_vitals.sim.fleet import Fleet, SimConfig

    async with Fleet(SimConfig(max_num_seqs=2, tokens_per_second=100), backends=1) as fleet:
        url = fleet.backend_urls[0]
        client = await start_exporter(aiohttp_client, make_settings(
            [make_target("decode-a", url, stuck_after=1.0, canary={"enabled": False})], poll_interval=0.25))
        rec = record(client, "decode-a")
        await wait_until_true(lambda: rec.verdict.state == "idle", what="idle")
        fleet.backends[0].set_fault("peer")
        body = {"model": "tiny", "prompt": "def main():", "max_tokens": 20, "ignore_eos": True}
        async with requests_in_flight(url + "/v1/completions", body, 3):
            await wait_until_true(lambda: rec.verdict.state == "waiting_on_peer", timeout=10, what="waiting_on_peer")
            view = await target_json(client, "decode-a")
            assert (view["reason"], view["deferred"], view["ready"], view["live"]) == ("waiting_on_peer", 3, True, True)
            assert "3 deferred" in view["detail"]
            states = {state for _, _, state in list(rec.history)}
            assert "stuck" not in states and rec.verdict.restarts == 0
            fleet.backends[0].set_fault("none")
            await wait_until_true(lambda: rec.verdict.state == "busy", timeout=10, what="busy once the peer is back")
