"""The gate loop (decide -> commit -> act) over the store protocol, and the one-replica SQLite store.

The loop runs with its real parts (policy from settings, `Ledger`, `Actor`, a SQLite journal on
disk) over an in-memory store that implements the protocol as a Lease behaves: another writer may
commit between the loop's read and its commit. The executor is an in-memory fake behind the
`Executor` protocol, so a test can hold a restart and count runs. Time is the test's clock.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from test_remediator_helpers import Clock, follow_for, make_settings

from llm_vitals.remediator.acting import Actor, claim_seconds
from llm_vitals.remediator.executors import ExecResult
from llm_vitals.remediator.gate import Effects, decide, effects_of
from llm_vitals.remediator.journal import Journal
from llm_vitals.remediator.ledger import Ledger, update
from llm_vitals.remediator.loop import GateLoop
from llm_vitals.remediator.metrics import RemediatorMetrics
from llm_vitals.remediator.model import AlertFacts, FleetView, GateState, Intent, TargetStatus
from llm_vitals.remediator.policy import policy_from
from llm_vitals.remediator.state import node_cordoned, paused_state, pruned, with_effects
from llm_vitals.remediator.state_codec import BadState, from_json, to_json
from llm_vitals.remediator.store import CONFLICT_RETRIES, ReadStepCommit, StoreHealth
from llm_vitals.remediator.store.sqlite import SqliteStore

T0 = 1_800_000_000.0
OLD = T0 - 7200  # the servers' processes started two hours ago
STUCK = TargetStatus("stuck", process_start_time=OLD)
IDLE = TargetStatus("idle", process_start_time=OLD)
FLEET = FleetView({"a": STUCK, "b": STUCK, "c": IDLE, "d": IDLE, "e": IDLE})
LEGACY_JOURNAL = REPO / "tests" / "fixtures" / "remediator" / "journal-6e57bc4.sql"


def alert(target: str, fingerprint: str | None = None, starts_at: float = T0 - 600) -> AlertFacts:
    labels = {"target": target, "alertname": "LLMServerStuck", "remediation": "restart"}
    return AlertFacts("firing", labels, fingerprint or f"fp-{target}", starts_at)


class MemoryStore(ReadStepCommit):
    """The store protocol in memory, as the Lease behaves: its last state may be stale, claims
    expire, and `meddle` (another replica) may commit first between a read and a commit."""

    last_is_current = False
    claims_expire = True

    def __init__(self, clock: Clock | None = None) -> None:
        self.state, self.version, self.last = GateState(), 0, GateState()
        self.clock = clock  # the loop's time comes from its store (`now`); set by the fixture when None
        self.health = StoreHealth()
        self.meddle: Any = None  # called before each commit; a commit by it moves the version
        self.crash_after_commit = False
        self.conflicts = 0

    def now(self) -> float:
        assert self.clock is not None
        return self.clock()

    async def read(self) -> tuple[GateState, int]:
        self.last = self.state
        return self.state, self.version

    async def commit(self, version: int, state: GateState) -> bool:
        if self.meddle is not None:
            self.meddle(self)
        if version != self.version:
            self.conflicts += 1
            return False
        self.state, self.version, self.last = state, version + 1, state
        if self.crash_after_commit:
            raise Crash("the process died after its commit")
        return True

    def write(self, state: GateState) -> None:
        """Another replica's commit."""
        self.state, self.version = state, self.version + 1


class Crash(BaseException):
    """The process dies here: nothing after it runs (not even an `except Exception`)."""


class Held:
    """An executor that counts its runs and, while `hold` is clear, blocks like a slow restart."""

    kind = "http"
    timeout = 5.0

    def __init__(self) -> None:
        self.calls = 0
        self.hold = asyncio.Event()
        self.hold.set()
        self.result = ExecResult("ok", "restarted")

    async def restart(self) -> ExecResult:
        self.calls += 1
        await self.hold.wait()
        return self.result


class Fleet:
    def __init__(self, view: FleetView | None = FLEET):
        self.view = view

    async def fleet(self) -> FleetView | None:
        return self.view


class Replica:
    """One remediator process's loop: its own journal, over a store it may share."""

    def __init__(self, loop: GateLoop, journal: Journal, actor: Actor, executor: Held):
        self.loop, self.journal, self.actor, self.executor = loop, journal, actor, executor

    async def decide(self, facts: AlertFacts) -> str:
        return (await self.loop.handle(facts)).reason

    async def rows(self) -> list[tuple[str, str, str | None]]:
        return [(r["target"], r["decision"], r["result"]) for r in reversed(await self.journal.actions(100))]

    async def stop(self) -> None:
        await self.actor.wait_idle()
        await self.journal.close()


