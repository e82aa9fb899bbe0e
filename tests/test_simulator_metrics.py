"""The simulator's /metrics page against the real vLLM 0.32 pages in tests/fixtures/vllm/."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from conftest import VLLM_FIXTURES, read_fixture
from prometheus_client.parser import text_string_to_metric_families

from llm_vitals.sim.config import SimConfig
from llm_vitals.sim.engine import Engine, SimRequest
from llm_vitals.sim.fleet import Fleet
from llm_vitals.sim.metrics import HttpStats, VllmCollector, render

REAL_PAGES = ["vllm-0.32.0-cpu-metrics-idle.txt", "vllm-0.32.0-cpu-metrics-busy.txt"]
# The configuration of the captured server, so that even bucket bounds and info labels can match.
CAPTURED = SimConfig(max_num_seqs=2, max_model_len=1024, block_size=128, kv_cache_tokens=524288)


def families(text: str) -> dict[str, tuple[str, set[tuple[str, frozenset[str]]]]]:
    """family name -> (type, {(sample name, label names)})."""
    out = {}
    for family in text_string_to_metric_families(text):
        shapes = {(s.name, frozenset(s.labels)) for s in family.samples}
        out[family.name] = (family.type, shapes)
    return out


def busy_page(config: SimConfig = CAPTURED) -> str:
    engine = Engine(config)
    for i in range(8):
        engine.add_request(SimRequest(f"r{i}", prompt_tokens=21, max_tokens=20), 0.0)
    for t in range(30):
        engine.step(t * 0.01)
    http = HttpStats(created=time.time())
    http.record("/v1/models", "GET", 200, 0, 461, 0.002, time.time())
    http.record("/v1/chat/completions", "POST", 200, 87, 759, 0.14, time.time())
    return render(VllmCollector(config, engine, http, time.time() - 40, time.time())).decode()


@pytest.mark.parametrize("fixture", REAL_PAGES)
def test_every_vllm_family_of_the_real_page_exists_with_the_same_type_and_labels(fixture):
    real = families(read_fixture(fixture))
    simulated = families(busy_page())
    vllm_families = [name for name in real if name.startswith("vllm:")]
    assert len(vllm_families) > 40
    for name in vllm_families:
        assert name in simulated, f"{name} missing from the simulator's page"
        real_type, real_shapes = real[name]
        sim_type, sim_shapes = simulated[name]
        assert sim_type == real_type, name
        assert {labels for _, labels in sim_shapes} == {labels for _, labels in real_shapes}, name
        assert {sample for sample, _ in sim_shapes} == {sample for sample, _ in real_shapes}, name


def test_page_has_the_real_text_layout_help_and_process_families():
    # With the captured server's configuration, every HELP/TYPE line is identical, in the same order,
    # and every sample line carries the same name and labels (only the values differ).
    real = read_fixture("vllm-0.32.0-cpu-metrics-busy.txt")
    ours = busy_page()

    def comments(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith("# ")]

    def sample_keys(text: str) -> list[str]:
        return [re.sub(r" \S+$", "", line) for line in text.splitlines()
                if line and not line.startswith("#") and not line.startswith("python_info")]

    assert comments(ours) == comments(real)
    assert sample_keys(ours) == sample_keys(real)


def test_real_pages_parse_and_name_the_families_the_exporter_reads():
    for fixture in REAL_PAGES:
        names = set(families(read_fixture(fixture)))
        for wanted in ("vllm:num_requests_running", "vllm:iteration_tokens_total", "vllm:kv_cache_usage_perc",
                       "vllm:request_success", "process_start_time_seconds"):
            assert wanted in names


async def test_metrics_route_serves_the_real_content_type_and_live_values():
    real_headers = (VLLM_FIXTURES / "vllm-0.32.0-cpu-metrics-idle.headers.txt").read_text().lower()
    async with Fleet(SimConfig(max_num_seqs=2), backends=1, control=False) as fleet:
        backend = fleet.backends[0]
        async with httpx.AsyncClient(timeout=10) as client:
            await client.post(f"{fleet.backend_urls[0]}/v1/completions",
                              json={"model": "tiny", "prompt": "hello", "max_tokens": 3, "ignore_eos": True})
            response = await client.get(f"{fleet.backend_urls[0]}/metrics")
    content_type = response.headers["content-type"]
    assert f"content-type: {content_type}" in real_headers
    page = response.text
    values = {(s.name, s.labels.get("finished_reason")): s.value
              for f in text_string_to_metric_families(page) for s in f.samples}
    assert values[("vllm:generation_tokens_total", None)] == 3
    assert values[("vllm:request_success_total", "length")] == 1
    assert values[("vllm:iteration_tokens_total_count", None)] == 3
    assert values[("process_start_time_seconds", None)] == pytest.approx(backend.state()["process_start_time"],
                                                                         abs=0.01)
    assert 'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0' in page
    assert 'http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 1.0' in page
