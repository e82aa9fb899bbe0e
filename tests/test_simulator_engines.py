"""The simulator's engine table: every entry serves a page its exporter adapter reads, and the health
routes the exporter's table counts."""

from __future__ import annotations

import httpx
import pytest

from llm_vitals.exporter.engines import Page
from llm_vitals.exporter.engines.table import ENGINES, read_page
from llm_vitals.sim.cli import build_parser
from llm_vitals.sim.config import SimConfig
from llm_vitals.sim.engines.table import SIM_ENGINES
from llm_vitals.sim.fleet import Fleet


def test_every_simulated_engine_is_an_engine_of_the_exporter() -> None:
    assert "vllm" in SIM_ENGINES and set(SIM_ENGINES) <= set(ENGINES)


def test_an_unknown_engine_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="no engine 'nope'"):
        Fleet(SimConfig(engine="nope"))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--engine", "nope"])


@pytest.mark.parametrize("name", sorted(SIM_ENGINES))
async def test_each_simulated_engine_serves_its_page_and_health_routes(name: str) -> None:
    entry = SIM_ENGINES[name]
    async with Fleet(SimConfig(engine=name), backends=1, control=False) as fleet:
        url = fleet.backend_urls[0]
        async with httpx.AsyncClient(timeout=10) as client:
            page = await client.get(url + entry.metrics_path)
            assert page.status_code == 200
            snapshot = read_page(ENGINES[name], Page(page.content, dict(page.headers)))
            assert not snapshot.pending
            served = {path for path, _ in entry.health}
            assert set(ENGINES[name].health_paths) <= served
            for path in served:
                assert (await client.get(url + path)).status_code == 200, path
