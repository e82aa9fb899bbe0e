"""llm-vitals-backtest below the HTTP layer (histories in memory, made of the real vLLM page), and its Prometheus client on loopback.

The real Prometheus, backfilled with the same histories, is tests/test_backtest_prometheus.py.
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import replace

import pytest
from aiohttp import web
from backtest_histories import MemorySource, Phase, as_series, scrapes, unhealthy

from llm_vitals.backtest import cli, report
from llm_vitals.backtest.history import Scrapes, Series, line_prefix
from llm_vitals.backtest.prometheus import Prometheus, PrometheusError, selector_matchers
from llm_vitals.backtest.rules import RulesError, load_rules, parse_rules, shipped_rules_text
from llm_vitals.backtest.run import Options, Window, backtest, instance_matcher, workload_of

T0 = 1_790_000_000.0  # a history's first scrape
STEP = 15.0
RULES = load_rules()
HANG_AT = T0 + 3600  # after a saturated hour
HANG_AND_RESTART = [Phase("saturated", 3600), Phase("hang", 600), Phase("gap", 90), Phase("restart"), Phase("saturated", 600)]
LENGTH = 3600 + 600 + 90 + 600


def run(series: list[Series], start: float = T0 + STEP, end: float = T0 + LENGTH - STEP, **options):
    return backtest(MemorySource(series), Window(start, end, STEP), Options(rules=RULES, **options))


def by_target(result) -> dict[str, dict]:
    return {t["target"]: t for t in report.as_json(result)["targets"]}


# ----------------------------------------------------------------------------------------------
# The acceptance history: a saturated server that hangs and restarts, a saturated healthy one beside it


def test_a_hang_is_one_stuck_episode_one_would_be_restart_and_one_restart_seen_and_its_healthy_neighbour_nothing() -> None:
    result = run(as_series("gpu-a:8000", scrapes(T0, HANG_AND_RESTART))
                 + as_series("gpu-b:8000", scrapes(T0, [Phase("saturated", LENGTH)])))
    targets = by_target(result)
    hung, healthy = targets["gpu-a:8000"], targets["gpu-b:8000"]
    stuck = [e for e in hung["episodes"] if e["state"] == "stuck"]
    assert len(stuck) == 1
    assert HANG_AT <= stuck[0]["start"] <= HANG_AT + 60 + 2 * STEP  # stuck_after + 2 scrapes
    assert hung["would_restart"] == 1
    assert hung["restarts_seen"] == 1
    assert [a["alert"] for a in hung["alerts"] if a["restart"]] == ["LLMServerStuck"]
    assert healthy["episodes"] == []
    assert healthy["would_restart"] == 0 and healthy["restarts_seen"] == 0
    assert not [a for a in healthy["alerts"] if a["restart"]]
    # What a request-based watchdog (10 s) does to the healthy one: each request waits 300 s in its queue.
    assert healthy["watchdog_restarts"] >= 1


def test_the_would_be_restart_comes_when_the_stuck_alert_has_fired_for_its_for() -> None:
    result = run(as_series("gpu-a:8000", scrapes(T0, HANG_AND_RESTART)))
    hung = by_target(result)["gpu-a:8000"]
    stuck_start = next(e["start"] for e in hung["episodes"] if e["state"] == "stuck")
    (allowed,) = [d for d in hung["gate"] if d["allowed"]]
    assert allowed["at"] == stuck_start + 60  # LLMServerStuck's for: 1m, read from the rules file
    assert hung["restarts_seen_at"][0]["why"] == "a new process start time"


def test_a_longer_for_in_the_rules_file_delays_the_would_be_restart(tmp_path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(shipped_rules_text().replace("for: 1m", "for: 5m", 1))  # LLMServerStuck's, the first
    result = backtest(MemorySource(as_series("gpu-a:8000", scrapes(T0, HANG_AND_RESTART))),
                      Window(T0 + STEP, T0 + LENGTH - STEP, STEP), Options(rules=load_rules(rules)))
    hung = by_target(result)["gpu-a:8000"]
    stuck_start = next(e["start"] for e in hung["episodes"] if e["state"] == "stuck")
    (allowed,) = [d for d in hung["gate"] if d["allowed"]]
    assert allowed["at"] == stuck_start + 300


def test_a_hang_shorter_than_stuck_after_and_the_for_is_no_alert_and_no_restart() -> None:
    phases = [Phase("saturated", 1800), Phase("hang", 45), Phase("saturated", 1800)]
    result = run(as_series("gpu-a:8000", scrapes(T0, phases)), end=T0 + 3600)
    target = by_target(result)["gpu-a:8000"]
    assert target["episodes"] == [] and target["would_restart"] == 0


# ----------------------------------------------------------------------------------------------
# The gate over the fleet


def test_two_servers_hanging_together_are_a_storm_the_fleet_gate_refuses() -> None:
    result = run(as_series("gpu-a:8000", scrapes(T0, HANG_AND_RESTART))
                 + as_series("gpu-b:8000", scrapes(T0, HANG_AND_RESTART)))
    targets = by_target(result)
    assert sum(t["would_restart"] for t in targets.values()) == 0
    assert {d["reason"] for t in targets.values() for d in t["gate"]} == {"fleet_gate"}


def test_a_second_hang_within_the_cooldown_is_refused() -> None:
    later = [Phase("saturated", 3900), Phase("hang", 600), Phase("gap", 90), Phase("restart"), Phase("saturated", 300)]
    healthy = [as_series(f"gpu-{i}:8000", scrapes(T0, [Phase("saturated", LENGTH)])) for i in range(3)]
    result = run(as_series("gpu-a:8000", scrapes(T0, HANG_AND_RESTART)) + as_series("gpu-b:8000", scrapes(T0, later))
                 + [s for group in healthy for s in group])
    targets = by_target(result)
    assert targets["gpu-a:8000"]["would_restart"] == 1
    assert [d["reason"] for d in targets["gpu-b:8000"]["gate"]] == ["cooldown"]


def test_workload_from_labels_or_the_pod_name() -> None:
    assert workload_of({"workload": "Deployment/ml/chat"}, "10.0.0.1:8000") == "Deployment/ml/chat"
    assert workload_of({"namespace": "ml", "pod": "chat-7d9f8b6c5d-x2k4p"}, "i") == "Deployment/ml/chat"
    assert workload_of({"namespace": "ml", "pod": "llama-0"}, "i") == "StatefulSet/ml/llama"
    assert workload_of({}, "10.0.0.1:8000") == "10.0.0.1:8000"


# ----------------------------------------------------------------------------------------------
# Hostile history: each a clear line, nothing invented


def test_a_scrape_gap_shorter_than_down_after_is_missed_reads_not_down() -> None:
    phases = [Phase("saturated", 1800), Phase("gap", 10), Phase("saturated", 1800)]  # one scrape missing
    result = run(as_series("gpu-a:8000", scrapes(T0, phases)), end=T0 + 3600)
    target = by_target(result)["gpu-a:8000"]
    assert target["episodes"] == []
    assert target["missed_reads"] >= 1
    assert any("found no scrape" in n["text"] for n in target["notes"])


def test_a_scrape_gap_longer_than_down_after_is_one_down_episode_and_no_restart() -> None:
    phases = [Phase("saturated", 1800), Phase("gap", 120), Phase("saturated", 1800)]
    result = run(as_series("gpu-a:8000", scrapes(T0, phases)), end=T0 + 3700)
    target = by_target(result)["gpu-a:8000"]
    assert [e["state"] for e in target["episodes"]] == ["down"]
    assert target["would_restart"] == 0 and target["restarts_seen"] == 0


def test_counters_that_fall_without_a_start_time_are_a_restart_seen() -> None:
    series = [s for s in as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 900), Phase("restart"),
                                                               Phase("saturated", 900)]))
              if s.name != "process_start_time_seconds"]
    target = by_target(run(series, end=T0 + 1800 - STEP))["gpu-a:8000"]
    assert target["restarts_seen"] == 1
    assert target["restarts_seen_at"][0]["why"] == "counters fell"


def test_a_nan_gauge_is_a_page_the_adapter_refuses_said_once_and_no_state_invented() -> None:
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 1800)]))
    running = next(s for s in series if s.name == "vllm:num_requests_running")
    values = list(running.values)
    values[60] = math.nan
    series = [replace(s, values=values) if s is running else s for s in series]
    target = by_target(run(series, end=T0 + 1800 - STEP))["gpu-a:8000"]
    assert target["episodes"] == []  # one unreadable read is a missed read, not down, not stuck
    assert any("adapter refused" in n["text"] and "bad_metrics" in n["text"] for n in target["notes"])


def test_a_relabel_that_duplicates_a_series_is_said_and_not_summed() -> None:
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 1800)]))
    waiting = next(s for s in series if s.name == "vllm:num_requests_waiting")
    copy = Series(waiting.name, {**waiting.labels, "job": "vllm-relabelled"}, waiting.times, waiting.values)
    result = run([*series, copy], end=T0 + 1800 - STEP)
    assert any("two series wrote vllm:num_requests_waiting" in n.text for n in result.notes)
    assert by_target(result)["gpu-a:8000"]["episodes"] == []


def test_a_target_that_appears_mid_window_starts_at_its_first_scrape() -> None:
    late = as_series("gpu-c:8000", scrapes(T0 + 1800, [Phase("saturated", 1800)]))
    result = run(as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 3600)])) + late, end=T0 + 3600 - STEP)
    target = by_target(result)["gpu-c:8000"]
    assert target["first_read"] >= T0 + 1800
    assert target["episodes"] == []  # its first read already shows work pending: busy, no `starting` before it
    assert target["missed_reads"] == 0


class FailingChunks(MemorySource):
    """A source whose answers for reads in (fail_from, fail_to] fail as Prometheus's would."""

    def __init__(self, series, fail_from: float, fail_to: float) -> None:
        super().__init__(series)
        self.fail_from, self.fail_to = fail_from, fail_to

    def samples(self, selector, start, end):
        if start < self.fail_to and end > self.fail_from:
            raise PrometheusError("reading ...: HTTP 503 (after 3 tries)")
        return super().samples(selector, start, end)