@pytest.fixture
async def replicas(tmp_path: Path):
    """`await replica(store, clock, **settings)`: a loop over `store` with its own journal."""
    started: list[Replica] = []

    async def make(store: Any, clock: Clock, fleet: Fleet | None = None, **over: Any) -> Replica:
        if getattr(store, "clock", None) is None:
            store.clock = clock
        targets = {n: {"executor": "http", "url": "http://127.0.0.1:1/restart", "timeout": "5s"} for n in "abcde"}
        settings = make_settings(tmp_path, "http://127.0.0.1:1", targets, **over)
        journal = Journal(tmp_path / f"journal-{len(started)}.db")
        await journal.open(clock())
        policy = policy_from(settings)
        metrics = RemediatorMetrics(settings.targets, journal, lambda: store.last, clock)
        executor = Held()
        executors = dict.fromkeys("abcde", executor)
        identity = f"replica-{len(started)}"
        ledger = Ledger(store, journal, metrics, policy, clock, identity, claim_seconds(0.0, 0.0),
                        {name: e.kind for name, e in executors.items()})
        actor = Actor(settings, executors, None, identity, ledger)
        loop = GateLoop(policy, ledger, fleet or Fleet(), actor)
        started.append(Replica(loop, journal, actor, executor))
        return started[-1]

    yield make
    for replica in started:
        await replica.stop()


# -- the pure step: decision, effects and the state they make ---------------------------------------

POLICY = policy_from(make_settings(Path("/nonexistent"), "http://127.0.0.1:1",
                                   {n: {"executor": "http", "url": "http://127.0.0.1:1/r"} for n in "abcde"}))
INTENT = Intent("replica-0/abc", "a", T0 + 10)
PURE_CASES = [
    # name, state, policy, alert, fleet, reason, what the committed state holds afterwards
    ("allowed: claim, cooldown, budget, key", GateState(), POLICY, alert("a"), FLEET, "allowed",
     {"in_progress": "a", "in_progress_by": "replica-0/abc", "last_restart_started": T0,
      "restart_times": {"a": (T0,)}, "decided_keys": {alert("a").key}}),
    ("last of the budget opens the circuit with the intent",
     GateState(restart_times={"a": (T0 - 900, T0 - 600)}), POLICY, alert("a"), FLEET, "allowed",
     {"open_circuits": {"a"}, "restart_times": {"a": (T0 - 900, T0 - 600, T0)}}),
    ("budget spent: the circuit opens, nothing runs",
     GateState(restart_times={"a": (T0 - 2000, T0 - 1500, T0 - 1000)}), POLICY, alert("a"), FLEET,
     "circuit_open", {"open_circuits": {"a"}, "in_progress": None}),
    ("dry run remembers the alert, claims nothing", GateState(), replace(POLICY, dry_run=True), alert("a"), FLEET,
     "dry_run", {"decided_keys": {alert("a").key}, "in_progress": None, "last_restart_started": None}),
    ("a storm is marked for the storm cooldown", GateState(), replace(POLICY, storm_cooldown=600.0), alert("a"),
     FleetView({**FLEET.targets, "c": STUCK}), "fleet_gate", {"storm_seen_at": T0, "decided_keys": set()}),
    ("another's restart in progress: nothing changes", GateState(in_progress="b", in_progress_expires=T0 + 5),
     POLICY, alert("a"), FLEET, "restart_in_progress", {"in_progress": "b", "decided_keys": set()}),
    ("an expired claim is over: allowed", GateState(in_progress="b", in_progress_expires=T0 - 1), POLICY,
     alert("a"), FLEET, "allowed", {"in_progress": "a", "in_progress_expires": T0 + 10}),
    ("paused: nothing changes", GateState(paused_until=T0 + 60, pause_reason="x"), POLICY, alert("a"), FLEET,
     "paused", {"decided_keys": set(), "paused_until": T0 + 60}),
]


@pytest.mark.parametrize("state, policy, facts, fleet, reason, after", [c[1:] for c in PURE_CASES],
                         ids=[c[0] for c in PURE_CASES])
