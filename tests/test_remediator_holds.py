"""Holds the remediator keeps for every replica, and what it does of its own between re-sends.

- One table of checks (`gate.CHECKS`) is walked by `decide` and by the backstop's word: for a stuck
  target, the word says the reason the gate refuses with. Before, the word re-implemented the refusal
  order by hand (a circuit open in the cooldown: the gate said `cooldown`, the word `circuit_open`).
- A refusal that leaves a hang unhandled on purpose holds the word in the shared state: every
  replica answers `hold`, a restarted one too. Before, a `gpu_fault` or `fleet_gate` refusal (with
  storm_cooldown 0) was kept in one replica's memory, and `cordon_limit` held nothing.
- The remediator decides its held targets again itself when the hold ends (`GateLoop.redecide`),
  one restart at a time, without waiting for Alertmanager's re-send.
- A restart no remediator made (the kubelet's) counts in the workload's budget, backoff and circuit,
  once, journaled with `actor: kubelet`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_remediator_helpers import Clock
from test_remediator_loop import OLD, POLICY, T0, Fleet, MemoryStore, alert, replicas  # noqa: F401

from llm_vitals.remediator import gate, gate_word, holds, shared
from llm_vitals.remediator.gate import CHECKS, AlertFacts, FleetView, JournalState, TargetStatus

STUCK = TargetStatus("stuck", process_start_time=OLD)
IDLE = TargetStatus("idle", process_start_time=OLD)
QUIET = FleetView({"a": STUCK, "b": IDLE, "c": IDLE, "d": IDLE, "e": IDLE})


# -- one table --------------------------------------------------------------------------------------

STATES = [
    ("paused", JournalState(paused_until=T0 + 60, pause_reason="upgrade")),
    ("paged", JournalState(pages={"a": T0 - 60})),
    ("restart of it running", JournalState(in_progress="a", in_progress_expires=T0 + 30, last_restart_started=T0 - 5,
                                           restart_times={"a": (T0 - 5,)})),
    ("cooldown", JournalState(last_restart_started=T0 - 60, restart_times={"b": (T0 - 60,)})),
    ("circuit open, in the cooldown", JournalState(open_circuits=frozenset({"a"}), last_restart_started=T0 - 60,
                                                   restart_times={"a": (T0 - 60,)})),
    ("budget used, backoff running", JournalState(restart_times={"a": (T0 - 3000, T0 - 2000, T0 - 1000)},
                                                  backoff={"a": (3, T0 - 1000)})),
    ("backoff", JournalState(backoff={"a": (2, T0 - 1000)}, restart_times={"a": (T0 - 1000,)})),
    ("storm cooldown", JournalState(storm_seen_at=T0 - 30)),
    ("nothing", JournalState()),
]


@pytest.mark.parametrize("state", [s for _, s in STATES], ids=[n for n, _ in STATES])
def test_the_word_and_the_gate_walk_one_table_of_checks(state):
    policy = replace(POLICY, storm_cooldown=600.0)
    decision = gate.decide(alert("a"), QUIET, state, policy, T0)
    word = gate_word.word_for("a", state, policy, T0)
    if decision.allowed:
        assert word.word == "act"
    else:
        assert (word.word, word.reason) == ("hold", decision.reason)
        assert decision.reason in {c.reason for c in CHECKS}


def test_every_check_of_the_table_holds_a_target_it_refuses():
    assert {c.reason for c in CHECKS} <= gate.HOLDING
    assert set(gate_word.HOLD_REASONS) >= gate.HOLDING


# -- holds shared by every replica -------------------------------------------------------------------

GPU = TargetStatus("stuck", process_start_time=OLD, gpu_fault=True, gpu_fault_detail="Xid79: fell off the bus")
STORM = FleetView({"a": STUCK, "b": STUCK, "c": STUCK, "d": IDLE, "e": IDLE})
MOVABLE = replace(GPU, node="node-1", pod="a-pod")


@pytest.mark.parametrize("fleet, over, state, reason", [
    (FleetView({**QUIET.targets, "a": GPU}), {}, JournalState(), "gpu_fault"),
    (STORM, {}, JournalState(), "fleet_gate"),  # storm_cooldown 0 (the default)
    (FleetView({**QUIET.targets, "a": MOVABLE}), {"gpu_fault_action": "cordon_and_move"},
     JournalState(gpu_nodes=frozenset({"node-9"})), "cordon_limit"),
], ids=["gpu_fault", "fleet_gate", "cordon_limit"])
async def test_a_refusal_that_leaves_a_hang_unhandled_holds_every_replicas_word(replicas, fleet, over, state,  # noqa: F811
                                                                                reason):
    clock = Clock(T0)
    store = MemoryStore(clock)
    store.state = state
    first = await replicas(store, clock, Fleet(fleet), **over)
    second = await replicas(store, clock, Fleet(fleet), **over)
    assert await first.decide(alert("a")) == reason
    for replica in (first, second):  # what each answers, on the state it reads
        word = gate_word.word_for("a", store.state, replica.loop.policy, clock())
        assert (word.word, word.reason) == ("hold", reason)
    # A replica started afresh reads the same state, past any in-memory hold time too.
    clock.advance(gate_word.HELD_STALE - 1)
    restarted = await replicas(store, clock, Fleet(fleet), **over)
    assert gate_word.word_for("a", store.state, restarted.loop.policy, clock()).reason == reason


async def test_a_resolved_alert_ends_its_targets_hold(replicas):  # noqa: F811
    clock = Clock(T0)
    store = MemoryStore(clock)
    replica = await replicas(store, clock, Fleet(FleetView({**QUIET.targets, "a": GPU})))
    assert await replica.decide(alert("a")) == "gpu_fault"
    assert shared.summary(store.state)["held_targets"] == {"a": "gpu_fault"}  # GET /api/v1/state shows it
    assert await replica.decide(replace(alert("a"), status="resolved")) == "not_firing"
    assert store.state.held == {}
    assert gate_word.word_for("a", store.state, replica.loop.policy, clock()).word == "act"


# -- the remediator goes first when a hold ends ---------------------------------------------------------

async def test_a_lifted_pause_is_decided_again_by_the_remediator_one_restart_at_a_time(replicas):  # noqa: F811
    clock = Clock(T0)
    store = MemoryStore(clock)
    fleet = Fleet(FleetView({"a": STUCK, "b": STUCK, "c": IDLE, "d": IDLE, "e": IDLE}))
    replica = await replicas(store, clock, fleet)
    replica.executor.hold.set()
    store.state = JournalState(paused_until=T0 + 600, pause_reason="maintenance")
    assert [await replica.decide(alert(t)) for t in "ab"] == ["paused", "paused"]
    assert {t: h.reason for t, h in store.state.held.items()} == {"a": "paused", "b": "paused"}
    assert await replica.loop.redecide() == []  # still paused: nothing due, nothing written
    store.state = replace(store.state, paused_until=None)  # a human lifts the pause
    # Still `hold` until the remediator has decided again.
    assert gate_word.word_for("b", store.state, replica.loop.policy, clock()).reason == "paused"
    decisions = await replica.loop.redecide()
    assert [d.reason for d in decisions] == ["allowed", "restart_in_progress"]  # the longest held first
    await replica.actor.wait_idle()
    assert replica.executor.calls == 1
    assert {t: h.reason for t, h in store.state.held.items()} == {"b": "restart_in_progress"}
    word = gate_word.word_for("b", store.state, replica.loop.policy, clock())
    assert (word.word, word.reason) == ("hold", "cooldown")
    clock.advance(replica.loop.policy.global_cooldown)  # the cooldown over: `b` goes next, no re-send needed
    fleet.view = FleetView({**fleet.view.targets, "a": IDLE})
    assert [d.reason for d in await replica.loop.redecide()] == ["allowed"]
    await replica.actor.wait_idle()
    assert replica.executor.calls == 2 and store.state.held == {}


async def test_a_held_target_that_stays_held_is_written_again_only_every_refresh(replicas):  # noqa: F811
    clock = Clock(T0)
    store = MemoryStore(clock)
    replica = await replicas(store, clock, Fleet(FleetView({**QUIET.targets, "a": GPU})))
    assert await replica.decide(alert("a")) == "gpu_fault"
    await replica.loop.redecide()  # its first look remembers the restarts the exporter shows (none)
    version = store.version
    clock.advance(gate.HELD_REFRESH - 1)
    assert await replica.loop.redecide() == []
    assert store.version == version
    clock.advance(1)
    assert [d.reason for d in await replica.loop.redecide()] == ["gpu_fault"]
    assert store.state.held["a"].at == clock() and store.state.held["a"].since == T0


# -- every restart counted ----------------------------------------------------------------------------

def pod(restarted: float | None) -> TargetStatus:
    return TargetStatus("idle", process_start_time=OLD, last_restart_time=restarted, pod="a-pod", namespace="llm",
                        workload="a")


async def test_the_kubelets_restarts_count_in_the_budget_backoff_and_circuit_once_each(replicas):  # noqa: F811
    clock = Clock(T0)
    store = MemoryStore(clock)
    fleet = Fleet(FleetView({**QUIET.targets, "a": pod(None)}))
    replica = await replicas(store, clock, fleet)
    await replica.loop.redecide()  # first sight: what came before is not known, nothing counted
    assert store.state.seen_restarts["a"] == -1.0 and store.state.outside_restarts == {}
    for n, at in enumerate((T0 + 100, T0 + 200, T0 + 300), start=1):
        clock.now = at + 5
        fleet.view = FleetView({**QUIET.targets, "a": pod(at)})
        await replica.loop.redecide()
        await replica.loop.redecide()  # the same restart seen again: counted once
        assert store.state.outside_restarts["a"] == tuple(T0 + 100 * i for i in range(1, n + 1))
        assert store.state.backoff["a"][0] == n
    assert "a" in store.state.open_circuits  # the budget (3) is used up by the kubelet
    assert gate.decide(alert("a"), FleetView({**QUIET.targets, "a": STUCK}), store.state, replica.loop.policy,
                       clock()).reason == "circuit_open"
    await replica.journal.drain()
    rows = [r for r in await replica.journal.actions(20) if r["decision"] == "restart_seen"]
    assert [(r["target"], r["actor"], r["reason"]) for r in rows] == [("a", "kubelet", "outside_restart")] * 3


async def test_a_restart_read_again_a_little_apart_is_the_same_restart(replicas):  # noqa: F811
    """The exporter converts a restart's time from its monotonic clock at each read: it moves by milliseconds."""
    clock = Clock(T0)
    store = MemoryStore(clock)
    store.state = JournalState(seen_restarts={"a": T0 - 20})
    replica = await replicas(store, clock, Fleet(FleetView({**QUIET.targets, "a": pod(T0 - 19.997)})))
    await replica.loop.redecide()
    assert store.state.outside_restarts == {} and store.state.seen_restarts["a"] == T0 - 20