def test_a_chunk_prometheus_did_not_answer_is_a_line_and_no_down_is_invented() -> None:
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 4 * 3600)]))
    source = FailingChunks(series, T0 + 3600, T0 + 2 * 3600)
    result = backtest(source, Window(T0 + STEP, T0 + 4 * 3600 - STEP, STEP), Options(rules=RULES, chunk_points=240))
    assert 0 < result.chunks_read < result.chunks
    assert any("not judged" in n.text and "503" in n.text for n in result.notes)
    assert by_target(result)["gpu-a:8000"]["episodes"] == []


def test_nothing_read_is_said_and_read_anything_is_false() -> None:
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 1800)]))
    result = backtest(FailingChunks(series, 0, math.inf), Window(T0 + STEP, T0 + 1800 - STEP, STEP),
                      Options(rules=RULES))
    assert not result.read_anything
    empty = backtest(MemorySource([]), Window(T0, T0 + 600, STEP), Options(rules=RULES))
    assert not empty.read_anything and "no engine series" in empty.notes[0].text


# ----------------------------------------------------------------------------------------------
# The parts


def test_a_read_sees_the_latest_scrape_within_its_step_and_a_missed_read_none() -> None:
    series = [Series("vllm:num_requests_running", {"instance": "a", "job": "j", "engine": "0"}, [10.0, 25.0, 70.0],
                     [1.0, 2.0, math.nan])]
    found = Scrapes.of(series)
    assert found.read_at(30.0, 15.0).page == 'vllm:num_requests_running{engine="0"} 2.0\n'
    assert found.read_at(55.0, 15.0).page is None
    assert found.read_at(70.0, 15.0).page == 'vllm:num_requests_running{engine="0"} NaN\n'


