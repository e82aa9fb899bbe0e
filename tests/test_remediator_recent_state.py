"""The state a replica answers from (the pause, the backstop's word) is re-read by the service's own
clock: before, a 1 s cache by real time sat under the soak's virtual clock, so a pause set on another
replica minutes (virtual) ago was not seen."""

from __future__ import annotations

from typing import cast

import aiohttp
from conftest import REPO, load_script
from test_remediator_helpers import Clock, make_settings
from test_remediator_loop import T0

from llm_vitals.remediator import shared
from llm_vitals.remediator.journal import Journal
from llm_vitals.remediator.service import Remediator
from llm_vitals.remediator.settings import LeaseRef
from llm_vitals.remediator.store import LeaseStore, update

MemoryLeases = load_script(REPO / "bench" / "memory_leases.py").MemoryLeases


async def test_a_pause_set_on_another_replica_a_minute_ago_is_seen(tmp_path):
    clock = Clock(T0)
    leases = MemoryLeases(clock)
    mine = LeaseStore(leases, LeaseRef(namespace="llm"), "replica-a", 3600.0, clock)  # type: ignore[arg-type]
    other = LeaseStore(leases, LeaseRef(namespace="llm"), "replica-b", 3600.0, clock)  # type: ignore[arg-type]
    settings = make_settings(tmp_path, "http://127.0.0.1:1", {"a": {"executor": "http", "url": "http://127.0.0.1:1/r"}})
    journal = Journal(tmp_path / "journal.db")
    await journal.open(T0)
    service = Remediator(settings, journal, mine, cast(aiohttp.ClientSession, None), clock, {}, None)
    try:
        assert (await service.recent_state()).paused_until is None
        await update(other, lambda s: shared.paused_state(s, T0 + 3600, "maintenance"))
        assert (await service.recent_state()).paused_until is None  # within the same second: the cache
        clock.now += 60  # a minute of the service's clock, however little real time passed
        assert (await service.recent_state()).paused_until == T0 + 3600
        clock.now -= 120  # a clock stepped back reads again too
        await update(other, lambda s: shared.paused_state(s, None, ""))
        assert (await service.recent_state()).paused_until is None
    finally:
        await service.shutdown()
        await journal.close()