def test_the_pure_step_decides_and_commits_exactly_its_effects(state, policy, facts, fleet, reason, after):
    decision = decide(facts, fleet, state, policy, T0)
    assert decision.reason == reason
    effects = effects_of(decision, facts, fleet, state, policy, T0)
    new = with_effects(state, effects, facts, T0, INTENT if decision.allowed else None)
    for name, value in after.items():
        assert getattr(new, name) == value, name
    assert (new == state) == (not effects)  # no effects: nothing to commit
    assert from_json(to_json(new)) == pruned(new, T0, POLICY.budget_window)


# -- the loop over the protocol: conflicts ---------------------------------------------------------

def _restart_of_b(store: MemoryStore) -> None:
    claim = Intent("other/1", "b", T0 + 30)
    store.write(with_effects(store.state, Effects(intent=True), alert("b"), T0, claim))


def _pause(store: MemoryStore) -> None:
    store.write(paused_state(store.state, T0 + 600, "upgrade"))


def _same_alert(store: MemoryStore) -> None:
    claim = Intent("other/1", "a", T0 + 30)
    store.write(with_effects(store.state, Effects(intent=True), alert("a"), T0, claim))


def _unrelated(store: MemoryStore) -> None:
    store.write(node_cordoned(store.state, f"n{store.version}"))


CONFLICT_CASES = [
    # name, what the other replica commits first (once), the decision, restarts run here
    ("a change that does not matter: decided again, allowed", _unrelated, "allowed", 1),
    ("another replica's restart: restart_in_progress", _restart_of_b, "restart_in_progress", 0),
    ("a pause: paused", _pause, "paused", 0),
    ("the same alert decided there: duplicate", _same_alert, "duplicate", 0),
]


@pytest.mark.parametrize("meddle, reason, runs", [c[1:] for c in CONFLICT_CASES], ids=[c[0] for c in CONFLICT_CASES])
async def test_a_conflict_reads_again_and_decides_again(replicas, meddle, reason, runs):
    store = MemoryStore()

    def once(s: MemoryStore) -> None:
        s.meddle = None
        meddle(s)

    store.meddle = once
    replica = await replicas(store, Clock(T0))
    assert await replica.decide(alert("a")) == reason
    await replica.actor.wait_idle()
    assert store.conflicts == 1 and replica.executor.calls == runs
    assert store.state.in_progress is None or store.state.in_progress_by.startswith("other/")
    restarts = [row for row in await replica.rows() if row[1] == "restart"]
    assert restarts == ([("a", "restart", "ok")] if runs else [])


async def test_a_state_that_keeps_changing_is_unreachable_and_runs_nothing(replicas):
    store = MemoryStore()
    store.meddle = _unrelated  # every commit loses
    replica = await replicas(store, Clock(T0))
    assert await replica.decide(alert("a")) == "state_unreachable"
    assert store.conflicts == CONFLICT_RETRIES and replica.executor.calls == 0
    [row] = await replica.journal.actions(10)
    assert (row["decision"], row["reason"]) == ("refused", "state_unreachable")
    assert "kept changing" in row["detail"]


# -- the loop: the intent is committed before anything runs --------------------------------------

async def test_the_answer_comes_before_the_restart_and_the_claim_holds_until_it_ends(replicas):
    store, clock = MemoryStore(), Clock(T0)
    replica = await replicas(store, clock, global_cooldown="0s")
    replica.executor.hold.clear()  # the restart blocks
    assert await replica.decide(alert("a")) == "allowed"  # answered while the restart is held
    await asyncio.sleep(0)
    assert replica.executor.calls == 1 and store.state.in_progress == "a"
    assert await replica.rows() == [("a", "restart", "pending")]
    assert await replica.decide(alert("b")) == "restart_in_progress"
    replica.executor.hold.set()
    await replica.actor.wait_idle()
    assert store.state.in_progress is None and store.state.last_restart_started == T0
    assert await replica.rows() == [("a", "restart", "ok"), ("b", "refused", None)]