def test_a_page_line_leaves_out_what_prometheus_added_and_escapes_values() -> None:
    series = Series("m", {"instance": "a", "pod": "p", "model_name": 'a"b\\c'}, [], [])
    assert line_prefix(series) == 'm{model_name="a\\"b\\\\c"}'


def test_the_shipped_rules_give_the_stuck_alerts_for_and_its_restart_label() -> None:
    stuck = next(r for r in RULES if r.name == "LLMServerStuck")
    assert (stuck.state, stuck.for_seconds, stuck.restart) == ("stuck", 60.0, True)
    assert not any(r.name == "LLMServerUnresponsiveLoadUnknown" for r in RULES)  # engine openai only: no counters
    saturated = next(r for r in RULES if r.name == "LLMServerSaturated")
    assert saturated.needs_waiting and not saturated.restart


@pytest.mark.parametrize(("text", "message"), [
    ("groups: [", "not YAML"),
    ("rules: []", "no `groups:` list"),
    ("groups: [{name: g, rules: [{alert: A, expr: up == 0}]}]", "no alert rule on llm_vitals_state"),
    ('groups: [{name: g, rules: [{alert: A, expr: \'llm_vitals_state{state="stuck"} == 1\', for: soon}]}]', "bad `for:`"),
])
def test_a_rules_file_that_cannot_be_read_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(RulesError, match=message):
        parse_rules(text, "rules.yml")


