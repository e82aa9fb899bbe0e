"""The Triton adapter over the real Triton 2.51 pages in tests/fixtures/triton/, held to prometheus-client's parser.

The pages come from a real Triton 2.51.0 (nvidia-pytriton 0.7.0) on this machine kind, serving a toy
model with 2 instances (fixtures' RECIPE: /work/shared/fixtures/triton). Captures of a server that did
not answer (tritonserver SIGSTOPped: rc 28; killed: rc 7) hold only a note, and are read as such.
The TensorRT-LLM pages are built by hand from the backend's metric names (their header says whence).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FIXTURES, VLLM_FIXTURES
from prometheus_client.parser import text_string_to_metric_families

from llm_vitals.exporter.engines import Page, PageError
from llm_vitals.exporter.engines.table import engine_of, read_page
from llm_vitals.exporter.engines.triton import canary_wrong, parse_text
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import PollError, is_ready, judge

TRITON = FIXTURES / "triton"
REAL = "triton-2.51.0-cpu-metrics-{}.txt"
STUCK_AFTER = 15.0


def page(state: str) -> str:
    return (TRITON / REAL.format(state)).read_text()


def target(**overrides: object) -> TargetSettings:
    config: dict[str, object] = {"name": "tr", "url": "http://127.0.0.1:8000", "engine": "triton",
                                 "stuck_after": f"{STUCK_AFTER:g}s", "canary": {"enabled": False}}
    config.update(overrides)
    return TargetSettings.model_validate(config)


def client_sum(text: str, sample: str, **labels: str) -> float:
    """prometheus-client's sum of one sample over the models (and the given label values).

    Triton's counters have no `_total` suffix (`nv_inference_exec_count`); prometheus-client's parser
    names their samples `..._total` all the same, while the page (and our scanner) has them as written.
    """
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            named = s.name == sample or (family.type == "counter" and s.name == sample + "_total")
            if named and labels.items() <= s.labels.items():
                total += s.value
    return total


# state -> (waiting, exec_count, request_success, compute_infer_duration_us), summed over toy_lm and
# toy_lm_stream. Busy: 2 running + 1 queued reads waiting 1; frozen pages equal busy ones.
REAL_PAGES = {
    "idle": (0, 0, 0, 0),
    "idle-after-one-request": (0, 1, 1, 382304),
    "busy-1": (1, 2, 2, 382757),
    "busy-2": (1, 2, 2, 382757),
    "frozen-python-1": (1, 2, 2, 382757),
    "frozen-python-2": (1, 2, 2, 382757),
    "idle-after-busy": (0, 5, 5, 118131896),
    "busy-before-kill": (1, 6, 6, 118132351),
    "after-kill-python-3s": (1, 6, 6, 118132351),
    "restarted-idle": (0, 0, 0, 0),
}


@pytest.mark.parametrize("state,expected", REAL_PAGES.items())
def test_real_pages_read_as_prometheus_client_reads_them(state: str, expected: tuple[float, ...]) -> None:
    text = page(state)
    snap = parse_text(text)
    waiting, executions, success, compute = expected
    assert (snap.waiting, snap.steps, snap.finished) == (waiting, executions, success)
    assert dict(snap.more_counters) == {
        "request_failure": client_sum(text, "nv_inference_request_failure"),
        "compute_infer_duration_us": compute,
    }
    # Nothing on a Triton page counts executing requests: running is 0 even with 2 running.
    assert snap.running == 0 and snap.kv_usage is None and snap.process_start_time is None
    assert snap.waiting == client_sum(text, "nv_inference_pending_request_count")
    assert snap.steps == client_sum(text, "nv_inference_exec_count")
    assert snap.finished == client_sum(text, "nv_inference_request_success")
    assert compute == client_sum(text, "nv_inference_compute_infer_duration_us")


@pytest.mark.parametrize("state,rc", [("frozen-tritonserver", 28), ("after-kill-tritonserver-5s", 7),
                                      ("after-kill-python-33s", 7)])
def test_captures_of_a_server_that_did_not_answer_hold_no_page(state: str, rc: int) -> None:
    text = page(state)
    assert text.startswith("# no answer") and f"rc={rc}" in text
    with pytest.raises(PageError) as caught:
        read_page(engine_of("triton"), Page(text.encode()))
    assert caught.value.reason == "bad_metrics"


def run(states: list[tuple[str, float]], t: TargetSettings | None = None):
    """Judge a sequence of real pages (state, seconds) as one target's polls; the verdicts.

    A state is a fixture's name, or a page's text itself (a line holds one: a real page changed by
    `without_model` or `new_version`).
    """
    t = t or target()
    verdict, out = None, []
    for state, at in states:
        text = state if "\n" in state else page(state)
        try:
            observation = read_page(engine_of("triton"), Page(text.encode()))
        except PageError as exc:
            observation = PollError(exc.reason, exc.detail)
        verdict = judge(verdict, observation, at, t)
        out.append(verdict)
    return out


def test_frozen_worker_queued_and_nothing_completing_for_stuck_after_is_stuck() -> None:
    # The capture's own timeline (events log): busy-1, busy-2 8.6 s later, the Python process
    # SIGSTOPped, frozen-1 10 s and frozen-2 20 s after; HTTP answered 200 throughout.
    verdicts = run([("idle-after-one-request", 0.0), ("busy-1", 9.3), ("busy-2", 17.9),
                    ("frozen-python-1", 28.1), ("frozen-python-2", 38.1), ("idle-after-busy", 78.4)])
    # The first read of a lifetime is not yet idle; the last, after the freeze, shows the queue drained
    # and the counters moved since the frozen read: work flowed, so busy (idle needs a quiet interval).
    # Each model is judged on its own: toy_lm's request queued since the first read, and nothing of
    # toy_lm's completing (its 2 instances ran long requests) while toy_lm_stream completed one, is
    # stuck from the third read with stuck_after 15 s shorter than its requests (see the next test).
    assert [v.state for v in verdicts] == ["starting", "busy", "stuck", "stuck", "stuck", "busy"]
    assert verdicts[4].stuck_seconds == pytest.approx(38.1)
    assert {v.unit for v in verdicts[2:5]} == {'model="toy_lm",version="1"'} and verdicts[5].unit is None
    assert {v.restarts for v in verdicts} == {0}


def test_a_long_request_with_one_queued_is_busy_until_stuck_after_which_must_exceed_it() -> None:
    # busy-1 == busy-2: two long generations running, one queued, nothing completing. Within
    # stuck_after that is busy; a stuck_after shorter than the longest request would read it stuck.
    reads = [("busy-1", 0.0), ("busy-2", 8.6), ("busy-2", 9.6)]
    assert [v.state for v in run(reads)] == ["busy", "busy", "busy"]
    short = target(stuck_after="5s")
    assert [v.state for v in run(reads, short)] == ["busy", "busy", "stuck"]


def test_killed_server_is_down_and_its_restart_is_one_counter_reset() -> None:
    verdicts = run([("busy-before-kill", 0.0), ("after-kill-python-33s", 33.0), ("restarted-idle", 60.0),
                    ("restarted-idle", 61.0)])
    assert [v.state for v in verdicts] == ["busy", "down", "starting", "idle"]  # down: no good read for 33 s
    assert verdicts[1].reason == "bad_metrics"
    assert [v.restarts for v in verdicts] == [0, 0, 1, 1]


def test_a_vllm_page_on_a_triton_target_is_wrong_engine_and_a_triton_page_on_vllm_too() -> None:
    vllm_page = (VLLM_FIXTURES / "vllm-0.32.0-cpu-metrics-idle.txt").read_bytes()
    with pytest.raises(PageError) as caught:
        read_page(engine_of("triton"), Page(vllm_page))
    assert caught.value.reason == "wrong_engine" and "vllm" in caught.value.detail
    with pytest.raises(PageError) as caught:
        read_page(engine_of("vllm"), Page(page("idle").encode()))
    assert caught.value.reason == "wrong_engine" and "triton" in caught.value.detail


def trtllm(n: int) -> str:
    return (TRITON / f"built-trtllm-busy-{n}.txt").read_text()


def test_tensorrt_llm_iteration_counter_is_the_step_signal_and_active_requests_run() -> None:
    one, two = parse_text(trtllm(1)), parse_text(trtllm(2))
    assert (one.running, one.waiting, one.steps, one.finished) == (1, 1, 1200, 3)
    assert one.running == client_sum(trtllm(1), "nv_trt_llm_request_metrics", request_type="active")
    assert one.steps == client_sum(trtllm(1), "nv_trt_llm_general_metrics", general_type="iteration_counter")
    assert one.kv_usage == pytest.approx(16 / 6239)
    assert dict(one.more_counters)["exec_count"] == 3
    # Mid-generation nothing completes; only TensorRT-LLM's iterations move, and that is progress.
    assert two.steps == 1460 and two.finished == one.finished and two.more_counters == one.more_counters
    verdicts = []
    verdict = None
    for snap, at in ((one, 0.0), (two, 5.0), (two, 12.0), (two, 25.0)):
        verdict = judge(verdict, snap, at, target())
        verdicts.append(verdict.state)
    assert verdicts == ["busy", "busy", "busy", "stuck"]


@pytest.mark.parametrize("text,why", [
    ("nv_cpu_utilization 0.1\n", "no nv_inference_pending_request_count"),  # no model loaded yet
    ('nv_inference_pending_request_count{model="m",version="1"} 0\n', "without nv_inference_exec_count"),
    ('nv_inference_pending_request_count{model="m",version="1"} NaN\nnv_inference_exec_count{model="m",version="1"} 1\n'
     'nv_inference_request_success{model="m",version="1"} 1\nnv_inference_compute_infer_duration_us{model="m",version="1"} 1\n',
     "is NaN"),
])
def test_bad_pages_are_bad_metrics_with_the_reason_kept(text: str, why: str) -> None:
    with pytest.raises(PageError) as caught:
        parse_text(text)
    assert caught.value.reason == "bad_metrics" and why in caught.value.detail


CANARY = {"inputs": [{"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}


def test_the_canary_is_the_operators_v2_infer_and_only_with_a_model() -> None:
    t = target(model="toy_lm", canary={"request": CANARY})
    entry = engine_of("triton")
    assert entry.canary is not None and entry.models_path is None
    assert entry.canary.path.replace("{model}", "toy_lm") == "/v2/models/toy_lm/infer"
    assert entry.canary.body(t, "toy_lm") == CANARY
    assert t.sends_canary
    # No request: no canary at all (it cannot be guessed), and an idle Triton is then ready.
    quiet = target(canary={})
    assert not quiet.sends_canary
    idle = run([("idle", 0.0), ("idle", 1.0)], quiet)[-1]
    assert idle.state == "idle" and is_ready(idle, quiet, 1.0, draining=False)


@pytest.mark.parametrize("answer,wrong", [
    ({"model_name": "toy_lm", "outputs": [{"name": "generated", "datatype": "INT32", "shape": [1, 1], "data": [1]}]}, None),
    ({"error": "unknown model"}, "answer has no outputs"),
    ([], "answer is not a JSON object"),
])
def test_a_canary_answer_counts_only_with_outputs(answer: object, wrong: str | None) -> None:
    assert canary_wrong(answer) == wrong


@pytest.mark.parametrize("config,message", [
    ({"engine": "vllm", "canary": {"request": CANARY}}, "canary.request is for engines whose canary is a request you describe"),
    ({"canary": {"request": CANARY}}, "engine triton lists no models at /v1/models: set model"),
])
def test_a_canary_request_the_engine_cannot_use_is_a_config_error(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        target(**config)


def test_the_module_docstring_sample_is_a_real_page() -> None:
    import llm_vitals.exporter.engines.triton as adapter

    lines = [line.strip() for line in (adapter.__doc__ or "").splitlines() if line.strip().startswith("nv_")]
    busy = page("busy-1")
    assert lines and all(line in busy for line in lines), [line for line in lines if line not in busy]


def test_fixture_folder_holds_the_pages_the_project_keeps() -> None:
    names = {p.name for p in Path(TRITON).iterdir()}
    for state in ("idle", "busy-1", "frozen-python-1", "frozen-tritonserver", "after-kill-tritonserver-5s", "restarted-idle"):
        assert REAL.format(state) in names, state


# -- models loaded, unloaded, given a new version: not a restart (issue 23, part 7) ----------------
# Triton drops a model's series from the page when the model is unloaded and brings them back from 0
# when it (or a new version) is loaded. The pages below are the real ones with exactly that done to
# them: the lines of one model taken away, or its version changed and its counters at 0.


def without_model(text: str, model: str) -> str:
    """The real page as Triton shows it once `model` is unloaded: none of its series."""
    return "".join(line for line in text.splitlines(keepends=True) if f'model="{model}"' not in line)


def new_version(text: str, model: str, version: str) -> str:
    """The real page once `model` is reloaded as `version`: its series under the new version, from 0."""
    lines = []
    for line in text.splitlines(keepends=True):
        if f'model="{model}"' in line and not line.startswith("#"):
            labels, _, _ = line.rpartition(" ")
            line = labels.replace('version="1"', f'version="{version}"') + " 0\n"
        lines.append(line)
    return "".join(lines)


def test_the_transformed_pages_are_what_triton_shows() -> None:
    busy = page("busy-1")
    gone = without_model(busy, "toy_lm_stream")
    assert 'model="toy_lm_stream"' in busy and 'model="toy_lm_stream"' not in gone
    assert client_sum(gone, "nv_inference_exec_count") < client_sum(busy, "nv_inference_exec_count")  # the sum falls
    bumped = new_version(page("idle-after-busy"), "toy_lm_stream", "2")
    assert client_sum(bumped, "nv_inference_exec_count", model="toy_lm_stream", version="2") == 0
    assert client_sum(bumped, "nv_inference_exec_count", model="toy_lm") == client_sum(
        page("idle-after-busy"), "nv_inference_exec_count", model="toy_lm")


@pytest.mark.parametrize(("states", "state", "reason"), [
    # Unloaded with work queued on the other model, nothing completing: not a restart, not progress.
    ([("busy-1", 0.0), (without_model(page("busy-1"), "toy_lm_stream"), 5.0)], "busy", "waiting_for_progress"),
    # ... and still stuck once nothing completes for stuck_after: the unload hides no hang.
    ([("busy-1", 0.0), (without_model(page("busy-1"), "toy_lm_stream"), 5.0),
      (without_model(page("busy-1"), "toy_lm_stream"), 20.0)], "stuck", "no_progress"),
    # Unloaded while the other model completes requests: that is progress.
    ([("busy-1", 0.0), (without_model(page("busy-before-kill"), "toy_lm_stream"), 5.0)], "busy", "progress"),
    # A new version of an idle model: its series start at 0 under the new version; idle once quiet.
    ([("idle-after-busy", 0.0), ("idle-after-busy", 5.0), (new_version(page("idle-after-busy"), "toy_lm_stream", "2"), 10.0),
      (new_version(page("idle-after-busy"), "toy_lm_stream", "2"), 15.0)], "idle", "idle"),
    # Reloaded between two reads: its series from 0 under the same labels, the other model's standing still.
    ([("idle-after-busy", 0.0), ("idle-after-busy", 5.0), (new_version(page("idle-after-busy"), "toy_lm_stream", "1"), 10.0),
      (new_version(page("idle-after-busy"), "toy_lm_stream", "1"), 15.0)], "idle", "idle"),
    # Unloaded and loaded again: back from 0 under the same labels, while the other model stands still.
    ([("idle-after-busy", 0.0), (without_model(page("idle-after-busy"), "toy_lm_stream"), 5.0),
      (new_version(page("idle-after-busy"), "toy_lm_stream", "1"), 10.0)], "idle", "idle"),
])
def test_a_model_unloaded_loaded_or_given_a_new_version_is_not_a_restart(states, state: str, reason: str) -> None:
    verdicts = run(states)
    assert (verdicts[-1].state, verdicts[-1].reason) == (state, reason), verdicts[-1].detail
    assert {v.restarts for v in verdicts} == {0}
    assert all(v.steps_per_second is None or v.steps_per_second >= 0 for v in verdicts)  # never a negative rate


def test_a_real_restart_is_still_one_restart_though_models_come_and_go() -> None:
    # Every series present before and after fell to 0: that is the process, not a model.
    verdicts = run([("busy-before-kill", 0.0), (without_model(page("restarted-idle"), "toy_lm_stream"), 60.0)])
    assert verdicts[-1].restarts == 1 and verdicts[-1].reason == "restart"