async def test_a_crash_between_commit_and_act_leaves_an_intent_the_next_process_honours(replicas):
    store, clock = MemoryStore(), Clock(T0)
    first = await replicas(store, clock, global_cooldown="60s")
    store.crash_after_commit = True
    with pytest.raises(Crash):
        await first.decide(alert("a"))
    store.crash_after_commit = False
    assert first.executor.calls == 0 and await first.rows() == []  # died before its journal row
    expires = store.state.in_progress_expires
    # The executor's timeout, and the lock wait, the Events and the margin (acting.claim_seconds).
    assert store.state.in_progress == "a" and expires == T0 + claim_seconds(0.0, 5.0)

    second = await replicas(store, clock, global_cooldown="60s")  # another process, the same state
    assert await second.decide(alert("a")) == "duplicate"
    assert await second.decide(alert("b")) == "restart_in_progress"
    clock.now = expires - 1
    assert await second.decide(alert("b", "fp-b2")) == "restart_in_progress"
    clock.now = expires  # the dead replica's claim is over, but its start still counts
    assert await second.decide(alert("b", "fp-b3")) == "cooldown"
    clock.now = T0 + 61
    assert await second.decide(alert("b", "fp-b4")) == "allowed"
    await second.actor.wait_idle()
    assert (first.executor.calls, second.executor.calls) == (0, 1)


async def test_a_journal_that_cannot_take_the_intent_takes_the_commit_back_and_the_resend_acts(replicas):
    """Before, the claim ended but the alert's key stayed decided: every re-send was `duplicate` for a
    day (Lease) or a month (SQLite), and the hang was never handled."""
    store, clock = MemoryStore(), Clock(T0)
    replica = await replicas(store, clock, global_cooldown="0s")
    journal = replica.journal
    await journal.close()  # the journal's writes fail from now on
    with pytest.raises(Exception):  # noqa: B017 - whatever the journal raises; the service answers 503
        await replica.decide(alert("a"))
    assert replica.executor.calls == 0
    assert store.state.in_progress is None and alert("a").key not in store.state.decided_keys
    assert store.state.restart_times == {}  # nothing ran: nothing is spent
    fresh = Journal(journal.path)
    await fresh.open(clock())
    replica.journal = replica.loop.ledger.journal = fresh
    assert await replica.decide(alert("a")) == "allowed"  # the re-send
    await replica.actor.wait_idle()
    assert replica.executor.calls == 1


# -- the SQLite store -------------------------------------------------------------------------------

async def open_sqlite(path: Path, clock: Clock, budget_window: float = 3600.0) -> tuple[Journal, SqliteStore]:
    journal = Journal(path)
    await journal.open(clock())
    store = SqliteStore(path, budget_window, clock)
    await store.open()
    return journal, store


async def sqlite_replica(tmp_path: Path, replicas: Any, clock: Clock) -> tuple[SqliteStore, Replica]:
    """One replica on its SQLite store (its journal, a second one, is the replica's), no cooldown."""
    journal, store = await open_sqlite(tmp_path / "j.db", clock)
    await journal.close()
    return store, await replicas(store, clock, global_cooldown="0s")


async def test_sqlite_commits_at_its_version_only_and_keeps_the_state_across_a_restart(tmp_path):
    clock = Clock(T0)
    journal, store = await open_sqlite(tmp_path / "j.db", clock)
    state, version = await store.read()
    new = paused_state(state, T0 + 60, "upgrade")
    assert await store.commit(version, new) is True
    assert await store.commit(version, paused_state(state, None, "")) is False  # stale version
    assert store.last == new and (await store.read())[1] == version + 1
    await store.close()
    await journal.close()
    journal, store = await open_sqlite(tmp_path / "j.db", clock)
    assert store.last == new
    await store.close()
    await journal.close()


async def test_sqlite_after_a_crash_mid_restart_the_restart_is_over_and_still_counts(tmp_path, replicas):
    """The process dies after its intent (store and journal): the next one on the same file sees no
    restart running, but the cooldown, the budget and the alert's key hold (its journal row says it began)."""
    clock = Clock(T0)
    journal, store = await open_sqlite(tmp_path / "j.db", clock)
    state, version = await store.read()
    claim = Intent("replica-0/abc", "a", None)
    assert await store.commit(version, with_effects(state, Effects(intent=True), alert("a"), T0, claim))
    await journal.record_intent(T0, alert("a"), "http")
    await store.close()  # ... and no finish: the process is gone
    await journal.close()

    journal, store = await open_sqlite(tmp_path / "j.db", clock)
    assert [(r["decision"], r["result"]) for r in await journal.actions(10)] == [("restart", "interrupted")]
    await journal.close()
    assert store.last.in_progress is None and store.last.restart_times == {"a": (T0,)}
    replica = await replicas(store, clock)
    assert await replica.decide(alert("a")) == "duplicate"
    assert await replica.decide(alert("b")) == "cooldown"
    await store.close()