def test_selector_takes_matchers_in_braces_only() -> None:
    assert selector_matchers('{job="vllm"}') == 'job="vllm"'
    assert selector_matchers(None) == ""
    with pytest.raises(ValueError, match="in braces"):
        selector_matchers('job="vllm"')


@pytest.mark.parametrize("text", ["1790000000", "2026-09-21T14:13:20Z", "2026-09-21T16:13:20+02:00"])
def test_times_are_unix_seconds_or_rfc3339(text: str) -> None:
    assert cli.parse_time(text) == 1_790_000_000.0


# ----------------------------------------------------------------------------------------------
# The Prometheus client, against real HTTP servers on loopback


async def serve(aiohttp_server, answers: list[tuple[int, dict]]):
    calls: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        calls.append(request.path)
        status, body = answers[min(len(calls), len(answers)) - 1]
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_get("/api/v1/query", handler)
    app.router.add_get("/api/v1/series", handler)
    server = await aiohttp_server(app)
    return f"http://127.0.0.1:{server.port}", calls


MATRIX = {"status": "success", "data": {"resultType": "matrix", "result": [
    {"metric": {"__name__": "m", "instance": "a"}, "values": [[1.5, "2"], [16.5, "NaN"]]}]}}


async def test_a_503_is_retried_and_the_answer_read(aiohttp_server) -> None:
    import asyncio

    url, calls = await serve(aiohttp_server, [(503, {"status": "error", "error": "busy"}), (200, MATRIX)])
    client = Prometheus(url, timeout=5, sleep=lambda _: None)
    (series,) = await asyncio.to_thread(client.samples, '{__name__="m"}', 0.0, 20.0)
    assert list(series.times) == [1.5, 16.5] and series.values[0] == 2.0 and math.isnan(series.values[1])
    assert len(calls) == 2


