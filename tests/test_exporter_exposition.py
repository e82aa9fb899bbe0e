"""The exporter's own text renderer against prometheus-client's, byte for byte, on a varied store.

The page rendered whole (tests/whole_page.py: `render_families`, the reference the served page is
checked against in tests/test_page_cache.py) is held here to prometheus-client's output for
`VitalsCollector` (the same FAMILIES table), which it must never drift from.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from whole_page import VitalsCollector, render_families, render_vitals

from llm_vitals.exporter.collector import FAMILIES, read
from llm_vitals.exporter.engines import PageReading
from llm_vitals.exporter.gpu_faults import GpuFault, GpuFaultState, SourceRead
from llm_vitals.exporter.settings import parse_settings
from llm_vitals.exporter.state import StateStore, TargetRecord
from llm_vitals.exporter.verdict import CanaryOutcome, record_canary

NOW = 1_800_000_000.25


def varied_store() -> StateStore:
    """Targets in every shape a scrape meets: unpolled, busy, stuck, down, draining, GPU fault, odd counts."""
    targets = [{"name": f"t{i}", "url": f"http://10.0.0.{i}:8000/v{i}"} for i in range(6)]
    targets.append({"name": "proxy", "url": "https://user:pw@lb.example:443/", "role": "proxy", "engine": "openai"})
    store = StateStore(parse_settings({"targets": targets}, environ={}), NOW - 600)
    records = list(store)
    busy = PageReading(running=3, waiting=12, steps=1e12, generation_tokens=5, process_start_time=NOW - 3600.5)
    poll(records[1], NOW - 1, state="busy", up=True, snapshot=busy, last_poll=NOW - 1, steps_per_second=31.5,
         generation_tokens_per_second=1234.5678, restarts=2, last_canary_ok=NOW - 90)
    poll(records[2], NOW - 1, state="stuck", up=True, snapshot=busy, last_poll=NOW - 1, last_progress=NOW - 75.125)
    poll(records[3], NOW - 2, state="down", up=False, snapshot=busy, last_poll=NOW - 2, error_reason="timeout")
    for reason in ["timeout"] * 6 + ["connect"]:
        records[3].count_poll_error(reason)
    records[4].set_draining(True)
    records[4].set_gpu_faults(GpuFaultState({"file": SourceRead(GpuFault("file", "Xid 79"))}))
    for _ in range(3):
        records[5].count_poll_error('we"ird\\reason\n')  # escaping of label values
    for result, count in {"ok": 41, "error": 2, "timeout": 1}.items():
        for _ in range(count):
            canary(records[5], result)
    poll(records[5], NOW - 1, duration=0.0123)
    return store


def poll(record: TargetRecord, now: float, duration: float = 0.0021, **verdict) -> None:
    """A poll that leaves the record's verdict with these fields changed."""
    record.record_poll(replace(record.verdict, **verdict), now, duration)


def canary(record: TargetRecord, result: str) -> None:
    record.record_canary(result, record_canary(record.verdict, CanaryOutcome(result), NOW - 30, record.settings))


def reference(store: StateStore) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(VitalsCollector(store, clock=lambda: NOW))
    return generate_latest(registry)


def test_render_matches_prometheus_client_byte_for_byte() -> None:
    store = varied_store()
    assert render_vitals(store, NOW).encode() == reference(store)


def test_render_matches_on_an_empty_looking_fleet_too() -> None:
    store = StateStore(parse_settings({"targets": [{"name": "only", "url": "http://127.0.0.1:9"}]}, environ={}), NOW)
    assert render_vitals(store, NOW).encode() == reference(store)


def test_the_page_parses_and_carries_the_varied_facts() -> None:
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(render_vitals(varied_store(), NOW))
               for s in family.samples}
    assert samples[("llm_vitals_state", (("state", "stuck"), ("target", "t2")))] == 1
    assert samples[("llm_vitals_stuck_seconds", (("target", "t2"),))] == pytest.approx(75.125)
    assert samples[("llm_vitals_restarts_total", (("target", "t1"),))] == 2
    assert samples[("llm_vitals_poll_errors_total", (("reason", 'we"ird\\reason\n'), ("target", "t5")))] == 3
    assert ("llm_vitals_requests_running", (("target", "t3"),)) not in samples  # down: no stale reading
    assert samples[("llm_vitals_gpu_fault", (("target", "t4"),))] == 1
    assert samples[("llm_vitals_exporter_targets", ())] == 7
    # The proxy's credentials never reach a label.
    assert not [labels for _, labels in samples if any("pw" in value for _, value in labels)]


def test_one_piece_per_family_then_the_target_count() -> None:
    pieces = list(render_families([read(record, NOW) for record in varied_store()], NOW))
    assert len(pieces) == len(FAMILIES) + 1
    for family, piece in zip(FAMILIES, pieces, strict=False):
        assert piece.startswith(f"# HELP {family.name} ")
    assert pieces[-1].startswith("# HELP llm_vitals_exporter_targets ")


def test_a_poll_landing_mid_page_does_not_change_a_page_of_readings() -> None:
    # The /metrics route hands the loop back between families; a poll may run in that gap.
    store = varied_store()
    before = render_vitals(varied_store(), NOW)
    pieces = render_families([read(record, NOW) for record in store], NOW)
    first = next(pieces)
    poll(store.get("t2"), NOW, state="busy", last_progress=NOW)  # the stuck target moves again
    store.get("t3").count_poll_error("timeout")
    canary(store.get("t5"), "ok")
    assert first + "".join(pieces) == before
    assert render_vitals(store, NOW) != before  # the next scrape sees the poll
