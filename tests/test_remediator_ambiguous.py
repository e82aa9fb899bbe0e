"""Ambiguous commits: a restart's intent whose outcome the remediator could not learn is re-read and
carried out once or released, within Alertmanager's re-sends; it is never a `duplicate` for ever.

Before, the alert's key was committed with the intent: a Lease write the API server applied with its
answer lost, a journal row that failed after the commit, or a replica that died in between left the
key decided, and every re-send was `duplicate` for 24 h (Lease) or 30 days (SQLite): nothing was
restarted and no alert said so. The Lease is the soak's in-memory API server (bench/memory_leases.py).
"""

from __future__ import annotations

import pytest
from conftest import REPO, load_script
from test_remediator_helpers import Clock
from test_remediator_loop import T0, Crash, Fleet, MemoryStore, alert, open_sqlite, replicas  # noqa: F401

from llm_vitals.remediator.gate import Effects
from llm_vitals.remediator.metrics import RemediatorMetrics
from llm_vitals.remediator.model import FleetView, GateState, Intent, TargetStatus
from llm_vitals.remediator.settings import LeaseRef
from llm_vitals.remediator.state import claim_lapsed, with_effects
from llm_vitals.remediator.state_codec import from_json, to_json
from llm_vitals.remediator.store.lease import LeaseStore

MemoryLeases = load_script(REPO / "bench" / "memory_leases.py").MemoryLeases

STUCK = TargetStatus("stuck", process_start_time=T0 - 7200)
IDLE = TargetStatus("idle", process_start_time=T0 - 7200)
FLEET = Fleet(FleetView({"a": STUCK, "b": IDLE, "c": IDLE, "d": IDLE, "e": IDLE}))
KEY = alert("a").key
HELD = GateState(in_progress="a", in_progress_expires=T0 + 60, in_progress_by="r/1", in_progress_key=KEY,
                    decided_keys=frozenset({KEY}), decided_at={KEY: T0}, restart_times={"a": (T0,)},
                    last_restart_started=T0)


@pytest.mark.parametrize("now, after", [
    (T0 + 59, HELD),  # the claim holds: its alert is a duplicate while the restart may run
    (T0 + 60, GateState(restart_times={"a": (T0,)}, last_restart_started=T0)),  # lapsed: judged afresh
    (None, GateState(restart_times={"a": (T0,)}, last_restart_started=T0)),  # a one-replica start
])
def test_a_lapsed_claim_ends_and_its_alert_is_judged_afresh_with_its_budget_still_spent(now, after):
    assert claim_lapsed(HELD, now) == after
    assert from_json(to_json(HELD)) == HELD  # the key travels with the claim


def lease_replica_store(leases: MemoryLeases, clock: Clock) -> LeaseStore:
    return LeaseStore(leases, LeaseRef(namespace="llm"), "replica-0", 3600.0, clock)  # type: ignore[arg-type]


async def test_a_lease_write_applied_with_its_answer_lost_is_carried_out_once(replicas):  # noqa: F811
    clock = Clock(T0)
    leases = MemoryLeases(clock)
    store = lease_replica_store(leases, clock)
    replica = await replicas(store, clock, FLEET)
    leases.lose_answers = 1
    assert await replica.decide(alert("a")) == "allowed"  # re-read: the intent holds, so it runs
    await replica.actor.wait_idle()
    assert replica.executor.calls == 1
    assert await replica.decide(alert("a")) == "duplicate"  # carried out once: a re-send does not repeat it
    assert (await store.read())[0].in_progress is None


async def test_an_intent_left_unknown_is_counted_then_released_and_the_resend_acts(replicas):  # noqa: F811
    clock = Clock(T0)
    leases = MemoryLeases(clock)
    store = lease_replica_store(leases, clock)
    replica = await replicas(store, clock, FLEET, global_cooldown="0s")
    leases.lose_answers = 1
    original = leases.create_lease

    async def write_then_away(*args):  # the API server goes away right after it applied the write
        try:
            return await original(*args)
        finally:
            leases.down = True

    leases.create_lease = write_then_away
    assert await replica.decide(alert("a")) == "state_unreachable"
    assert store.health.unresolved == 1
    assert replica.loop.ledger.unresolved
    assert replica.executor.calls == 0
    # The unresolved intent is exported (LLMVitalsRemediatorIntentUnresolved reads it).
    metrics = RemediatorMetrics(["a"], replica.journal, lambda: store.last, clock, lambda: store.health)
    assert metrics.registry.get_sample_value("llm_vitals_remediator_unresolved_intents") == 1.0
    leases.create_lease = original
    leases.down = False
    clock.now = T0 + 960  # Alertmanager's next re-send (repeat_interval rounded to group_interval)
    assert await replica.decide(alert("a")) == "allowed"  # released first, then judged afresh
    await replica.actor.wait_idle()
    assert replica.executor.calls == 1 and store.health.unresolved == 0 and not replica.loop.ledger.unresolved


async def test_a_replica_that_died_after_its_commit_leaves_its_alert_to_the_next_resend(replicas):  # noqa: F811
    store, clock = MemoryStore(), Clock(T0)
    first = await replicas(store, clock, FLEET, global_cooldown="60s")
    store.crash_after_commit = True
    with pytest.raises(Crash):
        await first.decide(alert("a"))
    store.crash_after_commit = False
    second = await replicas(store, clock, FLEET, global_cooldown="60s")
    assert await second.decide(alert("a")) == "duplicate"  # its claim still holds
    clock.now = T0 + 960  # the next re-send: the claim lapsed, the cooldown and the backoff it started are over
    assert await second.decide(alert("a")) == "allowed"  # before: `duplicate` for 24 h
    await second.actor.wait_idle()
    assert (first.executor.calls, second.executor.calls) == (0, 1)


async def test_sqlite_an_intent_without_its_journal_row_is_judged_afresh_at_the_next_start(tmp_path, replicas):  # noqa: F811
    """The commit reached the file, the journal row did not (the process stopped, or the journal failed):
    before, the key stayed decided for 30 days. The journal in the same file is the witness."""
    clock = Clock(T0)
    journal, store = await open_sqlite(tmp_path / "j.db", clock)
    state, version = await store.read()
    claim = Intent("replica-0/abc", "a", None)
    assert await store.commit(version, with_effects(state, Effects(intent=True), alert("a"), T0, claim))
    await store.close()
    await journal.close()

    journal, store = await open_sqlite(tmp_path / "j.db", clock)
    await journal.close()
    assert store.last.in_progress is None and KEY not in store.last.decided_keys
    assert store.last.restart_times == {"a": (T0,)}  # spent: the safe side
    replica = await replicas(store, clock, FLEET, global_cooldown="0s")
    assert await replica.decide(alert("a")) == "allowed"
    await replica.actor.wait_idle()
    await store.close()