async def test_values_are_read_as_floats_and_one_that_is_none_is_nan_and_an_empty_series_is_empty(aiohttp_server) -> None:
    import asyncio

    matrix = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "m", "instance": "a"}, "values": [[1.5, "+Inf"], [16.5, "x"], [31.5, "-1e3"]]},
        {"metric": {"__name__": "m", "instance": "b"}, "values": []}]}}
    url, _ = await serve(aiohttp_server, [(200, matrix)])
    client = Prometheus(url, timeout=5, sleep=lambda _: None)
    one, empty = await asyncio.to_thread(client.samples, '{__name__="m"}', 0.0, 40.0)
    assert list(one.times) == [1.5, 16.5, 31.5] and one.values[0] == math.inf and one.values[2] == -1000.0
    assert math.isnan(one.values[1])
    assert (list(empty.times), list(empty.values)) == ([], [])


TOO_MANY = {"status": "error", "errorType": "execution",
            "error": "query processing would load too many samples into memory in query execution"}


async def test_a_422_on_a_short_range_says_what_prometheus_said_and_is_not_split(aiohttp_server) -> None:
    import asyncio

    url, calls = await serve(aiohttp_server, [(422, TOO_MANY)])
    client = Prometheus(url, timeout=5, sleep=lambda _: None)
    with pytest.raises(PrometheusError, match=r"HTTP 422 .*too many samples.*even for 20s"):
        await asyncio.to_thread(client.samples, '{__name__="m"}', 0.0, 20.0)
    assert len(calls) == 1 and client.splits == 0


async def test_a_422_too_many_samples_is_read_again_in_halves_and_joined(aiohttp_server) -> None:
    import asyncio

    asked: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        query, at = request.query["query"], float(request.query["time"])
        asked.append(query)
        millis = int(query.rpartition("[")[2].rstrip("ms]"))
        if millis > 1_000_000:  # over 1000 s: too many samples
            return web.json_response(TOO_MANY, status=422)
        start = at - millis / 1000
        values = [[t, str(t)] for t in range(0, 4000, 15) if start < t <= at]
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"__name__": "m", "instance": "a"}, "values": values}]}})

    app = web.Application()
    app.router.add_get("/api/v1/query", handler)
    server = await aiohttp_server(app)
    client = Prometheus(f"http://127.0.0.1:{server.port}", timeout=5, sleep=lambda _: None)
    (series,) = await asyncio.to_thread(client.samples, '{__name__="m"}', 0.0, 3600.0)
    assert list(series.times) == [float(t) for t in range(15, 3601, 15)]
    assert list(series.values) == list(series.times)
    assert client.splits == 3  # 3600 s -> 2 x 1800 s -> 4 x 900 s


async def test_a_prometheus_that_does_not_answer_in_time_is_a_line(aiohttp_server) -> None:
    import asyncio

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response(MATRIX)

    app = web.Application()
    app.router.add_get("/api/v1/series", slow)
    server = await aiohttp_server(app)
    client = Prometheus(f"http://127.0.0.1:{server.port}", timeout=0.2, sleep=lambda _: None)
    with pytest.raises(PrometheusError, match=r"no answer within 0.2s \(after 3 tries\)"):
        await asyncio.to_thread(client.series, '{__name__="m"}', 0.0, 20.0)


def test_the_cli_exits_1_with_a_line_when_prometheus_cannot_be_reached(capsys) -> None:
    from conftest import free_port

    code = cli.main(["--prometheus", f"http://127.0.0.1:{free_port()}", "--start", "1790000000", "--end", "1790003600"])
    assert code == 1
    assert "nothing could be read" in capsys.readouterr().err


def test_the_cli_refuses_an_end_before_its_start(capsys) -> None:
    assert cli.main(["--prometheus", "http://127.0.0.1:9", "--start", "1790003600", "--end", "1790000000"]) == 2
    assert "--end must be after --start" in capsys.readouterr().err