async def test_sqlite_claims_do_not_expire_while_this_replica_runs_the_restart(tmp_path, replicas):
    clock = Clock(T0)
    store, replica = await sqlite_replica(tmp_path, replicas, clock)
    replica.executor.hold.clear()
    assert await replica.decide(alert("a")) == "allowed"
    assert store.last.in_progress_expires is None
    clock.advance(3600)  # far past any timeout: still this replica's running restart
    assert await replica.decide(alert("b")) == "restart_in_progress"
    replica.executor.hold.set()
    await replica.actor.wait_idle()
    assert store.last.in_progress is None
    await store.close()


async def test_a_journal_written_before_the_store_is_read_once_into_it(tmp_path):
    """The previous version kept no state row: its state is derived from the journal (see the
    fixture's README for how it was written and what that version derived from it)."""
    path = tmp_path / "journal.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(LEGACY_JOURNAL.read_text())
    clock = Clock(T0)
    journal, store = await open_sqlite(path, clock)
    state = store.last
    assert state.decided_keys == {("fp-a", T0 - 3000), ("fp-a", T0 - 2500), ("fp-b0", T0 - 1900),
                                  ("fp-b", T0 - 900), ("fp-d", T0 - 100), ("fp-c", T0 - 50)}
    assert state.last_restart_started == T0 - 30 and state.in_progress is None
    assert state.restart_times == {"b": (T0 - 1800, T0 - 800), "c": (T0 - 30,)}  # a's were forgiven by its reset
    assert state.open_circuits == {"b"} and state.cordoned_nodes == {"node-7"} and state.storm_seen_at == T0 - 850
    assert (state.paused_until, state.pause_reason) == (T0 + 3600, "GPU driver upgrade")
    rows = await journal.actions(100)
    assert len(rows) == 9 and rows[0]["result"] == "interrupted"  # the audit rows are as they were
    await store.close()
    await journal.close()

    # From now on the row is the state: the old tables are not read again.
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE circuits SET open=0")
    journal, store = await open_sqlite(path, clock)
    assert store.last == state
    await store.close()
    await journal.close()


async def test_a_state_row_that_is_not_ours_stops_the_start_with_its_file_named(tmp_path):
    clock = Clock(T0)
    journal, store = await open_sqlite(tmp_path / "j.db", clock)
    await store.close()
    await journal.close()
    with sqlite3.connect(tmp_path / "j.db") as conn:
        conn.execute("UPDATE gate_state SET state='{'")
    journal = Journal(tmp_path / "j.db")
    await journal.open(clock())
    store = SqliteStore(tmp_path / "j.db", 3600.0, clock)
    with pytest.raises(BadState, match=r"j\.db: table gate_state: the shared state is not readable"):
        await store.open()
    await store.close()
    await journal.close()


async def test_following_rereads_the_store_and_outlives_a_failed_read():
    from llm_vitals.remediator.store import StateUnavailable

    reads: list[str] = []

    class Flaky(MemoryStore):
        async def read(self) -> tuple[GateState, int]:
            reads.append("read")
            if len(reads) == 2:
                raise StateUnavailable("the API server is away")
            return await super().read()

    store = Flaky()
    store.write(paused_state(store.state, T0 + 60, "set by another replica"))
    naps = await follow_for(store, 3)
    assert reads == ["read"] * 3 and naps == [15.0] * 3
    assert store.last.pause_reason == "set by another replica"


# -- after the fact: a refusal by the API server, a cordon ------------------------------------------

