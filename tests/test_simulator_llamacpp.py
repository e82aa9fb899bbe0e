"""`llm-vitals-sim --engine llamacpp`: the real page's names and types, its header, health, and its hang."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_engine_llamacpp import FIXTURES, PREFIX
from test_simulator_server import LONG, cancel, eventually, fire, refused

from llm_vitals.exporter.engines import Page
from llm_vitals.exporter.engines.llamacpp import ENGINE, RESTART_HEADER
from llm_vitals.exporter.engines.table import read_page
from llm_vitals.sim.config import SimConfig
from llm_vitals.sim.fleet import Fleet

LOADED = SimConfig(engine="llamacpp", max_num_seqs=2, tokens_per_second=100, startup_seconds=0.3, die_close_delay=0.05)


def families(text: str) -> list[tuple[str, str]]:
    """(family name, type) in page order, as prometheus-client reads them."""
    return [(f.name, f.type) for f in text_string_to_metric_families(text)]


def header_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#")]


@pytest.fixture
async def client():
    async with httpx.AsyncClient(timeout=10) as c:
        yield c


async def page_of(client: httpx.AsyncClient, url: str) -> tuple[str, dict[str, float], httpx.Headers]:
    answer = await client.get(f"{url}/metrics")
    assert answer.status_code == 200
    values = {s.name: s.value for f in text_string_to_metric_families(answer.text) for s in f.samples}
    return answer.text, values, answer.headers


@pytest.mark.parametrize("state", ["idle", "busy-1", "engine-thread-frozen", "restarted-idle"])
async def test_sim_page_has_the_real_pages_families_types_help_and_order(client, state):
    real = (FIXTURES / f"{PREFIX}metrics-{state}.txt").read_text()
    async with Fleet(SimConfig(engine="llamacpp"), backends=1, control=False) as fleet:
        text, _, headers = await page_of(client, fleet.backend_urls[0])
    assert families(text) == families(real)
    assert header_lines(text) == header_lines(real)  # HELP and TYPE lines, word for word
    assert re.fullmatch(r"\d+", headers[RESTART_HEADER])


async def test_busy_sim_moves_n_decode_while_token_counters_wait_for_the_request_end(client):
    async with Fleet(LOADED, backends=1, control=False) as fleet:
        url = fleet.backend_urls[0]
        tasks = fire(client, url, 3)
        text, busy, headers = await eventually(
            lambda: _when(page_of(client, url), lambda p: p[1]["llamacpp:requests_deferred"] == 1
                          and p[1]["llamacpp:n_decode_total"] > 5),
            what="2 processing, 1 deferred, steps moving")  # fmt: skip
        snap = read_page(ENGINE, Page(text.encode(), dict(headers)))
        assert (snap.running, snap.waiting) == (2, 1)
        assert busy["llamacpp:tokens_predicted_total"] == 0 and busy["llamacpp:prompt_tokens_total"] == 0
        await cancel(tasks)
        done = await client.post(f"{url}/v1/completions", json={**LONG, "max_tokens": 5})
        assert done.status_code == 200
        _, after, _ = await page_of(client, url)
        assert after["llamacpp:tokens_predicted_total"] >= 5


async def test_sim_hang_accepts_metrics_and_never_answers_while_health_says_ok(client):
    async with Fleet(LOADED, backends=1, control=False) as fleet:
        backend, url = fleet.backends[0], fleet.backend_urls[0]
        tasks = fire(client, url, 2)
        await eventually(lambda: _when(page_of(client, url), lambda p: p[1]["llamacpp:requests_processing"] == 2),
                         what="busy")  # fmt: skip
        backend.set_fault("hang")
        # Connected (a loaded box may take its time for that), then no answer at all.
        with pytest.raises(httpx.ReadTimeout):
            await client.get(f"{url}/metrics", timeout=httpx.Timeout(10, read=0.5))
        health = await client.get(f"{url}/health")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        backend.set_fault("none")
        _, values, _ = await page_of(client, url)
        assert values["llamacpp:requests_processing"] == 2
        await cancel(tasks)


async def test_sim_freeze_inside_a_decode_answers_metrics_with_frozen_counters(client):
    async with Fleet(LOADED, backends=1, control=False) as fleet:
        backend, url = fleet.backends[0], fleet.backend_urls[0]
        tasks = fire(client, url, 2)
        await eventually(lambda: _when(page_of(client, url), lambda p: p[1]["llamacpp:requests_processing"] == 2),
                         what="busy")
        backend.set_fault("freeze")
        _, first, _ = await page_of(client, url)
        await asyncio.sleep(0.3)
        _, later, _ = await page_of(client, url)  # answered at once, as a wedged decode leaves /metrics
        assert later["llamacpp:n_decode_total"] == first["llamacpp:n_decode_total"]
        assert later["llamacpp:requests_processing"] == 2
        backend.set_fault("none")
        await eventually(lambda: _when(page_of(client, url),
                                       lambda p: p[1]["llamacpp:n_decode_total"] > first["llamacpp:n_decode_total"]),
                         what="moving again")
        await cancel(tasks)


async def test_sim_restart_resets_counters_and_changes_the_header(client):
    async with Fleet(LOADED, backends=1, control=False) as fleet:
        backend, url = fleet.backends[0], fleet.backend_urls[0]
        assert (await client.post(f"{url}/v1/completions", json={**LONG, "max_tokens": 3})).status_code == 200
        _, before, old = await page_of(client, url)
        assert before["llamacpp:n_decode_total"] > 0
        backend.set_fault("restart")
        await eventually(lambda: refused(client, url), what="port closed while loading")
        await backend.wait_phase("serving")
        _, after, new = await page_of(client, url)
        assert after["llamacpp:n_decode_total"] == 0
        assert new[RESTART_HEADER] != old[RESTART_HEADER]


async def test_sim_lists_its_model_for_the_canary(client):
    async with Fleet(SimConfig(engine="llamacpp", model="tiny-llama"), backends=1, control=False) as fleet:
        url = fleet.backend_urls[0]
        models = (await client.get(f"{url}/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["tiny-llama"]
        canary = await client.post(f"{url}/v1/completions", json={"model": "tiny-llama", "prompt": "ping", "max_tokens": 1})
        assert canary.status_code == 200


async def _when(read, condition):
    result = await read
    return result if condition(result) else None