def test_the_json_lists_every_non_busy_non_idle_episode_with_the_issue_s_fields() -> None:
    result = run(as_series("gpu-a:8000", scrapes(T0, HANG_AND_RESTART)))
    document = json.loads(report.dumps(result))
    assert set(document["window"]) >= {"start", "end", "step"}
    (target,) = document["targets"]
    assert {"target", "engine", "episodes", "alerts", "would_restart", "restarts_seen", "watchdog_restarts"} <= set(target)
    assert target["engine"] == "vllm"
    assert unhealthy(target["episodes"]) == ["stuck", "down"]
    assert not [e for e in target["episodes"] if e["state"] in ("busy", "idle")]
    assert all({"state", "start", "end", "reason"} <= set(e) for e in target["episodes"])
    text = report.as_text(result)
    assert text.count("\n") >= 3 and "gpu-a:8000 (vllm): stuck" in text and text.splitlines()[-1].startswith("totals")


def test_jobs_split_the_targets_over_processes_and_give_the_same_result() -> None:
    series = (as_series("gpu-a:8000", scrapes(T0, HANG_AND_RESTART))
              + as_series("gpu-b:8000", scrapes(T0, [Phase("saturated", LENGTH)]))
              + as_series("gpu-c:8000", scrapes(T0, HANG_AND_RESTART)))
    window = Window(T0 + STEP, T0 + LENGTH - STEP, STEP)
    alone = backtest(MemorySource(series), window, Options(rules=RULES))
    split = backtest(MemorySource(series), window,
                     Options(rules=RULES, jobs=2, source_factory=functools.partial(MemorySource, series)))
    assert report.as_json(split) == report.as_json(alone)
    assert list(split.targets) == ["gpu-a:8000", "gpu-b:8000", "gpu-c:8000"]


def test_a_group_of_targets_is_matched_literally() -> None:
    assert instance_matcher(["gpu.a:8000", "b"]) == 'instance=~"b|gpu\\\\.a:8000"'


def up_series(instance: str, times: list[float], value: float) -> Series:
    return Series("up", {"instance": instance, "job": "vllm"}, times, [value] * len(times))


def test_a_target_whose_scrapes_stop_for_good_is_gone_not_down_and_leaves_the_fleet() -> None:
    series = (as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 1800)]))
              + as_series("gpu-b:8000", scrapes(T0, [Phase("saturated", 3600)])))
    result = run(series, end=T0 + 3600 - STEP)
    gone = by_target(result)["gpu-a:8000"]
    assert gone["episodes"] == []
    assert [a["alert"] for a in gone["alerts"]] == ["LLMServerSaturated"]  # while it was there; no LLMServerDown
    assert any("gone from Prometheus's targets" in n["text"] for n in gone["notes"])
    assert result.targets["gpu-a:8000"].gone_at == pytest.approx(T0 + 1800, abs=STEP)


def test_scrapes_that_failed_with_up_0_are_missed_reads_and_down_after_down_after() -> None:
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("saturated", 1800), Phase("gap", 120),
                                                  Phase("saturated", 1800)]))
    failed = [T0 + 1800 + 15 * i for i in range(8)]
    result = run([*series, up_series("gpu-a:8000", failed, 0.0)], end=T0 + 3700)
    target = by_target(result)["gpu-a:8000"]
    (down,) = target["episodes"]
    assert down["state"] == "down" and "up 0" in down["detail"]
    assert not result.targets["gpu-a:8000"].gone_at
    # The watchdog's probe fails where Prometheus's scrape failed (up 0), as it does on the saturated queue.
    assert any(p["start"] <= T0 + 1800 + STEP and p["end"] >= failed[-1] for p in target["watchdog_periods"])


def test_a_watchdog_probe_fails_where_prometheus_s_scrape_failed() -> None:
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("idle", 1800), Phase("gap", 120), Phase("idle", 1800)]))
    failed = [T0 + 1800 + 15 * i for i in range(8)]
    target = by_target(run([*series, up_series("gpu-a:8000", failed, 0.0)], end=T0 + 3700))["gpu-a:8000"]
    assert [p["start"] for p in target["watchdog_periods"]] == [failed[0]]