async def test_a_restart_the_api_server_refused_is_taken_back_and_the_resend_is_judged_afresh(replicas):
    """An eviction a PodDisruptionBudget forbade (429) did nothing: no cooldown, no budget, no key;
    the journal row is the refusal. Alertmanager's re-send of the same alert is decided again."""
    store, clock = MemoryStore(), Clock(T0)
    replica = await replicas(store, clock, global_cooldown="15m")
    replica.executor.result = ExecResult("error", "the eviction of pod llm/p was refused: ...", refused="disruption_budget")
    assert await replica.decide(alert("a")) == "allowed"
    await replica.actor.wait_idle()
    assert replace(store.state, disrupted={}, held={}) == GateState()  # as it was before the decision
    # ... but held (issue 39): the kubelet holds too, and the remediator tries it again itself.
    assert {t: h.reason for t, h in store.state.held.items()} == {"a": "disruption_budget"}
    assert store.state.disrupted == {"a": (T0, T0)}  # and the refusals' streak begins
    [row] = await replica.journal.actions(10)
    assert (row["decision"], row["reason"], row["result"]) == ("refused", "disruption_budget", None)
    metrics = replica.loop.ledger.metrics.registry
    assert metrics.get_sample_value("llm_vitals_remediator_decisions_total",
                                    {"target": "a", "reason": "disruption_budget"}) == 1
    clock.advance(60)  # within the cooldown a real restart would have started
    assert await replica.decide(alert("a")) == "allowed"  # the same alert: not a duplicate, no cooldown
    await replica.actor.wait_idle()
    assert replica.executor.calls == 2 and store.state.disrupted == {"a": (T0, T0 + 60)}  # it keeps on
    assert metrics.get_sample_value("llm_vitals_remediator_disruption_budget_refused_seconds", {"workload": "a"}) == 60
    replica.executor.result = ExecResult("ok", "evicted")  # the budget allows it now: the streak is over
    clock.advance(60)
    assert await replica.decide(alert("a")) == "allowed"
    await replica.actor.wait_idle()
    assert store.state.disrupted == {} and store.state.restart_times == {"a": (T0 + 120,)}


@pytest.mark.parametrize("result, marked", [
    (ExecResult("ok", "cordoned, moved", cordoned="n1"), {"n1"}),
    (ExecResult("error", "cordoned; the eviction was refused", cordoned="n1"), {"n1"}),  # the cordon stands
    (ExecResult("error", "read node n1: HTTP 404; not cordoned, nothing moved"), set()),
    (ExecResult("timeout", "not done within 30s"), set()),
], ids=["moved", "cordoned, pod not moved", "cordon failed", "timed out before the cordon"])
async def test_only_a_cordon_that_succeeded_marks_its_node(replicas, result, marked):
    store, clock = MemoryStore(), Clock(T0)
    replica = await replicas(store, clock)
    replica.executor.result = result
    assert await replica.decide(alert("a")) == "allowed"
    await replica.actor.wait_idle()
    assert store.state.cordoned_nodes == marked


async def test_sqlite_a_claim_whose_release_lost_to_other_commits_ends_at_the_next_decision(tmp_path, replicas):
    """The soak's SQLite seed 2 (issue 39): a restart ended while this process's other tasks kept
    committing (the look's refusals); its release lost every round to them (`Conflicted`), and the
    claim, which never expires on one replica, refused every restart from then on."""
    clock = Clock(T0)
    store, replica = await sqlite_replica(tmp_path, replicas, clock)
    replica.executor.hold.clear()
    assert await replica.decide(alert("a")) == "allowed"

    async def others() -> None:  # commits back to back, as the look's held refusals do
        for n in range(4 * CONFLICT_RETRIES):
            await update(store, lambda state, n=n: replace(state, storm_seen_at=T0 + n))

    replica.executor.hold.set()
    await asyncio.gather(others(), replica.actor.wait_idle())
    assert store.last.in_progress == "a"  # the release lost: the claim outlived its restart
    assert await replica.decide(alert("b")) == "allowed"  # ended by the next decision, never held for ever
    assert store.last.restart_times["a"] == (T0,)  # its budget stays spent
    assert alert("a").key in store.last.decided_keys  # released as its end would have: its re-send a duplicate
    await replica.actor.wait_idle()
    assert store.last.in_progress is None
    await store.close()


async def test_sqlite_a_claim_no_restart_of_this_process_runs_lapses_at_the_next_decision(tmp_path, replicas):
    """A claim left by a path that wrote nothing at its end (a take-back that failed, a task cancelled):
    ended as a lapsed claim is, its alert judged afresh and its budget spent."""
    clock = Clock(T0)
    store, replica = await sqlite_replica(tmp_path, replicas, clock)
    state, version = await store.read()
    claim = Intent("replica-0/gone", "a", None, "a", T0)
    assert await store.commit(version, with_effects(state, Effects(intent=True), alert("a"), T0, claim))
    assert await replica.decide(alert("b")) == "allowed"
    assert alert("a").key not in store.last.decided_keys and store.last.restart_times["a"] == (T0,)
    await replica.actor.wait_idle()
    assert store.last.in_progress is None
    await store.close()