async def test_the_remediators_own_restart_is_not_counted_twice(replicas):  # noqa: F811
    clock = Clock(T0)
    store = MemoryStore(clock)
    store.state = JournalState(seen_restarts={"a": -1.0}, restart_times={"a": (T0 - 60,)})
    fleet = Fleet(FleetView({**QUIET.targets, "a": pod(T0 - 20)}))
    replica = await replicas(store, clock, fleet)
    await replica.loop.redecide()
    assert store.state.seen_restarts["a"] == T0 - 20 and store.state.outside_restarts == {}


def test_a_held_alert_is_decided_again_as_alertmanager_sent_it():
    held = gate.HeldAlert("a", "paused", T0, T0, "fp-a", T0 - 600, "LLMServerDown")
    assert held.facts("a") == AlertFacts("firing", {"alertname": "LLMServerDown", "target": "a",
                                                    "remediation": "restart"}, "fp-a", T0 - 600)


@pytest.mark.parametrize("age, due", [(gate.HELD_REFRESH - 1, False), (gate.HELD_REFRESH, True)])
def test_an_eviction_a_disruption_budget_refused_is_held_and_tried_again_only_every_refresh(age, due):
    facts = alert("a")
    state = shared.held_for(JournalState(), facts, "a", "disruption_budget", T0)
    word = gate_word.word_for("a", state, POLICY, T0 + age)
    assert (word.word, word.reason) == ("hold", "disruption_budget")  # the kubelet does not restart it either
    # The gate alone would allow it at once: without the wait, every look would evict (and be refused) again.
    assert gate.decide(facts, QUIET, state, POLICY, T0 + age).allowed
    assert bool(holds.due(state, QUIET, POLICY, T0 + age)) == due
