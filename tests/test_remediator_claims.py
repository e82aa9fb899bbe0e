"""A restart's claim covers the whole action: the wait for the restart lock, the pre_restart
command, the executor and its Events (acting.claim_seconds), and each part is bounded by its own
limit, so a claim never expires while its holder still acts (another replica would start then).

Before, the claim counted only pre_restart and the executor: the Events were sent after the
executor's timeout (a group's one per pod, each up to 6 s) and the lock wait was not counted.
"""

from __future__ import annotations

import asyncio

from test_remediator_executors import tls_files  # noqa: F401
from test_remediator_helpers import Clock
from test_remediator_loop import T0, MemoryStore, alert, replicas  # noqa: F401
from test_remediator_pods import GROUP_LABELS, api  # noqa: F401

import llm_vitals.remediator.acting as acting
import llm_vitals.remediator.pods as pods
from llm_vitals.remediator.gate import Group
from llm_vitals.remediator.pods import GroupExecutor, PodRemover


def test_the_claim_counts_the_lock_wait_the_command_the_executor_and_the_events():
    assert acting.claim_seconds(20.0, 60.0) == (acting.LOCK_WAIT_SECONDS + 20.0 + 60.0 + pods.notes_seconds()
                                                + acting.CLAIM_MARGIN_SECONDS)
    assert pods.notes_seconds() >= 2 * (pods.EVENT_TIMEOUT_SECONDS + 1.0)  # a move's two Events, each bounded


async def test_a_claim_expires_after_everything_its_holder_may_still_do(replicas):  # noqa: F811
    clock = Clock(T0)
    store = MemoryStore(clock)
    replica = await replicas(store, clock)
    replica.executor.hold.clear()  # the restart runs (its executor's timeout: 5 s)
    try:
        assert await replica.decide(alert("a")) == "allowed"
        # Before: T0 + 5 + 5, which a group's Events or a lock wait could outlast.
        assert store.state.in_progress_expires == T0 + acting.claim_seconds(0.0, 5.0)
        assert store.state.in_progress_expires > T0 + 5.0 + acting.CLAIM_MARGIN_SECONDS + pods.notes_seconds()
    finally:
        replica.executor.hold.set()
    await replica.actor.wait_idle()


async def test_a_restart_that_cannot_get_the_lock_in_time_does_not_run(replicas, monkeypatch):  # noqa: F811
    monkeypatch.setattr(acting, "LOCK_WAIT_SECONDS", 0.05)
    clock = Clock(T0)
    store = MemoryStore(clock)
    replica = await replicas(store, clock)
    await replica.actor._restart_lock.acquire()  # another restart of this replica is still finishing
    try:
        assert await replica.decide(alert("a")) == "allowed"
        await replica.actor.wait_idle()
    finally:
        replica.actor._restart_lock.release()
    assert replica.executor.calls == 0 and store.state.in_progress is None
    [row] = await replica.journal.actions(10)
    assert row["result"] == "error" and "restart lock" in row["detail"]


async def test_a_groups_events_end_within_the_notes_time_whatever_each_takes(api, monkeypatch):  # noqa: F811
    server, kube = api
    monkeypatch.setattr(pods, "EVENT_TIMEOUT_SECONDS", 0.1)  # each Event: at most 1.1 s
    server.event_delay = 30.0
    leader = server.add_pod("big-0", GROUP_LABELS)
    for i in range(1, 4):
        server.add_pod(f"big-0-{i}", GROUP_LABELS)
    loop = asyncio.get_running_loop()
    began = loop.time()
    result = await GroupExecutor(PodRemover(kube, "evict"), Group("llm", "big", "0"), leader, "r", "m", 5).restart()
    took = loop.time() - began
    assert result.result == "ok"
    # Four Events of up to 1.1 s each would take 4.4 s; all of them are bounded by notes_seconds (2.2 s).
    assert took < pods.notes_seconds() + 1.0, took
