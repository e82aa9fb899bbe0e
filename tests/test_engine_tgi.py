"""The TGI adapter on pages built from TGI's metric definitions (never a live TGI: see its docstring)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tgi_pages import FIXTURES, PAGES, render

from llm_vitals.exporter.engines import Page, PageError, PageReading
from llm_vitals.exporter.engines.table import ENGINES, read_page
from llm_vitals.exporter.engines.tgi import parse_text
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import Verdict, judge

TGI = ENGINES["tgi"]


def page(name: str) -> str:
    return (FIXTURES / f"tgi-from-source-metrics-{name}.txt").read_text()


def test_the_fixture_pages_are_what_the_builder_writes() -> None:
    for name, state in PAGES.items():
        assert page(name) == render(state), f"tests/fixtures/tgi/ is stale: run python tests/tgi_pages.py ({name})"


@pytest.mark.parametrize("name,running,waiting,steps,finished", [
    ("idle", 0, 0, None, None),
    ("idle-after-one-request", 0, 0, 64, 1),
    ("busy-1", 2, 1, 453, 1),
    ("busy-2", 2, 1, 711, 1),
    ("frozen", 2, 1, 711, 1),
    ("restarted-idle", 0, 0, 1, 1),
])
def test_each_page_reads_as_the_client_reads_it(name: str, running: float, waiting: float,
                                                steps: float | None, finished: float | None) -> None:
    snap = read_page(TGI, Page(page(name).encode()))
    assert (snap.running, snap.waiting, snap.steps, snap.finished) == (running, waiting, steps, finished)
    # prometheus-client reads the same page (it names the counters ..._total, as it does any counter).
    samples = {s.name: s.value for f in text_string_to_metric_families(page(name)) for s in f.samples
               if s.name in ("tgi_queue_size", "tgi_batch_current_size", "tgi_request_success_total")}
    assert samples.get("tgi_queue_size", 0) == waiting and samples.get("tgi_batch_current_size", 0) == running
    assert samples.get("tgi_request_success_total") == finished


def test_arrival_counters_are_not_progress() -> None:
    # tgi_request_count and the input lengths move when a request arrives: a hung shard with traffic
    # must still read stuck.
    busy = page("frozen")
    more = busy.replace("tgi_request_count 4", "tgi_request_count 9")
    assert parse_text(busy) == parse_text(more)


def run(names: list[str], stuck_after: float = 10) -> Verdict:
    settings = TargetSettings.model_validate({"name": "t", "url": "http://127.0.0.1:1", "engine": "tgi",
                                              "stuck_after": stuck_after, "startup_grace": 0})
    verdict = None
    for i, name in enumerate(names):
        verdict = judge(verdict, read_page(TGI, Page(page(name).encode())), 1000.0 + 6 * i, settings)
    assert verdict is not None
    return verdict


def test_busy_pages_read_busy_frozen_ones_stuck_and_a_restart_counts_once() -> None:
    assert (run(["busy-1", "busy-2"]).state, run(["busy-1", "busy-2"]).reason) == ("busy", "progress")
    stuck = run(["busy-1", "busy-2", "frozen", "frozen"])
    assert (stuck.state, stuck.reason) == ("stuck", "no_progress")
    restarted = run(["busy-1", "busy-2", "restarted-idle", "restarted-idle"])
    assert (restarted.state, restarted.restarts) == ("idle", 1)
    assert run(["idle", "idle"]).state == "idle"


@pytest.mark.parametrize("body,reason", [
    (b"", "bad_metrics"),
    (b"<html>502</html>", "bad_metrics"),
    (b"tgi_queue_size NaN\n", "bad_metrics"),
    (b'vllm:num_requests_running{engine="0"} 1\nvllm:num_requests_waiting 0\n', "wrong_engine"),
])
def test_bad_pages_are_page_errors(body: bytes, reason: str) -> None:
    with pytest.raises(PageError) as caught:
        read_page(TGI, Page(body))
    assert caught.value.reason == reason


def test_a_page_with_only_the_startup_gauge_is_idle() -> None:
    assert read_page(TGI, Page(page("idle").encode())) == PageReading(0.0, 0.0)


async def test_the_simulated_tgi_page_has_the_families_and_types_of_the_built_pages() -> None:
    import httpx

    from llm_vitals.sim.config import SimConfig
    from llm_vitals.sim.fleet import Fleet

    def shapes(text: str) -> dict[str, str]:
        return {f.name: f.type for f in text_string_to_metric_families(text)}

    async with Fleet(SimConfig(engine="tgi", tokens_per_second=50), backends=1, control=False) as fleet:
        url = fleet.backend_urls[0]
        async with httpx.AsyncClient(timeout=10) as client:
            assert shapes((await client.get(url + "/metrics")).text) == shapes(page("idle"))
            body = {"model": "tiny", "prompt": "hello", "max_tokens": 3}
            assert (await client.post(url + "/v1/completions", json=body)).status_code == 200
            text = (await client.get(url + "/metrics")).text
    assert shapes(text) == shapes(page("idle-after-one-request"))
    snap = read_page(TGI, Page(text.encode()))
    assert snap.finished == 1 and snap.steps is not None and snap.steps >= 3 and not snap.pending
