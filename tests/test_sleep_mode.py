"""vLLM's sleep mode: the simulator's /sleep, /wake_up and /is_sleeping, and the exporter's `asleep` against it.

A sleeping engine is put to sleep on purpose (RL frameworks, model-swapping gateways). It must get
no canary (on a GPU a request to a sleeping vLLM has crashed it, vLLM issue #15483), must never read
stuck or unresponsive (a restart candidate), and is not ready but live.
"""

from __future__ import annotations

import aiohttp
from test_exporter_helpers import make_settings, make_target, record, start_exporter, wait_for

from llm_vitals.exporter.engines.vllm import parse_page
from llm_vitals.sim.fleet import Fleet, SimConfig

POLL = 0.25


async def test_the_simulator_sleeps_and_wakes_as_vllm_does() -> None:
    async with Fleet(SimConfig(), backends=1) as fleet, aiohttp.ClientSession() as http:
        url = fleet.backend_urls[0]

        async def sleeping() -> tuple[bool, int]:
            async with http.get(f"{url}/is_sleeping") as r:
                answer = await r.json()
            async with http.get(f"{url}/metrics") as r:
                page = await r.read()
            return answer["is_sleeping"], parse_page(page).sleep_level

        assert await sleeping() == (False, 0)
        async with http.post(f"{url}/sleep", params={"level": "2"}) as r:
            assert r.status == 200
        assert await sleeping() == (True, 2)
        async with http.post(f"{url}/sleep", params={"level": "3"}) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "level"
        async with http.post(f"{url}/wake_up") as r:
            assert r.status == 200
        assert await sleeping() == (False, 0)


async def test_a_sleeping_server_is_asleep_gets_no_canary_and_wakes_to_idle(aiohttp_client) -> None:
    async with Fleet(SimConfig(), backends=1) as fleet, aiohttp.ClientSession() as http:
        url = fleet.backend_urls[0]
        client = await start_exporter(aiohttp_client, make_settings(
            [make_target("gpu-a", url, canary={"interval": 0.5, "timeout": 1})], poll_interval=POLL))
        gpu_a = record(client, "gpu-a")
        await wait_for(lambda: gpu_a.canaries["ok"] >= 1 and gpu_a.canary_task is None, what="a first canary")
        async with http.post(f"{url}/sleep", params={"level": "1"}) as r:
            assert r.status == 200
        await wait_for(lambda: gpu_a.verdict.state == "asleep", what="asleep")
        sent, polls = sum(gpu_a.canaries.values()), gpu_a.polls
        await wait_for(lambda: gpu_a.polls >= polls + 12, what="a dozen polls while asleep")  # 3 s: 6 canary intervals
        assert sum(gpu_a.canaries.values()) == sent and gpu_a.canary_task is None
        assert {state for _, _, state in list(gpu_a.history)[-12:]} == {"asleep"}  # never stuck nor unresponsive
        assert "level 1" in gpu_a.verdict.detail
        async with client.get("/probe/gpu-a/ready") as r:
            assert r.status == 503
        async with client.get("/probe/gpu-a/live") as r:
            assert r.status == 200
        async with client.get("/metrics") as r:
            assert 'llm_vitals_state{state="asleep",target="gpu-a"} 1.0' in await r.text()
        async with http.post(f"{url}/wake_up") as r:
            assert r.status == 200
        await wait_for(lambda: gpu_a.verdict.state == "idle" and gpu_a.ready(gpu_a.verdict.last_poll or 0),
                       what="idle and ready again")