def test_a_scrape_gap_without_up_0_is_no_watchdog_failure() -> None:
    series = as_series("gpu-a:8000", scrapes(T0, [Phase("idle", 1800), Phase("gap", 120), Phase("idle", 1800)]))
    target = by_target(run(series, end=T0 + 3700))["gpu-a:8000"]
    assert target["watchdog_restarts"] == 0  # Prometheus itself read nothing: evidence of nothing


def test_the_config_s_settings_are_matched_to_series_by_instance() -> None:
    from llm_vitals.exporter.settings import parse_settings

    config = parse_settings({"targets": [{"name": "gpu-a:8000", "url": "http://gpu-a:8000", "stuck_after": "15m"}]})
    series = (as_series("gpu-a:8000", scrapes(T0, HANG_AND_RESTART))
              + as_series("gpu-b:8000", scrapes(T0, HANG_AND_RESTART)))
    result = run(series, config=config)
    targets = by_target(result)
    assert unhealthy(targets["gpu-a:8000"]["episodes"]) == ["down"]  # a 10 min hang < stuck_after 15m
    assert unhealthy(targets["gpu-b:8000"]["episodes"]) == ["stuck", "down"]  # the defaults
    assert any("gpu-b:8000: not in the config" in n.text for n in result.notes)


def test_the_cli_tells_its_version_and_prints_the_exporter_s_example_config(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("llm-vitals-backtest ")
    assert cli.main(["--example-config"]) == 0
    assert "targets:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        cli.main(["--start", "1790000000"])
    assert exited.value.code == 2 and "--prometheus, --end" in capsys.readouterr().err


def test_jobs_default_to_the_cores() -> None:
    args = cli.build_parser().parse_args(["--prometheus", "http://127.0.0.1:9", "--start", "0", "--end", "60"])
    assert args.jobs == (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no sched_getaffinity")
def test_jobs_default_to_the_cores_this_process_may_run_on_not_the_host_s(monkeypatch) -> None:
    # A container's cpuset (or taskset) of one core on a host of many: one reading process, not one per host core.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert cli.cores() == 1
    args = cli.build_parser().parse_args(["--prometheus", "http://127.0.0.1:9", "--start", "0", "--end", "60"])
    assert args.jobs == 1


@pytest.mark.parametrize(("lines", "expected"), [
    ({'c{e="0"}': 5.0, 'b{e="0",le="10"}': 3.0}, (5.0, 3.0)),
    # Two engines: summed; a NaN line is left out, not a NaN sum.
    ({'c{e="0"}': 5.0, 'c{e="1"}': math.nan, 'b{e="0",le="10"}': 3.0, 'b{e="1",le="10"}': 1.0}, (5.0, 4.0)),
    # The smallest bound >= the timeout with a finite value: 10 is NaN throughout, so 20.
    ({'c{e="0"}': 5.0, 'b{e="0",le="5"}': 1.0, 'b{e="0",le="10"}': math.nan, 'b{e="0",le="20"}': 4.0}, (5.0, 4.0)),
    ({'c{e="0"}': math.inf, 'b{e="0",le="10"}': 3.0}, None),  # no finite count
    ({'c{e="0"}': 5.0, 'b{e="0",le="5"}': 3.0}, None),  # no bound at or above the timeout
    ({"up": 1.0}, None),
])
def test_the_watchdog_reads_the_queue_time_lines_it_is_given(lines: dict[str, float], expected) -> None:
    from llm_vitals.backtest.replay import _queue_counts, _queue_lines

    renamed = {prefix.replace("c{", "vllm:request_queue_time_seconds_count{")
               .replace("b{", "vllm:request_queue_time_seconds_bucket{"): value for prefix, value in lines.items()}
    assert _queue_counts(renamed, _queue_lines(tuple(renamed), 10.0)) == expected
