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

import pytest
from backtest_histories import Phase, as_series, openmetrics, scrapes
from conftest import require_binary
from stack import start_on_free_port
from test_status_page import chromium

from llm_vitals.backtest.history import Series

pytestmark = pytest.mark.real_stack

STEP = 15.0
HANG_AND_RESTART = [Phase("saturated", 3600), Phase("hang", 600), Phase("gap", 90), Phase("restart"), Phase("saturated", 600)]
LENGTH = 3600 + 600 + 90 + 600
SCRIPT = Path(sys.executable).parent / "llm-vitals-backtest"


@contextlib.asynccontextmanager
async def backfilled_prometheus(run_dir: Path, series: Sequence[Series]) -> AsyncIterator[str]:
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
                "--storage.tsdb.retention.time=10y", f"--web.listen-address=127.0.0.1:{port}"], f"{url}/-/ready"

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
    assert [e["state"] for e in hung["episodes"]] == ["stuck", "down"]  # the restart's scrape gap: 90 s > down_after

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
