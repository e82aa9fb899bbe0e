"""The vLLM adapter against prometheus-client's parser on every real page, and against bad pages."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import VLLM_FIXTURES
from prometheus_client.parser import text_string_to_metric_families

from llm_vitals.exporter.engines import PageError, PageReading, Unit
from llm_vitals.exporter.engines.vllm import parse_page, parse_text
from llm_vitals.exporter.verdict import progressed

PAGES = sorted(p.name for p in VLLM_FIXTURES.glob("vllm-*-metrics-*.txt") if not p.name.endswith(".headers.txt"))


def reference_snapshot(text: str) -> PageReading:
    """The same PageReading, built with prometheus-client's full parser (samples looked up by full name)."""
    samples: dict[str, list[float]] = {}
    per_engine: dict[str, dict[str, float]] = {}
    deferred: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample.value)
            engine = sample.labels.get("engine", "")
            by_engine = per_engine.setdefault(sample.name, {})
            by_engine[engine] = by_engine.get(engine, 0.0) + sample.value
            if sample.name == "vllm:num_requests_waiting_by_reason" and sample.labels.get("reason") == "deferred":
                deferred[engine] = deferred.get(engine, 0.0) + sample.value

    def total(name: str) -> float | None:
        return sum(samples[name]) if name in samples else None

    kv_name = "vllm:kv_cache_usage_perc" if "vllm:kv_cache_usage_perc" in samples else "vllm:gpu_cache_usage_perc"
    kv = samples.get(kv_name)
    engines = list(per_engine.get("vllm:num_requests_running", {}))
    counters = ("vllm:iteration_tokens_total_count", "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
                "vllm:request_success_total")
    itl = next((n for n in ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
                if f"{n}_sum" in samples and f"{n}_count" in samples), None)

    def unit_pace(engine: str) -> tuple[float, float] | None:
        if itl is None or engine not in per_engine[f"{itl}_sum"] or engine not in per_engine[f"{itl}_count"]:
            return None
        return per_engine[f"{itl}_sum"][engine], per_engine[f"{itl}_count"][engine]

    units = tuple(
        Unit(f'engine="{engine}"', per_engine["vllm:num_requests_running"][engine],
             per_engine.get("vllm:num_requests_waiting", {}).get(engine, 0.0), deferred.get(engine, 0.0),
             tuple(per_engine.get(name, {}).get(engine) for name in counters), (per_engine.get(kv_name, {}).get(engine),),
             unit_pace(engine))
        for engine in engines) if len(engines) > 1 else ()
    return PageReading(
        running=total("vllm:num_requests_running"),
        waiting=total("vllm:num_requests_waiting"),
        steps=total("vllm:iteration_tokens_total_count"),
        generation_tokens=total("vllm:generation_tokens_total"),
        prompt_tokens=total("vllm:prompt_tokens_total"),
        finished=total("vllm:request_success_total"),
        kv_usage=sum(kv) / len(kv) if kv else None,
        process_start_time=samples["process_start_time_seconds"][0] if "process_start_time_seconds" in samples else None,
        deferred=sum(deferred.values()),
        units=units,
        pace=(sum(samples[f"{itl}_sum"]), sum(samples[f"{itl}_count"])) if itl else None,
    )


def test_every_metrics_fixture_is_covered() -> None:
    assert len(PAGES) >= 7


@pytest.mark.parametrize("name", PAGES)
def test_adapter_matches_prometheus_client_parser(name: str) -> None:
    text = (VLLM_FIXTURES / name).read_text()
    assert parse_text(text) == reference_snapshot(text)


