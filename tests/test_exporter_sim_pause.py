"""Issue 38 end to end on loopback: the exporter against the simulator's vLLM pause and sleep with requests kept.

The simulator serves `POST /pause?mode=keep`, `/resume` and `GET /is_paused` as vLLM 0.32 does with
VLLM_SERVER_DEV_MODE=1 (a hung engine does not answer `/is_paused`), and `/sleep?mode=keep`. Under
load, a pause reads `paused` (never stuck, never restartable, no canary), pages past `pause_budget`,
ends busy on `/resume`, and a real hang right after is still `stuck` within stuck_after and a few polls.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from test_exporter_helpers import make_settings, record, start_exporter, target_json, wait_for
from test_exporter_sim import POLL, SLACK, STUCK_AFTER, load, sim_target

from llm_vitals.sim.fleet import Fleet, SimConfig
from llm_vitals.targets import RESTARTABLE_STATES

PAUSE_BUDGET = 3 * STUCK_AFTER + 1.0  # scaled down from 30 min: a pause held past it in one test


async def test_the_simulator_pauses_and_resumes_as_vllm_does() -> None:
    async with Fleet(SimConfig(), backends=1) as fleet, aiohttp.ClientSession() as http:
        url = fleet.backend_urls[0]

        async def is_paused() -> bool:
            async with http.get(f"{url}/is_paused") as r:
                return bool((await r.json())["is_paused"])

        assert not await is_paused()
        async with http.post(f"{url}/pause", params={"mode": "keep"}) as r:
            assert (r.status, await r.json()) == (200, {"status": "paused"})
        assert await is_paused()
        async with http.post(f"{url}/pause", params={"mode": "later"}) as r:
            assert r.status == 400 and "mode" in (await r.json())["error"]
        async with http.post(f"{url}/resume") as r:
            assert (r.status, await r.json()) == (200, {"status": "resumed"})
        assert not await is_paused()


async def test_a_vllm_paused_with_nothing_pending_on_its_page_is_paused_and_its_canaries_stop(aiohttp_client) -> None:
    # The page reads 0 running, 0 waiting (as a real paused vLLM's did for 11 s in CI with requests
    # kept in it): the route is asked a poll before each canary, so the pause is read before one goes.
    async with Fleet(SimConfig(), backends=1) as fleet, aiohttp.ClientSession() as http:
        url = fleet.backend_urls[0]
        client = await start_exporter(aiohttp_client, make_settings(
            [sim_target("rl", url, canary={"interval": 1.0, "timeout": 1})], poll_interval=POLL, health_timeout=0.5))
        rl = record(client, "rl")
        await wait_for(lambda: sum(rl.canaries.values()) >= 2, what="two idle canaries")
        async with http.post(f"{url}/pause", params={"mode": "keep"}) as r:
            assert r.status == 200
        sent_at_pause = sum(rl.canaries.values()) + (1 if rl.canary_task is not None else 0)
        await wait_for(lambda: rl.verdict.state == "paused", timeout=1.0 + 3 * POLL + SLACK, what="paused")
        sent_when_paused = sum(rl.canaries.values()) + (1 if rl.canary_task is not None else 0)
        # At most the one canary whose ask went just before the pause, and none while paused.
        assert sent_when_paused - sent_at_pause <= 1
        await asyncio.sleep(4 * 1.0)
        assert (rl.verdict.state, rl.verdict.reason) == ("paused", "paused"), rl.verdict.detail
        assert sum(rl.canaries.values()) + (1 if rl.canary_task is not None else 0) == sent_when_paused
        async with http.post(f"{url}/resume") as r:
            assert r.status == 200
        await wait_for(lambda: sum(rl.canaries.values()) > sent_when_paused, timeout=1.0 + 3 * POLL + SLACK,
                       what="a canary after /resume")


async def test_a_pause_under_load_is_paused_pages_past_its_budget_and_a_hang_after_resume_is_stuck(
        aiohttp_client) -> None:
    async with Fleet(SimConfig(max_num_seqs=2, tokens_per_second=100), backends=1) as fleet, \
            aiohttp.ClientSession() as http:
        url = fleet.backend_urls[0]
        client = await start_exporter(aiohttp_client, make_settings(
            [sim_target("rl", url, pause_budget=PAUSE_BUDGET, canary={"interval": 0.5, "timeout": 1})],
            poll_interval=POLL, health_timeout=0.5))
        rl = record(client, "rl")
        async with load(url, workers=6, max_tokens=400):
            await wait_for(lambda: rl.verdict.state == "busy" and rl.verdict.reason == "progress", what="busy")
            async with http.post(f"{url}/pause", params={"mode": "keep"}) as r:
                assert r.status == 200
            paused_at, states = time.monotonic(), set()
            # More than 3 x stuck_after, and past the budget, which counts from the first read that said
            # paused (the pause route is asked only once the verdict would be stuck: stuck_after in).
            while time.monotonic() - paused_at < STUCK_AFTER + PAUSE_BUDGET + 1.0:
                assert rl.verdict.state not in RESTARTABLE_STATES, rl.verdict.detail
                states.add(rl.verdict.state)
                await asyncio.sleep(POLL)
            assert rl.verdict.state == "paused" and rl.verdict.reason == "paused", rl.verdict.detail
            assert states <= {"busy", "paused"} and sum(rl.canaries.values()) == 0
            view = await target_json(client, "rl")
            assert (view["paused_too_long"], view["ready"], view["live"], view["restarts"]) == (True, True, True, 0)
            async with client.get("/metrics") as r:
                page = await r.text()
            assert 'llm_vitals_state{state="paused",target="rl"} 1.0' in page
            assert 'llm_vitals_paused_too_long{target="rl"} 1.0' in page

            async with http.post(f"{url}/resume") as r:
                assert r.status == 200
            await wait_for(lambda: rl.verdict.state == "busy" and rl.verdict.reason == "progress", timeout=3,
                           what="busy after /resume")
            fleet.backends[0].set_fault("hang")
            hung_at = time.monotonic()
            # /is_paused goes unanswered (health_timeout 0.5 s) on the read that would be stuck.
            await wait_for(lambda: rl.verdict.state == "stuck", timeout=STUCK_AFTER + 5, what="stuck")
            assert rl.verdict.reason == "no_progress"
            assert time.monotonic() - hung_at <= STUCK_AFTER + 3 * POLL * 1.1 + 0.5 + SLACK
            fleet.backends[0].set_fault("none")


async def test_a_sleep_with_requests_kept_is_paused_not_stuck_and_not_ready(aiohttp_client) -> None:
    async with Fleet(SimConfig(max_num_seqs=2, tokens_per_second=100), backends=1) as fleet, \
            aiohttp.ClientSession() as http:
        url = fleet.backend_urls[0]
        client = await start_exporter(aiohttp_client, make_settings([sim_target("rl", url)], poll_interval=POLL))
        rl = record(client, "rl")
        async with load(url, workers=6, max_tokens=400):
            await wait_for(lambda: rl.verdict.state == "busy" and rl.verdict.reason == "progress", what="busy")
            async with http.post(f"{url}/sleep", params={"level": "1", "mode": "keep"}) as r:
                assert r.status == 200
            asleep_at = time.monotonic()
            while time.monotonic() - asleep_at < 2 * STUCK_AFTER + 1:
                assert rl.verdict.state not in RESTARTABLE_STATES, rl.verdict.detail
                await asyncio.sleep(POLL)
            assert (rl.verdict.state, rl.verdict.reason) == ("paused", "sleep_kept"), rl.verdict.detail
            assert (await client.get("/probe/rl/ready")).status == 503
            assert (await client.get("/probe/rl/live")).status == 200
            async with http.post(f"{url}/wake_up") as r:
                assert r.status == 200
            await wait_for(lambda: rl.verdict.state == "busy" and rl.verdict.reason == "progress", timeout=3,
                           what="busy after /wake_up")
