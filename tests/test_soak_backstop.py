"""The kubelet's liveness backstop as an actor of the fleet soak (bench/soak_backstop.py, issue 33).

The soak's fleet hangs as scheduled while a human has paused the remediator: with the shims asking
the remediator for their word, the kubelet restarts nothing either; with liveness alone (as before
issue 33), the kubelet restarts the hung servers the pause was meant to leave alone. Its restarts are
the soak's actions, so the invariants judge them as they judge the remediator's.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from conftest import REPO, load_script

pytestmark = pytest.mark.xdist_group("soak")

soak_module = load_script(REPO / "bench" / "soak.py")
backstop_module = load_script(REPO / "bench" / "soak_backstop.py")
fleet_sim = soak_module.fleet_sim

HALF_DAY = fleet_sim.FleetConfig(days=0.5, workloads=20, seed=15)


async def paused_soak(directory: Path, obey: bool) -> tuple[int, dict[str, int]]:
    """Half a day of the seeded fleet with the remediator paused throughout: the kubelet's restarts."""
    logging.getLogger("llm_vitals").setLevel(logging.ERROR)
    # Only this kubelet (obeying or not): the soak's own is left out.
    soak = soak_module.Soak(soak_module.SoakConfig(HALF_DAY, "sqlite", kubelet=False), directory)
    kubelet = backstop_module.KubeletBackstop(obey=obey)
    soak.actors.append(kubelet)
    for replica in soak.replicas:
        await replica.start()
    try:
        service = soak.replicas[0].service
        await service.set_pause(soak.clock() + 86400.0, "maintenance")
        end = soak.clock() + HALF_DAY.days * 86400.0
        while soak.clock() < end:
            await soak.step()
    finally:
        for replica in soak.replicas:
            if replica.service is not None:
                await replica.stop()
    return kubelet.restarts, dict(soak.tallies)


def test_a_paused_remediator_holds_the_kubelet_too(tmp_path):
    alone, tallies = asyncio.run(paused_soak(tmp_path / "alone", obey=False))
    assert tallies.get("incident hang", 0) + tallies.get("incident recurring_hang", 0) > 0
    assert alone > 0, "liveness alone restarts the hung servers of a paused fleet"
    held, tallies = asyncio.run(paused_soak(tmp_path / "held", obey=True))
    assert held == 0, "the kubelet restarted what the paused remediator held"
    assert tallies.get("action restart", 0) == 0 and tallies.get("decision paused", 0) > 0
