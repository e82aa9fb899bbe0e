"""llm-vitals-backtest against a real Prometheus, backfilled with `promtool tsdb create-blocks-from openmetrics`.

The histories are made of the real vLLM page (tests/backtest_histories.py): a saturated hour, a
hang, a scrape gap while the server restarts, then saturated again; a saturated healthy server
beside it; one that appears mid-window. The console script reads them back from Prometheus's
HTTP API, and its JSON is checked against the truth of each history; its HTML page is opened in
the real headless Chromium.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
import pytest
from backtest_histories import Phase, as_series, openmetrics, scrapes, unhealthy
from conftest import require_binary
from stack import start_on_free_port, wait_for
from test_status_page import chromium

from llm_vitals.backtest.history import Series

pytestmark = pytest.mark.real_stack

STEP = 15.0
HANG_AND_RESTART = [Phase("saturated", 3600), Phase("hang", 600), Phase("gap", 90), Phase("restart"), Phase("saturated", 600)]
LENGTH = 3600 + 600 + 90 + 600
SCRIPT = Path(sys.executable).parent / "llm-vitals-backtest"


@contextlib.asynccontextmanager
async def backfilled_prometheus(run_dir: Path, series: Sequence[Series], flags: Sequence[str] = ()) -> AsyncIterator[str]:
    """A real Prometheus on 127.0.0.1 serving `series`, backfilled into its own TSDB; its URL."""
    promtool, prometheus = require_binary("promtool"), require_binary("prometheus")
    data = run_dir / "prom-data"
    source = run_dir / "history.om"
    source.write_text(openmetrics(series))
    made = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    config = run_dir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n")  # scrapes nothing: the backfill is the history

    def build(port: int) -> tuple[list[str], str]:
        url = f"http://127.0.0.1:{port}"
        return [prometheus, f"--config.file={config}", f"--storage.tsdb.path={data}",
                "--storage.tsdb.retention.time=10y", f"--web.listen-address=127.0.0.1:{port}", *flags], f"{url}/-/ready"

    process, port = await start_on_free_port("prometheus", build, run_dir / "prometheus.log")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await process.stop()


async def backtest(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, as an operator runs it."""
    return await asyncio.to_thread(subprocess.run, [str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


async def test_the_backtest_reads_the_truth_of_each_backfilled_history_and_draws_it(tmp_path: Path) -> None:
    # Hours ago, on a whole hour: old enough to be in a block, young enough for the retention.
    t0 = float(int(time.time()) // 3600 * 3600 - 6 * 3600)
    series = (as_series("gpu-a:8000", scrapes(t0, HANG_AND_RESTART))
              + as_series("gpu-b:8000", scrapes(t0, [Phase("saturated", LENGTH)]))
              + as_series("gpu-c:8000", scrapes(t0 + 1800, [Phase("saturated", LENGTH - 1800)]))
              + as_series("node:9100", [(t0 + 15 * i, [("process_start_time_seconds", {}, t0)]) for i in range(10)],
                          job="node"))
    page = tmp_path / "backtest.html"
    async with backfilled_prometheus(tmp_path, series) as url:
        done = await backtest("--prometheus", url, "--start", f"{t0 + STEP:.0f}", "--end", f"{t0 + LENGTH - STEP:.0f}",
                              "--json", "--html", str(page))
        assert done.returncode == 0, done.stderr
        document = json.loads(done.stdout)
        nothing = await backtest("--prometheus", url, "--start", f"{t0:.0f}", "--end", f"{t0 + LENGTH:.0f}",
                                 "--selector", '{job="no-such-job"}')
    targets = {t["target"]: t for t in document["targets"]}
    assert set(targets) == {"gpu-a:8000", "gpu-b:8000", "gpu-c:8000"}  # node:9100 has no engine family

    hung = targets["gpu-a:8000"]
    stuck = [e for e in hung["episodes"] if e["state"] == "stuck"]
    assert len(stuck) == 1
    assert t0 + 3600 <= stuck[0]["start"] <= t0 + 3600 + 60 + 2 * STEP
    assert hung["would_restart"] == 1 and hung["restarts_seen"] == 1
    assert unhealthy(hung["episodes"]) == ["stuck", "down"]  # the restart's scrape gap: 90 s > down_after

    for healthy in (targets["gpu-b:8000"], targets["gpu-c:8000"]):
        assert healthy["episodes"] == [] and healthy["would_restart"] == 0 and healthy["restarts_seen"] == 0
        assert healthy["watchdog_restarts"] >= 1  # a 10 s probe behind a queue each request waits 300 s in
    assert targets["gpu-c:8000"]["first_read"] >= t0 + 1800
    assert document["totals"]["would_restart"] == 1

    assert nothing.returncode == 1
    assert "no engine series in the window" in nothing.stderr

    binary = require_binary("chromium")
    dom = (await chromium(binary, tmp_path / "chromium-profile", "--dump-dom", page.as_uri())).decode()
    assert dom.count("<section class=\"target\"") == 3
    hung_section = dom[dom.index('data-target="gpu-a:8000"'):dom.index('data-target="gpu-b:8000"')]
    assert hung_section.count('class="episode" data-state="stuck"') == 1
    assert "<svg" in hung_section and "llm-vitals would restart at" in hung_section
    shot = tmp_path / "backtest.png"
    await chromium(binary, tmp_path / "chromium-profile", f"--screenshot={shot}", "--window-size=1300,900",
                   page.as_uri())
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one


# ----------------------------------------------------------------------------------------------
# --incidents and --compare-live through a Prometheus that refuses large queries (422)


async def test_incidents_and_compare_live_through_a_backfilled_prometheus_that_answers_422_too_many_samples(
        tmp_path: Path) -> None:
    from backtest_histories import MemorySource
    from test_backtest_live_compare import exporter_series

    from llm_vitals.backtest.rules import load_rules
    from llm_vitals.backtest.run import Options, Window
    from llm_vitals.backtest.run import backtest as replay

    t0 = float(int(time.time()) // 3600 * 3600 - 6 * 3600)
    engines = (as_series("gpu-a:8000", scrapes(t0, HANG_AND_RESTART))
               + as_series("gpu-b:8000", scrapes(t0, [Phase("saturated", LENGTH)])))
    window = (t0 + STEP, t0 + LENGTH - STEP)
    # The exporter's own llm_vitals_state for gpu-a, scraped 5 s after each engine scrape: what an
    # exporter that judged as the replay does exported (the live exporter is tests/test_backtest_live.py).
    first = replay(MemorySource(engines), Window(*window, STEP), Options(rules=load_rules())).targets["gpu-a:8000"]
    timeline = [(t0 + 20 + STEP * k, first.state_at(t0 + 20 + STEP * k) or "starting") for k in range(int(LENGTH / STEP) - 2)]
    incidents = tmp_path / "incidents.csv"
    incidents.write_text("target,start,end,kind,note\n"
                         f"gpu-a:8000,{t0 + 3600:.0f},{t0 + 4290:.0f},hang,wedged engine loop\n")
    # 1,500 samples a query at most: a 6 h chunk of a family (some 1,400 points a series) is refused.
    async with backfilled_prometheus(tmp_path, engines + exporter_series("gpu-a:8000", timeline),
                                     flags=["--query.max-samples=1500"]) as url:
        done = await backtest("--prometheus", url, "--start", f"{window[0]:.0f}", "--end", f"{window[1]:.0f}",
                              "--incidents", str(incidents), "--compare-live", "--json", "--jobs", "1")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert any("HTTP 422" in n["text"] and "read again in halves" in n["text"] for n in document["notes"])
    targets = {t["target"]: t for t in document["targets"]}
    assert [e["state"] for e in targets["gpu-a:8000"]["episodes"] if e["state"] == "stuck"] == ["stuck"]
    scored = document["incidents"]
    assert scored["policies"]["llm-vitals"] == {**scored["policies"]["llm-vitals"], "caught": 1, "missed": 0,
                                                "false_alarms": 0}
    assert 60 <= scored["incidents"][0]["llm-vitals"]["lead_time"] <= 120 + 2 * STEP
    (live,) = document["live"]
    assert live["target"] == "gpu-a:8000" and live["percent"] == 100.0 and live["compared"] > 300


# ----------------------------------------------------------------------------------------------
# The compressed day of the incident (README "Why"), through Prometheus


def incident_history(replay_module, config, t0: float) -> tuple[list[Series], list]:
    """The baseline world of bench/incident_replay.py (the watchdogs restarting the server), scraped every 15 s.

    Each scrape is the server's counters as its vLLM page carries them (the replay's own snapshot,
    the vLLM adapter's fields); while its weights load after a restart it is not listening: no scrape.
    """
    episodes = replay_module.batch_schedule(config)
    clock = replay_module.Clock()
    server = replay_module.Server(clock, config)
    replay_module.BatchJob(clock, server, config, episodes)
    replay_module.ChatWatchdog(clock, server, config)
    replay_module.ErrorWatchdog(clock, server, config)
    clock.at(config.hang_at, server.hang)
    rows: list[tuple[float, list[tuple[str, dict[str, str], float]]]] = []
    base = {"engine": "0", "model_name": "tiny"}

    def scrape() -> None:
        snap = server.observe()
        if not isinstance(snap, replay_module.PageReading):
            return
        rows.append((t0 + clock.now, [
            ("vllm:num_requests_running", base, snap.running), ("vllm:num_requests_waiting", base, snap.waiting),
            ("vllm:iteration_tokens_total_count", base, snap.steps),
            ("vllm:generation_tokens_total", base, snap.generation_tokens),
            ("vllm:prompt_tokens_total", base, snap.prompt_tokens),
            ("vllm:request_success_total", {**base, "finished_reason": "length"}, snap.finished),
            ("vllm:kv_cache_usage_perc", base, snap.kv_usage),
            ("process_start_time_seconds", {}, t0 + snap.process_start_time),
        ]))

    clock.every(STEP, scrape, first=0.0)
    clock.run_until(config.duration)
    return as_series("gpu-a:8000", rows), server.restarts


async def test_the_incident_day_through_prometheus_the_watchdog_restarts_a_healthy_server_and_llm_vitals_does_not(
        tmp_path: Path) -> None:
    from conftest import REPO, load_script

    replay_module = load_script(REPO / "bench" / "incident_replay.py")
    config = replay_module.ReplayConfig(hours=6, seed=5)  # tests/test_incident_replay.py's short day
    t0 = float(int(time.time()) // 3600 * 3600 - 8 * 3600)
    series, restarts = incident_history(replay_module, config, t0)
    hang = t0 + config.hang_at
    async with backfilled_prometheus(tmp_path, series) as url:
        done = await backtest("--prometheus", url, "--start", f"{t0 + STEP:.0f}", "--end",
                              f"{t0 + config.duration:.0f}", "--json",
                              "--watchdog-timeout", f"{config.chat_timeout:g}s")
    assert done.returncode == 0, done.stderr
    (target,) = json.loads(done.stdout)["targets"]
    before_hang = [r for r in restarts if t0 + r.time < hang]
    assert len(before_hang) >= 2  # the baseline's: the chat watchdog, then the 500s watchdog, on a healthy server
    # llm-vitals on the same history: no restart at all. Not of the healthy server, and not at the
    # hang either: in this history the baseline's chat watchdog restarted it within a minute of the
    # hang (its probes had been failing behind the batch load already), before stuck_after.
    assert target["would_restart"] == 0 and target["gate"] == []
    assert not [e for e in target["episodes"] if e["state"] == "stuck"]
    # What the history shows of the baseline's restarts: each new process (a restart within another's
    # weight loading is one new process), and the watchdog column counts restarts before the hang.
    lifetimes = [r for i, r in enumerate(restarts) if i + 1 == len(restarts)
                 or restarts[i + 1].time - r.time >= config.load_seconds]
    assert target["restarts_seen"] == len(lifetimes)
    assert sum(1 for p in target["watchdog_periods"] if p["start"] < hang) >= 1


# ----------------------------------------------------------------------------------------------
# Stale markers: a real Prometheus scraping a server that then fails


async def test_stale_markers_of_a_failing_scrape_are_no_nan_page_and_up_0_is_down(aiohttp_server, tmp_path: Path) -> None:
    from aiohttp import web

    page = (Path(__file__).parent / "fixtures" / "vllm" / "vllm-0.32.0-cpu-metrics-busy.txt").read_text()
    serving = {"ok": True}

    async def metrics(request: web.Request) -> web.Response:
        if not serving["ok"]:
            return web.Response(status=500, text="engine gone")
        return web.Response(text=page, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app, host="127.0.0.1")
    instance = f"127.0.0.1:{server.port}"
    prometheus = require_binary("prometheus")
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: vllm\n"
                      f"    static_configs:\n      - targets: ['{instance}']\n")
    (tmp_path / "data").mkdir()

    def build(port: int) -> tuple[list[str], str]:
        return [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}"], f"http://127.0.0.1:{port}/-/ready"

    process, port = await start_on_free_port("prometheus", build, tmp_path / "prometheus.log")
    try:
        started = time.time()
        url = f"http://127.0.0.1:{port}"

        async def scrapes_with_up(value: int, at_least: int) -> bool:
            async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
                answer = (await client.get(f"{url}/api/v1/query", params={
                    "query": f"count_over_time((up == {value})[1m:1s])"})).json()
            result = answer["data"]["result"]
            return bool(result) and float(result[0]["value"][1]) >= at_least

        # The real Prometheus scrapes on its own clock: wait for its good scrapes, then fail them.
        await wait_for(lambda: scrapes_with_up(1, 5), timeout=30, what="five good scrapes")
        serving["ok"] = False  # the scrape fails: Prometheus writes stale markers for every series of the page
        await wait_for(lambda: scrapes_with_up(0, 5), timeout=30, what="five failed scrapes")
        ended = time.time()
        exporter = tmp_path / "exporter.yaml"
        exporter.write_text(f"targets:\n  - name: '{instance}'\n    url: http://{instance}\n    down_after: 2s\n")
        done = await backtest("--prometheus", f"http://127.0.0.1:{port}", "--start", f"{started:.0f}",
                              "--end", f"{ended:.0f}", "--step", "1s", "--config", str(exporter), "--json")
    finally:
        await process.stop()
    assert done.returncode == 0, done.stderr
    (target,) = json.loads(done.stdout)["targets"]
    assert not [n for n in target["notes"] if "adapter refused" in n["text"]]  # no stale NaN read as a value
    assert [e["state"] for e in target["episodes"]] == ["down"]
    assert "up 0" in target["episodes"][0]["detail"]
    assert target["restarts_seen"] == 0 and target["would_restart"] == 0
