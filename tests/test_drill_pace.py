"""A limping replica among its peers, on the simulator (issue 40): three simulated vLLM replicas of
one workload under closed-loop load, each watched by the exporter.

- One slowed 3x (the simulator's `slow` fault stretches every step): it reads degraded within
  pace.degraded_after + 2 windows; its peers never; nothing reads stuck.
- All three slowed together: a fleet-wide slowdown degrades none.
- Uneven load (4, 4 and 2 clients) with no fault: none degraded.

Times are scaled: poll 0.25 s, pace.window 1.5 s, pace.degraded_after 2 s, pace.min_work 20 tokens.
The times to degraded are written to .cache/drill-pace.json.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from conftest import REPO
from drill_report import add_figures
from test_drill_flaky_metrics import load
from test_exporter_helpers import make_settings, make_target, record, start_exporter, wait_for

from llm_vitals.sim.config import SimConfig
from llm_vitals.sim.fleet import Fleet

POLL = 0.25
WINDOW = 1.5
DEGRADED_AFTER = 2.0
SLACK = 1.5  # late polls on a loaded 2-core box
WORKLOAD = "Deployment/sim/llm"
NAMES = ("r0", "r1", "r2")
REPORT = REPO / ".cache" / "drill-pace.json"


def report(key: str, figures: dict) -> None:
    add_figures(REPORT, key, figures)


@asynccontextmanager
async def drill(aiohttp_client, clients: tuple[int, int, int], slowed: tuple[int, ...]) -> AsyncIterator[tuple[list[Any], float]]:
    """The fleet under load, the exporter watching it, `slowed` replicas slowed 3x once all are judged:
    yields (the records, when the fault went in)."""
    async with Fleet(SimConfig(engine="vllm", max_num_seqs=8, tokens_per_second=100), backends=3, control=False) as fleet:
        targets = [make_target(name, url, workload=WORKLOAD, stuck_after=3, canary={"enabled": False})
                   for name, url in zip(NAMES, fleet.backend_urls, strict=True)]
        client = await start_exporter(aiohttp_client, make_settings(
            targets, poll_interval=POLL,
            pace={"window": WINDOW, "degraded_after": DEGRADED_AFTER, "min_work": 20, "min_peers": 2}))
        records = [record(client, name) for name in NAMES]
        async with AsyncExitStack() as stack:
            for url, workers in zip(fleet.backend_urls, clients, strict=True):
                await stack.enter_async_context(load(url, "vllm", workers=workers))
            await wait_for(lambda: all(r.pace.basis == "judged" for r in records), timeout=15,
                           what="every replica judged beside its peers")
            for index in slowed:
                fleet.backends[index].set_fault("slow", factor=3.0)
            yield records, time.monotonic()


async def watch(records, seconds: float) -> dict[str, set]:
    """Each replica's degraded flags and states seen over `seconds`."""
    seen: dict[str, set] = {r.name: set() for r in records}
    states: set[str] = set()
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for r in records:
            seen[r.name].add(r.pace.degraded)
            states.add(r.verdict.state)
        await asyncio.sleep(0.05)
    return {"degraded": seen, "states": states}  # type: ignore[dict-item]


async def test_one_replica_slowed_reads_degraded_and_its_peers_never(aiohttp_client) -> None:
    async with drill(aiohttp_client, (4, 4, 4), slowed=(2,)) as (records, slowed_at):
        slow, peers = records[2], records[:2]
        bound = DEGRADED_AFTER + 2 * WINDOW + SLACK
        seen_peers: set[bool] = set()

        def degraded() -> bool:
            seen_peers.update(r.pace.degraded for r in peers)
            return slow.pace.degraded

        await wait_for(degraded, timeout=bound, what="the slowed replica degraded")
        took = time.monotonic() - slowed_at
        assert slow.pace.ratio is not None and slow.pace.ratio >= 2.0 and slow.pace.peers == 2, slow.pace
        assert slow.verdict.state == "busy", slow.verdict  # degraded is not a state
        after = await watch(records, WINDOW)
        assert seen_peers == {False} and after["degraded"]["r0"] == after["degraded"]["r1"] == {False}
        assert after["degraded"]["r2"] == {True} and after["states"] == {"busy"}
        report("one-slowed", {"degraded_s": round(took, 2), "bound_s": round(DEGRADED_AFTER + 2 * WINDOW, 2),
                              "ratio": round(slow.pace.ratio, 2)})


async def test_all_replicas_slowed_together_degrade_none(aiohttp_client) -> None:
    async with drill(aiohttp_client, (4, 4, 4), slowed=(0, 1, 2)) as (records, _):
        seen = await watch(records, DEGRADED_AFTER + 2 * WINDOW + SLACK)
        assert all(flags == {False} for flags in seen["degraded"].values()), seen
        assert all(r.pace.basis == "judged" for r in records), [r.pace for r in records]
        report("all-slowed", {"ratios": [round(r.pace.ratio or 0, 2) for r in records]})


async def test_uneven_load_without_a_fault_degrades_none(aiohttp_client) -> None:
    async with drill(aiohttp_client, (4, 4, 2), slowed=()) as (records, _):
        seen = await watch(records, DEGRADED_AFTER + 2 * WINDOW + SLACK)
        assert all(flags == {False} for flags in seen["degraded"].values()), seen
        assert all(r.pace.basis == "judged" for r in records), [r.pace for r in records]
        report("uneven-load", {"ratios": [round(r.pace.ratio or 0, 2) for r in records]})
