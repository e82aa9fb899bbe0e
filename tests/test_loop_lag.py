"""The exporter's own event-loop lag (llm_vitals/exporter/loop_lag.py) and the reads it makes `exporter_late`.

The sampler's arithmetic on an injected clock; then a live exporter whose loop is blocked while a read
is in flight: the read's timeout is the exporter's own lateness, counted as `exporter_late`, shown, and
evidence of nothing (the target stays busy), with the lag on /metrics.
"""

from __future__ import annotations

import time

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from test_exporter_helpers import BUSY_PAGE, make_settings, make_target, record, start_exporter, target_json, wait_for

from llm_vitals.exporter.loop_lag import LoopLag


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_worst_lateness_since_a_moment_counts_samples_from_then_on() -> None:
    clock = Clock()
    lag = LoopLag(tick=0.1, keep=60.0, clock=clock)
    lag.note(due=100.0, woke=100.002)
    lag.note(due=101.0, woke=102.5)  # a 1.5 s stall
    lag.note(due=103.0, woke=103.01)
    clock.t = 103.05
    assert lag.worst_since(100.0) == 1.5
    assert lag.worst_since(102.6) == pytest.approx(0.01)  # the stall was before
    assert lag.recent(window=10.0) == 1.5


def test_a_wake_overdue_right_now_counts_though_it_has_not_run() -> None:
    clock = Clock()
    lag = LoopLag(tick=0.1, clock=clock)
    lag._due = 100.1  # the sampler waits for its turn, due 0.1 s after 100
    clock.t = 101.1
    assert lag.worst_since(100.0) == 1.0


def test_old_samples_are_forgotten() -> None:
    clock = Clock()
    lag = LoopLag(tick=0.1, keep=5.0, clock=clock)
    lag.note(due=100.0, woke=102.0)
    lag.note(due=110.0, woke=110.001)
    clock.t = 110.1
    assert lag.worst_since(0.0) == pytest.approx(0.001)  # the 2 s stall is older than `keep`


async def test_a_read_that_timed_out_while_the_exporters_loop_was_blocked_is_exporter_late(aiohttp_server,
                                                                                          aiohttp_client) -> None:
    blocking = {"on": False}

    async def metrics(request: web.Request) -> web.Response:
        if blocking["on"]:
            # The server and the exporter share this test's loop: blocking it here starves the
            # exporter exactly as a loop with 5,000 targets on a loaded box is starved.
            time.sleep(1.2)
        return web.Response(body=BUSY_PAGE, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    target = make_target("a", str(server.make_url("")), engine="vllm", stuck_after=600, down_after=600,
                         canary={"enabled": False})
    client = await start_exporter(aiohttp_client, make_settings([target], metrics_timeout=0.5))
    rec = record(client, "a")
    await wait_for(lambda: rec.verdict.state == "busy" and rec.verdict.up, what="busy")
    blocking["on"] = True
    late_verdict = await wait_for(lambda: rec.verdict.error_reason == "exporter_late" and rec.verdict, timeout=20,
                                  what="an exporter_late read")
    blocking["on"] = False
    # Shown, and evidence of nothing: the state and its reason held, the read not counted against it.
    assert (late_verdict.state, late_verdict.up, late_verdict.failed_reads) == ("busy", False, 0)
    # Nor a poll (issue 29): the poll timestamp LLMVitalsPollingStale reads stays at the last read that was not late.
    assert late_verdict.last_poll == late_verdict.last_good_read
    assert "/metrics took longer than 0.5s, while the exporter's own event loop ran up to" in late_verdict.detail
    view = await target_json(client, "a")
    assert view["poll_errors"].get("exporter_late", 0) >= 1
    assert {state for _, _, state in rec.history} == {"busy"}  # never stuck, never down
    families = {f.name: f for f in text_string_to_metric_families(await (await client.get("/metrics")).text())}
    lag = families["llm_vitals_exporter_loop_lag_seconds"].samples[0].value
    assert lag >= 1.0, lag
    late = [s for s in families["llm_vitals_poll_errors"].samples
            if s.labels == {"reason": "exporter_late", "target": "a"} and s.name.endswith("_total")]
    assert late and late[0].value >= 1
