"""The Lease store against an in-memory API server's Lease: one clock (the API server's) for every
replica, labels and annotations of others kept, health and the follower's survival.

The transport is the soak's in-memory API server (bench/memory_leases.py), which keeps the API
server's rules that matter to the store: a write must carry the resourceVersion it read (else 409,
`False`), and every answer carries the server's time in whole seconds, as an HTTP `Date` header
does. The real API server runs the same paths in the k8s tier
(tests/k8s/test_workload_safety.py: two replicas 60 s apart).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from conftest import REPO, load_script
from test_remediator_helpers import Clock, follow_for
from test_remediator_loop import T0, Fleet, alert, replicas  # noqa: F401

from llm_vitals.kube.client import Dated
from llm_vitals.kube.errors import KubeUnavailable
from llm_vitals.remediator.model import FleetView, TargetStatus
from llm_vitals.remediator.settings import LeaseRef
from llm_vitals.remediator.store import StateUnavailable
from llm_vitals.remediator.store.lease import STATE_ANNOTATION, LeaseStore, ServerClock

MemoryLeases = load_script(REPO / "bench" / "memory_leases.py").MemoryLeases

STUCK = TargetStatus("stuck", process_start_time=T0 - 7200)
IDLE = TargetStatus("idle", process_start_time=T0 - 7200)


def lease_store(leases: MemoryLeases, identity: str, local: Clock) -> LeaseStore:
    return LeaseStore(leases, LeaseRef(namespace="llm"), identity, 3600.0, local)  # type: ignore[arg-type]


@pytest.mark.parametrize("answers, low, high", [
    # (Date, sent, received) in this replica's clock; the server is 60.3 s ahead
    ([(T0 + 60, T0 - 0.3, T0 - 0.29)], 60.29, 61.3),
    # just after the server's second ticked, then just before it did: 3 hundredths wide
    ([(T0 + 61, T0 + 0.70, T0 + 0.71), (T0 + 60, T0 + 0.68, T0 + 0.69)], 60.29, 60.32),
    ([(T0 + 60, T0 - 0.3, T0 - 0.29), (T0 - 5, T0 + 1, T0 + 1.01)], -6.01, -5.0),  # stepped: start again
    ([(T0 + 60, T0 - 0.3, T0 - 0.29), (T0 + 661, T0 + 600.5, T0 + 600.51)], 60.49, 61.5),  # too old: again
])
def test_the_servers_clock_is_bounded_by_each_dated_answer_and_the_bounds_narrow(answers, low, high):
    clock = ServerClock()
    for date, sent, received in answers:
        clock = clock.observed(date, sent, received)
    assert (clock.low, clock.high) == (pytest.approx(low), pytest.approx(high))
    assert clock.offset == pytest.approx((low + high) / 2)
    assert ServerClock().offset == 0.0


@pytest.mark.parametrize("skew", [60.0, -60.0], ids=["ahead", "behind"])
async def test_two_replicas_a_minute_apart_judge_the_claim_and_the_cooldown_by_one_clock(replicas, skew):  # noqa: F811
    """Replica B's clock is `skew` seconds off. By its own clock it would see A's claim expired (ahead)
    and the cooldown over: a second restart while the first runs. By the API server's it sees neither."""
    server = Clock(T0)
    leases = MemoryLeases(server)
    fleet = Fleet(FleetView({"a": STUCK, "b": STUCK, "c": IDLE, "d": IDLE, "e": IDLE}))
    a_clock, b_clock = Clock(T0), Clock(T0 + skew)
    a = await replicas(lease_store(leases, "replica-a", a_clock), a_clock, fleet, global_cooldown="30s")
    b = await replicas(lease_store(leases, "replica-b", b_clock), b_clock, fleet, global_cooldown="30s")

    def advance(seconds: float) -> None:
        for clock in (server, a_clock, b_clock):
            clock.advance(seconds)

    a.executor.hold.clear()  # A's restart runs (its claim: executor timeout 5 s + 5 s margin)
    try:
        assert await a.decide(alert("a")) == "allowed"
        held = leases.lease["metadata"]["annotations"][STATE_ANNOTATION]  # type: ignore[index]
        assert '"in_progress":"a"' in held
        advance(9)
        assert await b.decide(alert("b")) == "restart_in_progress"
    finally:
        a.executor.hold.set()
    await a.actor.wait_idle()
    advance(20)  # 29 s of the API server's time after A's restart began
    assert await b.decide(alert("b", "fp-b2")) == "cooldown"
    advance(2)
    assert await b.decide(alert("b", "fp-b3")) == "allowed"
    await b.actor.wait_idle()
    assert (a.executor.calls, b.executor.calls) == (1, 1)
    started = [row[1] for row in await a.rows() + await b.rows()].count("restart")
    assert started == 2  # one each, 31 s apart on the API server's clock


