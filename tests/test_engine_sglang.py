"""The SGLang adapter against prometheus-client's parser on every real page, and the verdicts they give.

The pages are SGLang 0.5.23's own (tests/fixtures/sglang/, captured from a real server on CPU
torch): idle, busy, frozen scheduler (SIGSTOP, read 3 s and 27 s in), frozen detokenizer, after
and during a long chunked prefill, loading, killed scheduler and restarted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llm_vitals.exporter.engines import Page, PageError, PageReading
from llm_vitals.exporter.engines.sglang import ENGINE, WORK_ROUTES, parse_text
from llm_vitals.exporter.engines.table import ENGINES, read_page
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import PollError, Verdict, judge, progressed

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sglang"
VLLM_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm"
PREFIX = "sglang-0.5.23-cpu-metrics-"
PAGES = sorted(p.name.removeprefix(PREFIX).removesuffix(".txt") for p in FIXTURES.glob(PREFIX + "*.txt"))
NOT_READY = {"loading-run1"}  # no scheduler series yet on this page
T0 = 1_796_300_000.0
REFUSED = PollError("connect", "/metrics: ClientConnectorError: connection refused")


def page(state: str) -> str:
    return (FIXTURES / f"{PREFIX}{state}.txt").read_text()


def reference_snapshot(text: str) -> PageReading:
    """The same PageReading, built with prometheus-client's full parser (samples looked up by full name)."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))

    def total(name: str) -> float | None:
        return sum(value for _, value in samples[name]) if name in samples else None

    active = sum(v for labels, v in samples.get("sglang:http_requests_active", []) if labels["endpoint"] in WORK_ROUTES)
    used = total("sglang:num_used_tokens")
    realtime = total("sglang:realtime_tokens_total")
    pace = total("sglang:inter_token_latency_seconds_sum"), total("sglang:inter_token_latency_seconds_count")
    return PageReading(
        running=total("sglang:num_running_reqs"),
        waiting=total("sglang:num_queue_reqs"),
        steps=total("sglang:cuda_graph_passes_total"),
        generation_tokens=total("sglang:generation_tokens_total"),
        prompt_tokens=total("sglang:prompt_tokens_total"),
        finished=total("sglang:num_requests_total"),
        more_counters=(("realtime_tokens", realtime),) if realtime is not None else (),
        more_gauges=(("used_tokens", used),) if used is not None else (),
        busy_signs=(("requests_active", active),),
        pace=None if None in pace else pace,  # type: ignore[arg-type]
    )


def test_the_real_pages_the_project_keeps_are_all_there() -> None:
    assert {"idle", "busy-1", "busy-2", "scheduler-sigstop", "scheduler-sigstop-2", "detokenizer-sigstop-2",
            "prefill", "after-prefill", "after-sigkill-scheduler", "restarted-idle", "loading-run1"} <= set(PAGES)


@pytest.mark.parametrize("state", sorted(set(PAGES) - NOT_READY))
def test_adapter_matches_prometheus_client_parser(state: str) -> None:
    text = page(state)
    assert parse_text(text) == reference_snapshot(text)


# running, waiting, steps (passes over every mode), realtime tokens (every mode), requests active.
EXPECTED = {
    "idle": (0, 0, 24, 38, 0),
    "busy-1": (2, 1, 2100, 4120, 3),
    "busy-2": (2, 1, 3206, 6332, 3),
    "scheduler-sigstop": (2, 1, 3324, 6568, 3),
    "scheduler-sigstop-2": (2, 1, 3324, 6568, 3),
    "detokenizer-sigstop-2": (2, 1, 5261, 10442, 3),
    "after-prefill": (0, 0, 13, 12882, 0),
    "busy-before-kill": (2, 1, 7617, 15154, 3),
    "restarted-idle": (0, 0, 8, 19, 0),
}


@pytest.mark.parametrize("state", sorted(EXPECTED))
def test_real_page_reads_the_expected_load_and_progress(state: str) -> None:
    snap = read_page(ENGINE, Page(page(state).encode()))
    running, waiting, steps, realtime, active = EXPECTED[state]
    assert (snap.running, snap.waiting, snap.steps) == (running, waiting, steps)
    assert dict(snap.more_counters)["realtime_tokens"] == realtime
    assert dict(snap.busy_signs)["requests_active"] == active
    assert snap.pending == (running + waiting + active > 0)


def test_idle_pages_are_idle_although_num_used_tokens_is_stale_above_0() -> None:
    # num_used_tokens is refreshed at the scheduler's log points only: 4 and 12 on idle servers.
    for state in ("idle", "restarted-idle"):
        snap = parse_text(page(state))
        assert dict(snap.more_gauges)["used_tokens"] > 0
        assert not snap.pending, state


def test_a_long_chunked_prefill_reads_running_0_queued_0_yet_pending() -> None:
    snap = parse_text(page("prefill"))
    assert (snap.running, snap.waiting) == (0, 0)
    assert dict(snap.busy_signs)["requests_active"] >= 1
    assert snap.pending


def test_frozen_scheduler_pages_24_s_apart_show_work_and_no_progress() -> None:
    first, second = parse_text(page("scheduler-sigstop")), parse_text(page("scheduler-sigstop-2"))
    assert first.pending and second.pending
    assert not progressed(first, second)


def test_busy_pages_8_s_apart_progress_though_the_token_totals_stand_still() -> None:
    first, second = parse_text(page("busy-1")), parse_text(page("busy-2"))
    assert first.generation_tokens == second.generation_tokens == 24  # they move when a request ends
    assert progressed(first, second)


def test_a_frozen_detokenizer_leaves_the_scheduler_stepping() -> None:
    # Stopped 2 s and 12 s in: clients stop getting text, yet the engine's own counters move (busy).
    first, second = parse_text(page("detokenizer-sigstop")), parse_text(page("detokenizer-sigstop-2"))
    assert second.pending and progressed(first, second)


