"""The simulator's Triton (`llm-vitals-sim --engine triton`) against the real Triton 2.51 pages.

Same metric names, types and label names as the real page; only queued requests show; the counters
move when requests complete; v2 health and infer routes answer, `/v1/models` does not.
"""

from __future__ import annotations

import asyncio

import httpx
from conftest import FIXTURES
from prometheus_client.parser import text_string_to_metric_families
from test_exporter_helpers import make_settings, make_target, record, start_exporter, wait_for

from llm_vitals.exporter.engines import Page
from llm_vitals.exporter.engines.table import engine_of, read_page
from llm_vitals.sim.config import SimConfig
from llm_vitals.sim.engines.triton import exporter_target
from llm_vitals.sim.fleet import Fleet

REAL_IDLE = (FIXTURES / "triton" / "triton-2.51.0-cpu-metrics-idle.txt").read_text()
INFER = {"inputs": [{"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [3]}]}


def shape(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """family name -> (type, label names of its samples), as prometheus-client reads the page."""
    return {
        family.name: (family.type, frozenset(name for s in family.samples for name in s.labels))
        for family in text_string_to_metric_families(text)
    }


async def test_the_simulated_page_has_the_real_pages_names_types_and_labels() -> None:
    async with Fleet(SimConfig(engine="triton"), backends=1, control=False) as fleet, httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(fleet.backend_urls[0] + "/metrics")).text
    assert shape(text) == shape(REAL_IDLE)
    # In Triton's order, and its counters as written (no `_total`), which prometheus-client hides.
    real_names = [line.split()[2] for line in REAL_IDLE.splitlines() if line.startswith("# TYPE")]
    assert [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")] == real_names


async def test_simulated_triton_serves_v2_routes_and_counts_completed_infers() -> None:
    config = SimConfig(engine="triton", max_num_seqs=1)
    async with Fleet(config, backends=1, control=False) as fleet:
        url = fleet.backend_urls[0]
        async with httpx.AsyncClient(timeout=30) as client:
            for path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{config.model}/ready"):
                assert (await client.get(url + path)).status_code == 200, path
            assert (await client.get(url + "/v2/models/nope/ready")).status_code == 404
            assert (await client.get(url + "/v1/models")).status_code == 404
            answers = await asyncio.gather(*(client.post(f"{url}/v2/models/{config.model}/infer", json=INFER)
                                             for _ in range(3)))
            assert [a.json()["outputs"][0]["data"] for a in answers] == [[3]] * 3
            bad = await client.post(f"{url}/v2/models/{config.model}/infer", json={"inputs": []})
            assert bad.status_code == 400
            page = await client.get(url + "/metrics")
    snap = read_page(engine_of("triton"), Page(page.content))
    assert (snap.running, snap.waiting, snap.steps, snap.finished) == (0, 0, 3, 3)


async def test_simulated_triton_shows_only_queued_work_and_a_hang_freezes_its_counters() -> None:
    config = SimConfig(engine="triton", max_num_seqs=1)
    long = {"inputs": [{"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [200]}]}
    async with Fleet(config, backends=1, control=False) as fleet:
        url = fleet.backend_urls[0]
        async with httpx.AsyncClient(timeout=30) as client:
            load = [asyncio.create_task(client.post(f"{url}/v2/models/{config.model}/infer", json=long)) for _ in range(3)]
            await asyncio.sleep(0.3)
            fleet.backends[0].set_fault("hang")
            first = read_page(engine_of("triton"), Page((await client.get(url + "/metrics")).content))
            await asyncio.sleep(0.5)
            second = read_page(engine_of("triton"), Page((await client.get(url + "/metrics")).content))
            assert (await client.get(url + "/v2/health/live")).status_code == 200
            fleet.backends[0].set_fault("none")
            await asyncio.gather(*load)
    # One runs (invisible on a Triton page), two are queued; while hung nothing moves.
    assert (first.running, first.waiting) == (0, 2)
    assert first == second


async def test_the_exporter_judges_a_simulated_triton_by_its_page_model_route_and_v2_canary(aiohttp_client) -> None:
    # One Triton with its model (idle, canaries ok) and one whose configured model is not served:
    # its page reads idle, but its /v2/models/<m>/ready is 404, so it is down and gets no canary.
    async with Fleet(SimConfig(engine="triton"), backends=1, control=False) as fleet:
        url = fleet.backend_urls[0]
        good = make_target("good", url, engine="triton", **exporter_target(url, "tiny"))
        wrong = make_target("wrong", url, engine="triton", **{**exporter_target(url, "tiny"), "model": "nope"})
        for t in (good, wrong):
            t["canary"] = {**t["canary"], "interval": 0.5, "timeout": 2}
        client = await start_exporter(aiohttp_client, make_settings([good, wrong], poll_interval=0.2))
        ok, bad = record(client, "good"), record(client, "wrong")
        await wait_for(lambda: ok.canaries["ok"] >= 2, what="two v2 infer canaries answered")
        await wait_for(lambda: bad.verdict.state == "down", what="the unserved model read down")
    assert ok.verdict.state == "idle" and ok.canaries["error"] == 0
    assert "/v2/models/nope/ready answered HTTP 404" in bad.verdict.detail
    assert sum(bad.canaries.values()) == 0
