"""`llm-vitals-sim --engine sglang` against the real SGLang 0.5.23 pages, and its faults as the adapter reads them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llm_vitals.exporter.engines import Page, PageReading
from llm_vitals.exporter.engines.sglang import ENGINE
from llm_vitals.exporter.engines.table import read_page
from llm_vitals.exporter.verdict import progressed
from llm_vitals.sim.config import SimConfig
from llm_vitals.sim.engines import sglang as sim_sglang
from llm_vitals.sim.fleet import Fleet

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sglang"
REAL_PAGES = ["sglang-0.5.23-cpu-metrics-idle.txt", "sglang-0.5.23-cpu-metrics-busy-1.txt"]
ADAPTER_FAMILIES = {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_used_tokens",
                    "sglang:realtime_tokens", "sglang:cuda_graph_passes", "sglang:generation_tokens",
                    "sglang:prompt_tokens", "sglang:num_requests", "sglang:http_requests_active"}
CONFIG = SimConfig(engine="sglang", model="tiny-llama", max_num_seqs=2, max_num_batched_tokens=64,
                   tokens_per_second=200.0, prefill_tokens_per_second=400.0)


def families(text: str) -> dict[str, tuple[str, dict[str, frozenset[str]]]]:
    """family name -> (type, {sample name: label names})."""
    out = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = (family.type, {s.name: frozenset(s.labels) for s in family.samples})
    return out


async def read(client: httpx.AsyncClient, url: str) -> tuple[str, PageReading]:
    text = (await client.get(url + "/metrics")).text
    return text, read_page(ENGINE, Page(text.encode()))


async def wait_for(client: httpx.AsyncClient, url: str, condition, timeout: float = 10.0) -> PageReading:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        _, snap = await read(client, url)
        if condition(snap):
            return snap
        assert asyncio.get_running_loop().time() < deadline, f"condition never held; last {snap}"
        await asyncio.sleep(0.02)


def completion(max_tokens: int, prompt_words: int = 1) -> dict:
    return {"model": "tiny-llama", "prompt": "word " * prompt_words, "max_tokens": max_tokens, "ignore_eos": True}


@pytest.mark.parametrize("fixture", REAL_PAGES)
async def test_every_family_served_is_on_the_real_page_with_the_same_type_and_labels(fixture: str) -> None:
    real = families((FIXTURES / fixture).read_text())
    async with Fleet(CONFIG, backends=1, control=False) as fleet, httpx.AsyncClient(timeout=10) as client:
        url = fleet.backend_urls[0]
        await client.post(url + "/v1/completions", json=completion(3))
        simulated = families((await client.get(url + "/metrics")).text)
    assert set(simulated) >= ADAPTER_FAMILIES
    for name, (kind, samples) in simulated.items():
        assert name in real, f"{name} is not on the real page"
        real_kind, real_samples = real[name]
        assert kind == real_kind, name
        for sample, labels in samples.items():
            assert sample in real_samples and labels == real_samples[sample], (name, sample, labels)


async def test_idle_then_busy_then_hung_reads_as_on_the_real_server() -> None:
    async with Fleet(CONFIG, backends=1, control=False) as fleet, httpx.AsyncClient(timeout=30) as client:
        backend, url = fleet.backends[0], fleet.backend_urls[0]
        _, idle = await read(client, url)
        assert not idle.pending
        load = [asyncio.create_task(client.post(url + "/v1/completions", json=completion(400))) for _ in range(3)]
        busy = await wait_for(client, url, lambda s: s.running == 2 and s.waiting == 1)
        assert dict(busy.busy_signs)["requests_active"] == 3
        later = await wait_for(client, url, lambda s: progressed(busy, s))
        assert later.generation_tokens == 0, "token totals move only when a request ends"
        backend.set_fault("hang")
        frozen, _ = await read(client, url)
        await asyncio.sleep(0.2)
        again, _ = await read(client, url)
        assert frozen == again, "a hung scheduler's page is frozen"
        backend.set_fault("none")
        await asyncio.gather(*load)
        done = await wait_for(client, url, lambda s: not s.pending)
        assert done.finished == 3


async def test_a_long_prompt_being_chunked_is_neither_running_nor_queued_yet_pending() -> None:
    async with Fleet(CONFIG, backends=1, control=False) as fleet, httpx.AsyncClient(timeout=30) as client:
        url = fleet.backend_urls[0]
        task = asyncio.create_task(client.post(url + "/v1/completions", json=completion(1, prompt_words=1500)))
        chunking = await wait_for(client, url, lambda s: dict(s.more_gauges).get("used_tokens", 0) > 0)
        assert (chunking.running, chunking.waiting) == (0, 0)
        assert chunking.pending
        assert (await task).status_code == 200


async def test_health_is_503_only_after_its_timeout_while_hung(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim_sglang, "HEALTH_TIMEOUT_S", 0.3)
    async with Fleet(CONFIG, backends=1, control=False) as fleet, httpx.AsyncClient(timeout=10) as client:
        backend, url = fleet.backends[0], fleet.backend_urls[0]
        assert (await client.get(url + "/health")).status_code == 200
        backend.set_fault("hang")
        began = asyncio.get_running_loop().time()
        assert (await client.get(url + "/health_generate")).status_code == 503
        assert asyncio.get_running_loop().time() - began >= 0.3
        assert (await client.get(url + "/metrics")).status_code == 200, "HTTP stays alive"


async def test_a_restart_resets_the_counters_and_there_is_no_start_time() -> None:
    async with Fleet(CONFIG.model_copy(update={"startup_seconds": 0.0}), backends=1, control=False) as fleet, \
            httpx.AsyncClient(timeout=10) as client:
        backend, url = fleet.backends[0], fleet.backend_urls[0]
        await client.post(url + "/v1/completions", json=completion(5))
        text, before = await read(client, url)
        assert "start_time" not in text
        await backend.restart()
        _, after = await read(client, url)
        assert after.finished == 0 < before.finished


# -- the real exporter polling a simulated SGLang: the engine table end to end -----------------------

async def test_exporter_reads_a_chunked_prefill_as_busy_with_no_canary_then_a_hang_as_stuck(aiohttp_client) -> None:
    from test_exporter_helpers import make_settings, make_target, record, start_exporter
    from test_exporter_helpers import wait_for as until

    config = CONFIG.model_copy(update={"max_num_batched_tokens": 32, "prefill_tokens_per_second": 200.0,
                                       "startup_seconds": 0.2})  # fmt: skip
    async with Fleet(config, backends=1, control=False) as fleet, httpx.AsyncClient(timeout=30) as http:
        url = fleet.backend_urls[0]
        client = await start_exporter(aiohttp_client, make_settings(
            [make_target("sg", url, engine="sglang", canary={"interval": 0.3, "timeout": 2})], poll_interval=0.1))
        rec = record(client, "sg")
        await until(lambda: rec.canaries["ok"] >= 1, what="an idle canary")
        # ~1500 prompt tokens in chunks of 32 at 200 tokens/s: ~7 s of prefill, running 0 and queued 0.
        prompt = asyncio.create_task(http.post(url + "/v1/completions", json=completion(1, prompt_words=1500)))
        await until(lambda: rec.verdict.state == "busy" and rec.verdict.snapshot.running == 0, what="busy at running 0")
        canaries, polls = sum(rec.canaries.values()), rec.polls
        states = set()
        while not prompt.done():
            states.add(rec.verdict.state)
            await asyncio.sleep(0.05)
        assert (await prompt).status_code == 200
        assert rec.polls - polls >= 5 and states == {"busy"}, states
        assert sum(rec.canaries.values()) == canaries, "a canary was sent during the prefill"
        load = asyncio.create_task(http.post(url + "/v1/completions", json=completion(2000)))
        await until(lambda: rec.verdict.state == "busy" and rec.verdict.snapshot.running == 1, what="decoding")
        fleet.backends[0].set_fault("hang")
        await until(lambda: rec.verdict.state == "stuck", timeout=10, what="stuck")
        assert rec.verdict.reason == "no_progress"
        fleet.backends[0].set_fault("restart")
        await until(lambda: rec.verdict.restarts == 1 and rec.verdict.state == "idle", timeout=10, what="one restart")
        load.cancel()