EXPECTED = {
    "vllm-0.32.0-cpu-metrics-idle.txt": PageReading(0, 0, 0, 0, 0, 0, 0.0, 1796221991.91),
    "vllm-0.32.0-cpu-metrics-busy.txt": PageReading(2, 6, 462, 903, 29, 1, 0.0019536019536019467, 1796222422.26),
    "vllm-0.32.0-cpu-metrics-after-load.txt": PageReading(0, 0, 4021, 8020, 53, 9, 0.0, 1796222422.26),
    "vllm-0.32.0-cpu-metrics-after-long-prefill.txt": PageReading(0, 0, 32, 60, 57711, 60, 0.0, 1796222219.34),
    "vllm-0.32.0-cpu-metrics-enginecore-sigstop.txt": PageReading(2, 8, 10547, 20513, 159, 25, 0.0019536019536019467, 1796221991.91),
    "vllm-0.32.0-cpu-metrics-worker-sigstop.txt": PageReading(2, 4, 18726, 36869, 223, 41, 0.0024420024420024333, 1796221991.91),
    "vllm-0.32.0-cpu-metrics-during-503-worker-sigkill.txt": PageReading(2, 0, 1746, 3488, 57727, 62, 0.00293040293040292, 1796222219.34),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_page_parses_to_the_expected_snapshot(name: str) -> None:
    snapshot = parse_page((VLLM_FIXTURES / name).read_bytes())
    assert dataclasses.replace(snapshot, pace=None) == EXPECTED[name]
    # The pace counters (seconds, tokens) of the inter-token histogram: a few ms per token on this CPU.
    assert snapshot.pace is not None
    seconds, tokens = snapshot.pace
    assert tokens == 0 or 0.0005 < seconds / tokens < 0.05


@pytest.mark.parametrize("name", ["vllm-0.32.0-cpu-metrics-enginecore-sigstop.txt", "vllm-0.32.0-cpu-metrics-worker-sigstop.txt"])
def test_sigstop_page_reads_as_no_progress_against_the_read_before(name: str) -> None:
    # A SIGSTOPped engine serves the same frozen page on every read (RECIPE: counters frozen).
    page = (VLLM_FIXTURES / name).read_bytes()
    before, after = parse_page(page), parse_page(page)
    assert after.pending and not progressed(before, after)


def test_older_gpu_cache_usage_name_is_read() -> None:
    text = (VLLM_FIXTURES / "vllm-0.32.0-cpu-metrics-busy.txt").read_text().replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert parse_text(text).kv_usage == pytest.approx(0.0019536019536019467)
    assert parse_text(text) == reference_snapshot(text)


def test_data_parallel_engines_are_summed() -> None:
    text = "\n".join([
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 3.0',
        "# TYPE vllm:num_requests_waiting gauge",
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0',
        'vllm:num_requests_waiting{engine="1",model_name="m"} 0.0',
        "# TYPE vllm:num_requests_waiting_by_reason gauge",
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 99.0',
        "# TYPE vllm:iteration_tokens_total histogram",
        'vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 10.0',
        'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 10.0',
        'vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 40.0',
        'vllm:iteration_tokens_total_bucket{engine="1",le="+Inf",model_name="m"} 5.0',
        'vllm:iteration_tokens_total_count{engine="1",model_name="m"} 5.0',
        'vllm:iteration_tokens_total_sum{engine="1",model_name="m"} 20.0',
        "# TYPE vllm:kv_cache_usage_perc gauge",
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2',
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.4',
        "",
    ])
    snap = parse_text(text)
    assert (snap.running, snap.waiting, snap.steps) == (5.0, 1.0, 15.0)
    assert snap.kv_usage == pytest.approx(0.3)  # a fraction: the mean, not the sum
    # Each engine is a unit of its own, judged on its own signals (issue 29).
    assert [(u.name, u.running, u.waiting, u.counters[0], u.gauges) for u in snap.units] == [
        ('engine="0"', 2.0, 1.0, 10.0, (0.2,)), ('engine="1"', 3.0, 0.0, 5.0, (0.4,))]
    assert snap == reference_snapshot(text)


@pytest.mark.parametrize("body,fragment", [
    (b"<html><body>502 Bad Gateway</body></html>", "no vllm:num_requests_running"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    (b"vllm:num_requests_running{engine=\"0\"} NaN\nvllm:num_requests_waiting 0\n", "is NaN"),
    (b"vllm:num_requests_running 1\nvllm:num_requests_waiting two\n", "non-numeric value 'two'"),
    (b"vllm:num_requests_running{engine=\"0\" 1\nvllm:num_requests_waiting 0\n", "unterminated or malformed label set"),
    (b"", "no vllm:num_requests_running"),
])
def test_bad_page_is_a_bad_metrics_error_not_a_crash(body: bytes, fragment: str) -> None:
    with pytest.raises(PageError) as caught:
        parse_page(body)
    assert caught.value.reason == "bad_metrics"
    assert fragment in caught.value.detail


RUNNING, WAITING = b"vllm:num_requests_running 1\n", b"vllm:num_requests_waiting 0\n"
SLEEP_BROKEN = b"vllm:engine_sleep_state{awake} 1\n"
DEFERRED_NAN = b'vllm:num_requests_waiting_by_reason{reason="deferred"} NaN\n'
BY_REASON_BROKEN = b"vllm:num_requests_waiting_by_reason{deferred} 1\n"


@pytest.mark.parametrize("body,fragment", [
    # The adapter's checks in their order (one call into the scanner takes the first three):
    # the families it needs, the deferred requests' labels, the sums, the sleep state's labels, the deferred sum.
    (BY_REASON_BROKEN + WAITING, "no vllm:num_requests_running"),
    (BY_REASON_BROKEN + RUNNING.replace(b"1", b"NaN") + WAITING, "malformed label set '{deferred}'"),
    (RUNNING.replace(b"1", b"NaN") + WAITING + SLEEP_BROKEN, "vllm:num_requests_running is NaN"),
    (RUNNING + WAITING + SLEEP_BROKEN + DEFERRED_NAN, "malformed label set '{awake}'"),
    (RUNNING + WAITING + DEFERRED_NAN, "vllm:num_requests_waiting_by_reason is NaN"),
])
def test_a_page_broken_twice_reads_its_first_error(body: bytes, fragment: str) -> None:
    with pytest.raises(PageError) as caught:
        parse_page(body)
    assert fragment in caught.value.detail
