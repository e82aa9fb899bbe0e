"""The partial-evidence drill on the simulator, for every engine (issue 23, part 1): an engine frozen
with work pending, whose /metrics times out on one read in three, reads `stuck` within stuck_after and
two polls, and stays stuck through the reads that time out; never `down`.

The exporter reads the page through tests/flaky_proxy.py, which holds every third read past the
exporter's metrics_timeout. The load goes to the server directly. `freeze` is each engine's engine
frozen with its HTTP alive (llama.cpp: wedged inside a decode, so its /metrics still answers; the
other engines' hang). The time to stuck of each engine is written to .cache/drill-flaky-metrics.json.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from drill_report import add_figures
from flaky_proxy import FlakyProxy
from test_exporter_helpers import make_settings, make_target, record, requests_in_flight, start_exporter, wait_for

from llm_vitals.sim.config import SimConfig
from llm_vitals.sim.engines.table import SIM_ENGINES
from llm_vitals.sim.fleet import Fleet

POLL = 0.25
METRICS_TIMEOUT = 0.5
HELD = 1.5  # past the timeout: the held read times out at the exporter
STUCK_AFTER = 2.0
SLACK = 1.5  # a late poll on a loaded 2-core box
TOKENS = 20  # a request lasts 0.2 s at 100 tokens/s: Triton's counters move on each completion
REPORT = REPO / ".cache" / "drill-flaky-metrics.json"


def request_for(engine: str) -> tuple[str, dict[str, Any]]:
    """The engine's own request route and a body of TOKENS tokens."""
    if engine == "triton":
        return "/v2/models/tiny/infer", {"inputs": [{"name": "max_tokens", "shape": [1, 1], "datatype": "INT32",
                                                     "data": [TOKENS]}]}
    return "/v1/completions", {"model": "tiny", "prompt": "def main():", "max_tokens": TOKENS, "ignore_eos": True}


def load(url: str, engine: str, workers: int):
    """`workers` clients, each sending its next request as soon as one returns, until the block exits."""
    path, body = request_for(engine)
    return requests_in_flight(url + path, body, workers)


def report(engine: str, figures: dict) -> None:
    add_figures(REPORT, engine, figures)


@pytest.mark.parametrize("engine", sorted(SIM_ENGINES))
async def test_frozen_with_work_pending_and_one_read_in_three_timing_out_is_stuck(aiohttp_client, engine: str) -> None:
    sim = SIM_ENGINES[engine]
    async with Fleet(SimConfig(engine=engine, max_num_seqs=2, tokens_per_second=100), backends=1, control=False) as fleet:
        url, backend = fleet.backend_urls[0], fleet.backends[0]
        async with FlakyProxy(url, path=sim.metrics_path, every=3, delay=HELD) as proxy:
            keys = {**sim.target(url, "tiny"), "engine": engine, "metrics_url": proxy.url + sim.metrics_path}
            # down_after far above the drill: the held reads must never make it down.
            target = make_target("t", url, **{**keys, "stuck_after": STUCK_AFTER, "down_after": 60,
                                              "canary": {"enabled": False}})
            client = await start_exporter(aiohttp_client, make_settings(
                [target], poll_interval=POLL, metrics_timeout=METRICS_TIMEOUT, health_timeout=0.3))
            rec = record(client, "t")
            async with load(url, engine, workers=6):
                await wait_for(lambda: rec.verdict.reason == "progress" and rec.verdict.snapshot.pending,
                               timeout=20, what=f"busy with progress ({engine})")
                backend.set_fault("freeze")
                frozen_at, polls_at, errors_at = time.monotonic(), rec.polls, rec.poll_errors.get("timeout", 0)
                await wait_for(lambda: rec.verdict.state == "stuck", timeout=STUCK_AFTER + 15, what="stuck")
                took, polls = time.monotonic() - frozen_at, rec.polls - polls_at
                stuck = rec.verdict
                # Some reads in between timed out, and none of them made it down.
                assert rec.poll_errors.get("timeout", 0) > errors_at or stuck.reason == "metrics_unanswered"
                since_freeze = [state for _, _, state in list(rec.history)[-polls:]]
                assert set(since_freeze) <= {"busy", "stuck"}, since_freeze
                # Within stuck_after and two polls of the freeze (a poll whose read is held lasts the timeout).
                assert took <= STUCK_AFTER + 2 * (POLL * 1.1 + METRICS_TIMEOUT) + SLACK, took
                # The stuck episode holds through the reads that time out.
                held_before, polls_before = proxy.held, rec.polls
                await wait_for(lambda: rec.polls >= polls_before + 6 and proxy.held > held_before, timeout=20,
                               what="six more polls, one held")
                after = [state for _, _, state in list(rec.history)[-(rec.polls - polls_before):]]
                assert set(after) == {"stuck"}, after
                backend.set_fault("none")
                await wait_for(lambda: rec.verdict.state == "busy", timeout=10, what="moving again")
            report(engine, {"time_to_stuck_s": round(took, 2), "polls_to_stuck": polls, "reason": stuck.reason,
                            "reads_held_by_proxy": proxy.held, "stuck_after_s": STUCK_AFTER, "poll_s": POLL,
                            "metrics_timeout_s": METRICS_TIMEOUT})


def test_the_flaky_proxy_holds_every_third_read(tmp_path: Path) -> None:
    proxy = FlakyProxy("http://127.0.0.1:9", every=3)
    assert [proxy.held_now(n) for n in range(1, 8)] == [False, False, True, False, False, True, False]
    with pytest.raises(ValueError):
        FlakyProxy("http://127.0.0.1:9", every=0)