def test_loading_page_is_an_error_that_says_so() -> None:
    with pytest.raises(PageError, match="still loading") as caught:
        read_page(ENGINE, Page(page("loading-run1").encode()))
    assert caught.value.reason == "bad_metrics"


def test_killed_scheduler_page_still_shows_the_work_it_dropped() -> None:
    # Read within 0.5 s of the SIGKILL (this tier's capture): the launcher still serves the dead
    # scheduler's last values; then it hangs and, ~6 s on, refuses connections (down).
    snap = parse_text(page("after-sigkill-scheduler"))
    assert (snap.running, snap.waiting) == (2, 1) and snap.pending


def test_a_vllm_page_on_an_sglang_target_is_wrong_engine_and_back() -> None:
    with pytest.raises(PageError) as caught:
        read_page(ENGINE, Page((VLLM_FIXTURES / "vllm-0.32.0-cpu-metrics-idle.txt").read_bytes()))
    assert caught.value.reason == "wrong_engine" and "vllm" in caught.value.detail
    with pytest.raises(PageError) as caught:
        read_page(ENGINES["vllm"], Page(page("idle").encode()))
    assert caught.value.reason == "wrong_engine" and "sglang" in caught.value.detail


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("", "not an SGLang /metrics page"),
        ("sglang:num_queue_reqs 0\n", "no sglang:num_running_reqs yet"),
        ("sglang:num_running_reqs NaN\nsglang:num_queue_reqs 0\n", "is NaN"),
        ('sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\nsglang:http_requests_active{endpoint="/generate" 1\n',
         "label set"),
    ],
)
def test_bad_pages_are_bad_metrics_with_a_reason(text: str, detail: str) -> None:
    with pytest.raises(PageError, match=detail) as caught:
        parse_text(text)
    assert caught.value.reason == "bad_metrics"


def test_bytes_that_are_not_utf8_are_bad_metrics() -> None:
    with pytest.raises(PageError, match="not UTF-8"):
        ENGINE.parse(Page(b"sglang:num_running_reqs 0\n\xff"))  # type: ignore[misc]


def test_only_generation_routes_count_as_work() -> None:
    text = (
        "sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\n"
        'sglang:http_requests_active{endpoint="/metrics",method="GET"} 1.0\n'
        'sglang:http_requests_active{endpoint="/health",method="GET"} 1.0\n'
        'sglang:http_requests_active{endpoint="/v1/chat/completions",method="POST"} 0.0\n'
    )
    assert not parse_text(text).pending
    assert parse_text(text.replace('completions",method="POST"} 0.0', 'completions",method="POST"} 2.0')).pending


def test_data_parallel_ranks_are_summed() -> None:
    text = "\n".join(
        f'sglang:{name}{{tp_rank="0",dp_rank="{rank}"}} {value}'
        for rank in (0, 1)
        for name, value in (("num_running_reqs", 2), ("num_queue_reqs", 1), ("cuda_graph_passes_total", 10))
    )
    snap = parse_text(text)
    assert (snap.running, snap.waiting, snap.steps) == (4, 2, 20)


# -- the verdict over sequences of real pages, with an injected clock --------------------------------

def target() -> TargetSettings:
    return TargetSettings.model_validate(
        {"name": "s", "url": "http://127.0.0.1:1", "engine": "sglang", "stuck_after": 20, "down_after": 5,
         "startup_grace": 0}
    )


def run(rows: list[tuple[float, str | PollError]]) -> Verdict:
    verdict: Verdict | None = None
    for offset, seen in rows:
        observation = seen if isinstance(seen, PollError) else read_page(ENGINE, Page(page(seen).encode()))
        verdict = judge(verdict, observation, T0 + offset, target())
    assert verdict is not None
    return verdict


@pytest.mark.parametrize(
    ("rows", "state", "reason", "restarts"),
    [
        ([(0, "idle"), (5, "idle")], "idle", "idle", 0),
        ([(0, "idle"), (5, "busy-1"), (13, "busy-2")], "busy", "progress", 0),
        # The scheduler stops after busy-2; its page is the same frozen one on every later read.
        ([(0, "busy-2"), (3, "scheduler-sigstop"), (13, "scheduler-sigstop-2"), (27, "scheduler-sigstop-2")],
         "stuck", "no_progress", 0),
        ([(0, "busy-2"), (3, "scheduler-sigstop"), (13, "scheduler-sigstop-2")], "busy", "waiting_for_progress", 0),
        ([(0, "idle"), (5, "prefill"), (6, "prefill")], "busy", "waiting_for_progress", 0),
        # No start-time metric: the counters falling is the one restart.
        ([(0, "busy-before-kill"), (40, "restarted-idle"), (45, "restarted-idle")], "idle", "idle", 1),
        ([(0, "busy-before-kill"), (40, "restarted-idle")], "starting", "restart", 1),
        # Refused for down_after (5 s here): down. One refused read alone keeps the last state.
        ([(0, "after-sigkill-scheduler"), (1, REFUSED), (5, REFUSED)], "down", "connect", 0),
        ([(0, "after-sigkill-scheduler"), (1, REFUSED)], "busy", "progress", 0),
    ],
    ids=["idle", "busy", "frozen_scheduler_stuck", "frozen_not_yet_stuck", "prefill_busy", "restart_then_idle",
         "restart", "killed", "one_refused_read"],
)
def test_verdict_over_real_pages(rows: list[tuple[float, str | PollError]], state: str, reason: str,
                                 restarts: int) -> None:
    verdict = run(rows)
    assert (verdict.state, verdict.reason, verdict.restarts) == (state, reason, restarts)