async def test_a_dead_replicas_claim_expires_by_the_servers_clock_not_the_reader_s():
    server = Clock(T0)
    leases = MemoryLeases(server)
    dead = lease_store(leases, "replica-a", Clock(T0))
    state, snap = await dead.read()
    from llm_vitals.remediator.gate import Effects, in_progress
    from llm_vitals.remediator.model import AlertFacts, Intent
    from llm_vitals.remediator.state import with_effects

    facts = AlertFacts("firing", {"target": "a", "remediation": "restart"}, "fp", T0 - 60)
    claim = Intent("replica-a/1", "a", T0 + 40)
    assert await dead.commit(snap, with_effects(state, Effects(intent=True), facts, T0, claim))
    ahead = lease_store(leases, "replica-b", Clock(T0 + 60))
    state, _ = await ahead.read()
    assert in_progress(state, ahead.now()) == "a"  # by its own clock (T0 + 60) it would be over
    server.advance(41)
    ahead.clock.advance(41)  # type: ignore[attr-defined]
    state, _ = await ahead.read()
    assert in_progress(state, ahead.now()) is None


async def test_a_write_keeps_the_labels_and_annotations_others_set():
    leases = MemoryLeases(Clock(T0))
    store = lease_store(leases, "replica-a", Clock(T0))
    state, snap = await store.read()
    assert await store.commit(snap, state.__class__(storm_seen_at=T0))
    assert leases.lease is not None
    leases.lease["metadata"]["labels"]["team.example.com/owner"] = "ml-platform"
    leases.lease["metadata"]["annotations"]["argocd.argoproj.io/tracking-id"] = "llm:coordination/Lease"
    leases.lease["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"}]
    state, snap = await store.read()
    assert await store.commit(snap, state.__class__(storm_seen_at=T0 + 1))
    meta = leases.lease["metadata"]
    assert meta["labels"] == {"team.example.com/owner": "ml-platform", "app.kubernetes.io/name": "llm-vitals-remediator"}
    assert meta["annotations"]["argocd.argoproj.io/tracking-id"] == "llm:coordination/Lease"
    assert '"storm_seen_at":' in meta["annotations"][STATE_ANNOTATION]
    assert meta["ownerReferences"][0]["name"] == "x"


async def test_the_store_reports_its_health():
    leases = MemoryLeases(Clock(T0))
    store = lease_store(leases, "replica-a", Clock(T0))
    await store.read()
    assert store.health.up and store.health.errors == {}
    leases.down = True
    with pytest.raises(StateUnavailable):
        await store.read()
    assert not store.health.up and store.health.errors == {"read": 1}
    assert "ConnectionRefusedError" in store.health.last_error
    leases.down = False
    await store.read()
    assert store.health.up


async def test_the_follower_survives_any_error_and_counts_it(caplog):
    """A read that fails is counted by the store (`read`); anything else by the follower (`follow`),
    logged with its traceback; the follower reads again at the next interval either way."""
    caplog.set_level(logging.INFO, logger="llm_vitals.remediator")
    leases = MemoryLeases(Clock(T0))
    store = lease_store(leases, "replica-a", Clock(T0))
    failures = iter([KubeUnavailable("refused"), RuntimeError("a bug in a parser")] + [None] * 8)  # then its Lease, its marker
    real_read = leases.get_lease

    async def read(namespace: str, name: str) -> Dated[dict[str, Any] | None]:
        failure = next(failures)
        if failure is not None:
            raise failure
        return await real_read(namespace, name)

    leases.get_lease = read  # type: ignore[method-assign]
    naps = await follow_for(store, 4)
    assert naps == [15.0] * 4  # it went on after both failures
    assert store.health.errors == {"read": 1, "follow": 1} and store.health.up
    messages = [r.getMessage() for r in caplog.records]
    assert any("following the shared state failed unexpectedly" in m for m in messages)
    assert any("the shared state is readable again" in m for m in messages)
