"""The exporter against the simulated vLLM fleet: load is never stuck, faults are seen, canaries are safe."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from test_exporter_helpers import (
    FakeVllm,
    make_settings,
    make_target,
    record,
    requests_in_flight,
    start_exporter,
    target_json,
    wait_for,
)

from llm_vitals.sim.fleet import Fleet, SimConfig

POLL = 0.25
STUCK_AFTER = 1.5
SLACK = 1.0


def load(url: str, workers: int, max_tokens: int):
    """Keep `workers` completions in flight against `url` until the block exits."""
    return requests_in_flight(url + "/v1/completions", {"model": "tiny", "prompt": "def main():", "max_tokens": max_tokens,
                                                        "ignore_eos": True}, workers)


def sim_target(name: str, url: str, **overrides: Any) -> dict[str, Any]:
    return make_target(name, url, stuck_after=STUCK_AFTER, **overrides)


async def test_saturated_server_is_never_stuck_and_gets_zero_canaries_while_idle_neighbour_gets_them_at_rate(
        aiohttp_client) -> None:
    # Backend 0: 2 slots and 8 clients, so 2 running and a queue of 6, for 20 s.
    # Backend 1, in the same window: idle, so it gets canaries at the configured interval.
    interval = 0.5
    async with Fleet(SimConfig(max_num_seqs=2, tokens_per_second=100), backends=2) as fleet:
        canary = {"interval": interval, "timeout": 2}
        client = await start_exporter(aiohttp_client, make_settings(
            [sim_target("busy", fleet.backend_urls[0], canary=canary),
             sim_target("idle", fleet.backend_urls[1], canary=canary)], poll_interval=POLL))
        busy, idle = record(client, "busy"), record(client, "idle")
        async with load(fleet.backend_urls[0], workers=8, max_tokens=60):
            await wait_for(lambda: busy.verdict.snapshot and busy.verdict.snapshot.waiting >= 5, what="a queue")
            await wait_for(lambda: idle.canaries["ok"] >= 1, what="a first canary to the idle backend")
            first_polls, first_canaries, started = busy.polls, idle.canaries["ok"], time.monotonic()
            seen_queue = 0
            while time.monotonic() - started < 20:  # the measured window, checked every poll
                assert busy.verdict.state == "busy", busy.verdict.detail
                if busy.verdict.snapshot.waiting >= 5:
                    seen_queue += 1
                await asyncio.sleep(POLL)
            window = time.monotonic() - started
            polls = busy.polls - first_polls
            busy_canaries = sum(busy.canaries.values())
            states = {state for _, _, state in busy.history}
            idle_canaries = idle.canaries["ok"] - first_canaries
        # Enough polls for "never stuck" to mean something (simulator, clients and exporter share one
        # event loop here, so on a starved CPU polls run late).
        assert polls >= window / POLL * 0.4
        assert busy_canaries == 0 and busy.canary_task is None
        assert states == {"busy"}
        assert seen_queue > 20
        assert busy.verdict.steps_per_second and busy.verdict.steps_per_second > 10
        # Due from half a poll before `interval`, sent with a poll: gaps between interval - POLL/2 and
        # interval + POLL. The lower bound has slack for a CPU-starved test machine (polls run late).
        assert 0.6 * window / (interval + POLL) <= idle_canaries <= window / (interval - POLL / 2) + 1, idle_canaries
        assert idle.canaries["error"] == idle.canaries["timeout"] == 0
        assert idle.verdict.state == "idle"
        assert (await client.get("/probe/idle/ready")).status == 200


async def test_hang_becomes_stuck_within_stuck_after_plus_a_poll(aiohttp_client) -> None:
    async with Fleet(SimConfig(max_num_seqs=2, tokens_per_second=100), backends=1) as fleet:
        client = await start_exporter(aiohttp_client, make_settings(
            [sim_target("gpu-a", fleet.backend_urls[0])], poll_interval=POLL))
        rec = record(client, "gpu-a")
        async with load(fleet.backend_urls[0], workers=4, max_tokens=200):
            await wait_for(lambda: rec.verdict.state == "busy" and rec.verdict.reason == "progress", what="busy")
            await wait_for(lambda: rec.verdict.steps_per_second, what="a rate")
            fleet.backends[0].set_fault("hang")
            hung_at = time.time()
            await wait_for(lambda: rec.verdict.state == "stuck", timeout=STUCK_AFTER + 5, what="stuck")
            took = time.time() - hung_at
            # Stuck within stuck_after plus one poll of the last read that saw progress (jitter is 10%) ...
            verdict = rec.verdict
            # (SLACK absorbs a late poll on a CPU-starved test machine.)
            assert verdict.since - verdict.last_progress <= STUCK_AFTER + POLL * 1.1 + SLACK
            # ... and that read is at most one poll after the hang itself.
            assert took <= STUCK_AFTER + 2 * POLL * 1.1 + SLACK, took
            view = await target_json(client, "gpu-a")
            assert view["state"] == "stuck" and view["reason"] == "no_progress"
            assert view["stuck_seconds"] >= STUCK_AFTER and view["ready"] is False
            assert view["live"] is True  # liveness waits for 2 x stuck_after
            await wait_for(lambda: time.monotonic() - rec.verdict.last_progress > 2 * STUCK_AFTER, timeout=5,
                           what="liveness budget spent")
            assert (await client.get("/probe/gpu-a/live")).status == 503
            fleet.backends[0].set_fault("none")
            await wait_for(lambda: rec.verdict.state == "busy", timeout=5, what="moving again")


async def test_die_becomes_down(aiohttp_client) -> None:
    async with Fleet(SimConfig(), backends=1) as fleet:
        client = await start_exporter(aiohttp_client, make_settings(
            [sim_target("gpu-a", fleet.backend_urls[0])], poll_interval=POLL))
        rec = record(client, "gpu-a")
        await wait_for(lambda: rec.verdict.state == "idle", what="idle")
        await fleet.backends[0].die()
        await wait_for(lambda: rec.verdict.state == "down", timeout=5, what="down")
        assert rec.verdict.reason in ("refused", "health_503")
        view = await target_json(client, "gpu-a")
        assert view["up"] is False and view["ready"] is False
        metrics = await (await client.get("/metrics")).text()
        assert 'llm_vitals_state{state="down",target="gpu-a"} 1.0' in metrics


async def test_restart_counts_exactly_one_restart_then_idle(aiohttp_client) -> None:
    async with Fleet(SimConfig(startup_seconds=0.6), backends=1) as fleet:
        client = await start_exporter(aiohttp_client, make_settings(
            [sim_target("gpu-a", fleet.backend_urls[0])], poll_interval=POLL))
        rec = record(client, "gpu-a")
        async with load(fleet.backend_urls[0], workers=2, max_tokens=20):
            await wait_for(lambda: rec.verdict.snapshot and rec.verdict.snapshot.generation_tokens > 50, what="counters")
        first_start = rec.verdict.process_start_time
        fleet.backends[0].set_fault("restart")
        await wait_for(lambda: rec.verdict.restarts == 1, timeout=8, what="one restart")
        await wait_for(lambda: rec.verdict.state == "idle", timeout=5, what="idle after restart")
        for _ in range(8):  # several more polls: still exactly one
            await asyncio.sleep(POLL)
        view = await target_json(client, "gpu-a")
        assert view["restarts"] == 1 and view["state"] == "idle"
        assert view["process_start_time"] != first_start
        assert view["last_restart_at"] is not None
        assert "llm_vitals_restarts_total{target=\"gpu-a\"} 1.0" in await (await client.get("/metrics")).text()


async def test_proxy_is_judged_through_v1_models_only(aiohttp_client) -> None:
    async with Fleet(SimConfig(), backends=2, proxy=True) as fleet:
        client = await start_exporter(aiohttp_client, make_settings(
            [sim_target("front", fleet.proxy_url, role="proxy")], poll_interval=POLL))
        rec = record(client, "front")
        await wait_for(lambda: rec.polls >= 4, what="four polls")
        view = await target_json(client, "front")
        assert view["state"] == "idle" and view["reason"] == "proxy_models_ok"
        assert view["counters"] == {} and view["running"] is None
        assert sum(rec.canaries.values()) == 0
        # When every backend is gone the proxy cannot list models: the proxy is down.
        for backend in fleet.backends:
            await backend.die()
        await wait_for(lambda: rec.verdict.state == "down", timeout=5, what="proxy down")


async def test_proxy_target_never_reads_metrics(aiohttp_server, aiohttp_client) -> None:
    upstream = FakeVllm()
    server = await aiohttp_server(upstream.app())
    client = await start_exporter(aiohttp_client, make_settings(
        [sim_target("front", str(server.make_url("")), role="proxy")], poll_interval=0.1))
    await wait_for(lambda: len(upstream.models_headers) >= 4, what="four /v1/models reads")
    assert upstream.metrics_reads == 0 and upstream.completions == []
    assert record(client, "front").verdict.reason == "proxy_models_ok"
