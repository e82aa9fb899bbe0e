"""The engine table: one entry per `engine:` value, where its metrics live, and pages of the wrong engine."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from conftest import REPO, VLLM_FIXTURES

from llm_vitals.exporter.engines import Page, PageError
from llm_vitals.exporter.engines.table import ENGINES, engine_of, identify, read_page
from llm_vitals.exporter.settings import EngineName, TargetSettings
from llm_vitals.exporter.verdict import PollError, judge

IDLE_PAGE = (VLLM_FIXTURES / "vllm-0.32.0-cpu-metrics-idle.txt").read_bytes()
LLAMACPP_PAGE = b"""# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
llamacpp:requests_deferred 0
llamacpp:n_decode_total 12
"""


def target(**overrides: object) -> TargetSettings:
    config: dict[str, object] = {"name": "t", "url": "http://10.0.0.5:8000"}
    config.update(overrides)
    return TargetSettings.model_validate(config)


def test_the_config_admits_exactly_the_engines_of_the_table() -> None:
    assert set(typing.get_args(EngineName)) == set(ENGINES)
    assert all(entry.name == name for name, entry in ENGINES.items())


@pytest.mark.parametrize("engine,overrides,url", [
    ("vllm", {}, "http://10.0.0.5:8000/metrics"),
    ("llamacpp", {"url": "http://10.0.0.5:8080/"}, "http://10.0.0.5:8080/metrics"),
    # Triton serves its metrics on their own port of the same host.
    ("triton", {}, "http://10.0.0.5:8002/metrics"),
    ("triton", {"url": "https://[fd00::1]:8000"}, "https://[fd00::1]:8002/metrics"),
    ("triton", {"metrics_url": "http://10.0.0.9:9002/m"}, "http://10.0.0.9:9002/m"),
    ("vllm", {"metrics_url": "http://10.0.0.5:9000/metrics"}, "http://10.0.0.5:9000/metrics"),
])
def test_each_engine_says_where_its_metrics_live(engine: str, overrides: dict[str, object], url: str) -> None:
    assert engine_of(engine).metrics_url(target(engine=engine, **overrides)) == url


def test_only_openai_has_no_page_and_every_other_engine_a_distinct_signature() -> None:
    assert [name for name, entry in ENGINES.items() if entry.parse is None] == ["openai"]
    signatures = [entry.signature for entry in ENGINES.values() if entry.parse is not None]
    assert None not in signatures and len(set(signatures)) == len(signatures)


@pytest.mark.parametrize("declared,page,owner", [
    ("llamacpp", IDLE_PAGE, "vllm"),
    ("sglang", IDLE_PAGE, "vllm"),
    ("triton", IDLE_PAGE, "vllm"),
    ("tgi", IDLE_PAGE, "vllm"),
    ("vllm", LLAMACPP_PAGE, "llamacpp"),
])
def test_a_page_of_the_wrong_engine_is_down_naming_the_mismatch(declared: str, page: bytes, owner: str) -> None:
    assert identify(page) == owner
    with pytest.raises(PageError) as caught:
        read_page(engine_of(declared), Page(page))
    assert caught.value.reason == "wrong_engine"
    assert f"declared {declared}" in caught.value.detail and f"{owner}'s" in caught.value.detail
    # Fed to the verdict as the poller does: down with that reason, never idle, never a crash.
    settings = target(engine=declared, startup_grace=0)
    verdict = judge(None, PollError(caught.value.reason, caught.value.detail), 1000.0, settings)
    assert (verdict.state, verdict.reason) == ("down", "wrong_engine")


def test_a_page_of_no_known_engine_is_left_to_the_adapter() -> None:
    with pytest.raises(PageError) as caught:
        read_page(engine_of("vllm"), Page(b"<html>502 Bad Gateway</html>"))
    assert caught.value.reason == "bad_metrics"


def test_the_restart_header_becomes_an_opaque_token_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from llm_vitals.exporter.engines import PageReading

    entry = replace(engine_of("llamacpp"), parse=lambda page: PageReading(0, 0))
    assert entry.restart_header == "Process-Start-Time-Unix"
    snap = read_page(entry, Page(LLAMACPP_PAGE, {"process-start-time-unix": " 1571301719 "}))
    assert snap.restart_token == "1571301719"
    assert read_page(entry, Page(LLAMACPP_PAGE, {})).restart_token is None


def test_vllm_pages_carry_no_token() -> None:
    assert read_page(engine_of("vllm"), Page(IDLE_PAGE, {"Process-Start-Time-Unix": "1"})).restart_token is None


@pytest.mark.parametrize("path", ["llm_vitals/exporter/poller.py", "llm_vitals/exporter/canary.py", "llm_vitals/exporter/state.py",
                                  "llm_vitals/exporter/collector.py",
                                  *sorted(str(p.relative_to(REPO)) for p in (REPO / "llm_vitals/exporter/verdict").glob("*.py"))])
def test_no_module_outside_the_table_branches_on_an_engine_name(path: str) -> None:
    text = Path(REPO / path).read_text()
    assert not re.search(r"""engine\s*(==|!=|in)\s*["'(\[]""", text), f"{path} branches on an engine name"


def test_a_snapshots_signals_are_its_progress_and_monotone_fields_in_order_then_the_engines_own() -> None:
    from llm_vitals.exporter.engines import PageReading

    snap = PageReading(1, 2, steps=3, generation_tokens=4, prompt_tokens=5, finished=6, kv_usage=0.5,
                       more_counters=(("realtime_tokens", 7.0),), more_gauges=(("used_tokens", 8.0),))
    fixed = {name: getattr(snap, name) for name in PageReading.PROGRESS}
    assert list(snap.counters().items()) == [*fixed.items(), ("realtime_tokens", 7.0), ("used_tokens", 8.0)]
    assert list(snap.monotone.items()) == [*((name, fixed[name]) for name in PageReading.MONOTONE), ("realtime_tokens", 7.0)]
    assert list(PageReading(0, 0).counters()) == list(PageReading.PROGRESS)
