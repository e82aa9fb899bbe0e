"""The shared state fails closed and travels safely (store/, state_codec.py).

Before: a deleted Lease read as a fresh state (open circuits, spent budgets, the pause, the ladder
and cordoned nodes gone, in silence); an unparseable annotation was only "unreachable"; switching
from SQLite to a Lease migrated nothing; an older replica's write dropped fields it did not know;
replicas with different budget windows pruned each other's restarts; and 5,000 open circuits with
500 cordoned nodes did not fit the Lease's 256 KiB of annotations. The transport is the in-memory
API server of bench/memory_leases.py (resourceVersion preconditions, dated answers).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from test_remediator_helpers import Clock
from test_remediator_lease_store import IDLE, STUCK, MemoryLeases
from test_remediator_loop import T0, Fleet, alert, replicas  # noqa: F401

from llm_vitals.remediator.ledger import update
from llm_vitals.remediator.model import FleetView, GateState
from llm_vitals.remediator.settings import LeaseRef
from llm_vitals.remediator.state import circuits_reset, node_cordoned, paused_state
from llm_vitals.remediator.state_codec import (
    ANNOTATION_BUDGET,
    GZIP_MARK,
    STORE_KEYS,
    Stored,
    TooLarge,
    decode_annotation,
    dump,
    encode_annotation,
    to_json,
)
from llm_vitals.remediator.store import StateLost, StateUnavailable
from llm_vitals.remediator.store.lease import STATE_ANNOTATION, EpochMemory, LeaseStore
from llm_vitals.remediator.store.sqlite import read_local_state

FLEET = Fleet(FleetView({"a": STUCK, "b": STUCK, "c": IDLE, "d": IDLE, "e": IDLE}))
CIRCUIT = GateState(open_circuits=frozenset({"a"}), cordoned_nodes=frozenset({"gpu-7"}), paused_until=None)


def store(leases: MemoryLeases, clock: Clock, memory: Path | None = None, window: float = 3600.0,
          local: GateState | None = None, name: str = "replica-a") -> LeaseStore:
    return LeaseStore(leases, LeaseRef(namespace="llm"), name, window, clock,  # type: ignore[arg-type]
                      EpochMemory(memory), lambda: local)


async def written_lease(memory: Path) -> tuple[MemoryLeases, LeaseStore]:
    """A Lease one replica has written something worth keeping to (node gpu-7 marked): the Lease (its
    `clock` the API server's, at T0) and that replica's store, its epoch kept in `memory`."""
    clock = Clock(T0)
    leases = MemoryLeases(clock)
    written = store(leases, clock, memory)
    await update(written, lambda s: node_cordoned(s, "gpu-7"))
    return leases, written


def annotation(leases: MemoryLeases) -> dict:
    assert leases.lease is not None
    return json.loads(decode_annotation(leases.lease["metadata"]["annotations"][STATE_ANNOTATION]))


async def test_a_deleted_lease_refuses_everything_until_a_human_reinitialises_it(replicas, tmp_path):  # noqa: F811
    clock = Clock(T0)
    leases = MemoryLeases(clock)
    a_store = store(leases, clock, tmp_path / "a.epoch")
    a = await replicas(a_store, clock, FLEET, global_cooldown="0s")
    await update(a_store, lambda s: node_cordoned(s, "gpu-7"))  # something worth keeping
    leases.lease = None  # kubectl delete lease
    assert await a.decide(alert("a")) == "state_lost"  # before: allowed, on an empty state
    assert a.executor.calls == 0 and leases.lease is None and "is gone" in a_store.health.lost
    with pytest.raises(StateLost):
        await update(a_store, lambda s: paused_state(s, T0 + 60, "x"))
    # A restart of the replica remembers (the epoch file beside its journal): still lost.
    again = store(leases, clock, tmp_path / "a.epoch")
    with pytest.raises(StateLost):
        await again.read()
    discarded = await again.reinitialise(GateState(), "alice", "the Lease was deleted by a cleanup", "empty")
    assert discarded == {"lease": "absent"}
    assert annotation(leases)["reinitialised"]["by"] == "alice"
    # The first replica accepts the human's new epoch; its state is what the human chose: empty.
    assert await a.decide(alert("a", "fp-2")) == "allowed"
    assert not a_store.health.lost


async def test_an_unreadable_annotation_is_lost_not_unreachable_and_reinit_says_what_it_held(tmp_path):
    clock = Clock(T0)
    leases = MemoryLeases(clock)
    a = store(leases, clock, tmp_path / "a.epoch")
    await update(a, lambda s: circuits_reset(node_cordoned(s, "gpu-7"), []))
    assert leases.lease is not None
    leases.lease["metadata"]["annotations"][STATE_ANNOTATION] = "{hand edited"
    with pytest.raises(StateLost, match="not readable"):
        await a.read()
    discarded = await a.reinitialise(GateState(), "bob", "hand edit", "empty")
    assert discarded["lease"] == "present, unreadable" and discarded["characters"] == len("{hand edited")


async def test_a_lease_created_again_by_a_fresh_replica_is_lost_to_the_one_that_knew_the_old(tmp_path):
    leases, old = await written_lease(tmp_path / "old.epoch")
    leases.delete(markers=True)  # the namespace recreated: the epoch's marker went with the Lease
    fresh = store(leases, leases.clock, tmp_path / "fresh.epoch", name="replica-b")  # a new pod: no memory
    await update(fresh, lambda s: paused_state(s, T0 + 60, "x"))
    with pytest.raises(StateLost, match="deleted and created again"):
        await old.read()


async def test_a_replica_with_no_memory_does_not_take_a_lost_lease_for_a_first_start(tmp_path):
    """Before, a replica with no epoch file (scaled up, a new volume) treated a deleted Lease as the
    first start of all and started from an empty state: an open circuit forgotten. The epoch's marker
    beside the Lease is the fleet's memory."""
    leases, old = await written_lease(tmp_path / "old.epoch")
    assert leases.others["llm-vitals-remediator-epoch"]["metadata"]["annotations"]["llm-vitals.io/epoch"]
    leases.delete()  # the state's Lease only
    fresh = store(leases, leases.clock, tmp_path / "fresh.epoch", name="replica-b")
    with pytest.raises(StateLost, match="its marker llm-vitals-remediator-epoch says so"):
        await fresh.read()
    with pytest.raises(StateLost):
        await update(fresh, lambda s: paused_state(s, T0 + 60, "x"))
    assert leases.lease is None and fresh.health.lost
    # A human's re-initialisation writes a new epoch into both; the fresh replica follows it.
    await old.reinitialise(GateState(), "carol", "drill", "empty")
    late = store(leases, leases.clock, tmp_path / "late.epoch", name="replica-c")
    assert (await late.read())[0] == GateState()


async def test_what_a_reinitialisation_discards_is_said_and_a_state_lost_is_a_metric(tmp_path):
    clock = Clock(T0)
    leases = MemoryLeases(clock)
    a = store(leases, clock, tmp_path / "a.epoch")
    await update(a, lambda s: paused_state(node_cordoned(s, "gpu-7"), T0 + 600, "upgrade"))
    assert leases.lease is not None
    doc = annotation(leases)
    leases.lease["metadata"]["annotations"][STATE_ANNOTATION] = json.dumps({**doc, "epoch": "someone-else"})
    with pytest.raises(StateLost):
        await a.read()
    assert a.health.lost and not a.health.up
    discarded = await a.reinitialise(GateState(), "carol", "drill", "empty")
    assert discarded["cordoned_nodes"] == ["gpu-7"] and discarded["pause_reason"] == "upgrade"
    assert discarded["epoch"] == "someone-else"
    assert not a.health.lost and a.health.up


def test_the_first_lease_starts_from_this_replicas_own_sqlite_state(tmp_path):
    """Switching from one replica (SQLite) to replicas (a Lease) keeps the open circuit and the node."""
    db = tmp_path / "journal.db"
    conn = sqlite3.connect(db)
    conn.executescript("CREATE TABLE gate_state (id INTEGER PRIMARY KEY, version INTEGER, state TEXT);")
    conn.execute("INSERT INTO gate_state VALUES (1, 3, ?)", (to_json(CIRCUIT),))
    conn.commit()
    conn.close()
    assert read_local_state(db) == CIRCUIT
    assert read_local_state(tmp_path / "none.db") is None


async def test_a_first_lease_imports_the_local_state_and_the_circuit_stays_open(replicas, tmp_path):  # noqa: F811
    clock = Clock(T0)
    leases = MemoryLeases(clock)
    a_store = store(leases, clock, tmp_path / "a.epoch", local=CIRCUIT)
    a = await replicas(a_store, clock, FLEET, global_cooldown="0s")
    assert await a.decide(alert("a")) == "circuit_open"  # before: allowed (the circuit was forgotten)
    assert await a.decide(alert("b")) == "allowed"
    assert annotation(leases)["open_circuits"] == ["a"] and annotation(leases)["gpu_nodes"] == ["gpu-7"]


async def test_an_older_replicas_write_keeps_the_fields_a_newer_one_wrote(tmp_path):
    leases, a = await written_lease(tmp_path / "a.epoch")
    assert leases.lease is not None
    newer = {**annotation(leases), "pages_held": {"Deployment/llm/vllm": [T0, "oncall"]}, "cordons": ["gpu-9"]}
    leases.lease["metadata"]["annotations"][STATE_ANNOTATION] = json.dumps(newer)
    await update(a, lambda s: paused_state(s, T0 + 60, "x"))  # this version knows neither field
    kept = annotation(leases)
    assert kept["pages_held"] == {"Deployment/llm/vllm": [T0, "oncall"]} and kept["cordons"] == ["gpu-9"]
    assert kept["pause_reason"] == "x"


async def test_a_replica_with_a_shorter_window_keeps_the_restarts_a_longer_one_counts(tmp_path):
    clock = Clock(T0)
    leases = MemoryLeases(clock)
    long = store(leases, clock, tmp_path / "long.epoch", window=7200.0)
    short = store(leases, clock, tmp_path / "short.epoch", window=3600.0, name="replica-b")
    await update(long, lambda s: GateState(restart_times={"w": (T0 - 5400,)}))
    assert annotation(leases)["budget_window"] == 7200.0
    await update(short, lambda s: paused_state(s, T0 + 60, "x"))
    assert annotation(leases)["restart_times"] == {"w": [T0 - 5400]}  # before: pruned by the 1 h window


def big_state() -> GateState:
    workloads = [f"Deployment/team-{i % 50:02d}/llama-3-70b-instruct-{i:04d}" for i in range(5000)]
    nodes = [f"gpu-node-{i:03d}.us-east-1.compute.internal" for i in range(500)]
    keys = {(f"{i:016x}", T0 - i): T0 - i for i in range(200)}
    return GateState(open_circuits=frozenset(workloads), cordoned_nodes=frozenset(nodes),
                        restart_times={w: (T0 - 100.5,) for w in workloads[:8]},
                        ladder={w: ("restart", T0 - 50.5) for w in workloads[:96]},
                        decided_at=keys, decided_keys=frozenset(keys))


async def test_5000_open_circuits_and_500_cordoned_nodes_fit_the_lease(tmp_path, capsys):
    """The size budget, measured: the JSON would not fit 256 KiB; the annotation holds it gzipped."""
    clock = Clock(T0)
    leases = MemoryLeases(clock)
    a = store(leases, clock, tmp_path / "a.epoch")
    state = big_state()
    await update(a, lambda s: state)
    assert leases.lease is not None
    written = leases.lease["metadata"]["annotations"][STATE_ANNOTATION]
    plain = len(dump(Stored(state)).encode())
    with capsys.disabled():
        print(f"\nshared state, 5,000 open circuits and 500 nodes: {plain} bytes of JSON, {len(written)} bytes written")
    assert plain > 256 * 1024 > ANNOTATION_BUDGET > 4 * len(written)
    assert written.startswith(GZIP_MARK)
    read, _ = await store(leases, clock, tmp_path / "a.epoch").read()
    assert read.open_circuits == state.open_circuits and read.cordoned_nodes == state.cordoned_nodes
    # A small state stays plain JSON: `kubectl get lease -o yaml` shows it.
    assert encode_annotation(to_json(GateState())) == to_json(GateState())


def test_a_state_too_large_even_gzipped_is_refused_before_the_write():
    import os

    noise = os.urandom(300 * 1024).hex()
    with pytest.raises(TooLarge):
        encode_annotation(json.dumps({"x": noise}))


async def test_the_api_server_away_is_unreachable_not_lost(tmp_path):
    leases, a = await written_lease(tmp_path / "a.epoch")
    leases.down = True
    with pytest.raises(StateUnavailable) as caught:
        await a.read()
    assert not isinstance(caught.value, StateLost) and not a.health.lost


async def test_one_replicas_sqlite_row_keeps_the_fields_a_newer_version_wrote(tmp_path):
    """A downgrade, then the upgrade again: the newer version's fields are still in the row."""
    from llm_vitals.remediator.store.sqlite import SqliteStore

    db = tmp_path / "journal.db"
    newer = {**json.loads(to_json(CIRCUIT)), "pages_held": {"Deployment/llm/vllm": [T0, "oncall"]}}
    conn = sqlite3.connect(db)
    conn.executescript("CREATE TABLE gate_state (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL,"
                       " state TEXT NOT NULL);")
    conn.execute("INSERT INTO gate_state VALUES (1, 4, ?)", (json.dumps(newer),))
    conn.commit()
    conn.close()
    older = SqliteStore(db, 3600.0, Clock(T0))
    await older.open()
    try:
        await update(older, lambda s: paused_state(s, T0 + 60, "x"))
    finally:
        await older.close()
    conn = sqlite3.connect(db)
    (text,) = conn.execute("SELECT state FROM gate_state").fetchone()
    conn.close()
    kept = json.loads(text)
    assert kept["pages_held"] == {"Deployment/llm/vllm": [T0, "oncall"]} and kept["pause_reason"] == "x"
    assert kept["open_circuits"] == ["a"]


async def test_an_older_versions_write_during_a_rolling_upgrade_is_not_a_loss(tmp_path):
    """The version before this one drops the fields it does not know, the epoch among them."""
    leases, new = await written_lease(tmp_path / "new.epoch")
    assert leases.lease is not None
    older = {k: v for k, v in annotation(leases).items() if k not in STORE_KEYS}
    leases.lease["metadata"]["annotations"][STATE_ANNOTATION] = json.dumps(older)
    state, _ = await new.read()
    assert state.cordoned_nodes == frozenset({"gpu-7"}) and not new.health.lost


async def test_reinit_from_a_lease_replicas_journal_keys_by_workload_and_keeps_circuits(tmp_path):
    """A replica on a Lease keeps no state row, only its journal's rows. Before, re-initialising from it
    keyed the budgets by pod name (each restart of a Deployment a new pod) and dropped every open
    circuit: the next hang of a circuit-open Deployment was allowed."""
    from llm_vitals.remediator.journal import Journal

    path = tmp_path / "journal.db"
    journal = Journal(path)
    await journal.open(T0)
    vllm, other = "Deployment/llm/vllm", "StatefulSet/llm/other"
    for i, pod in enumerate(["vllm-7d9f-aaaaa", "vllm-7d9f-bbbbb", "vllm-7d9f-ccccc"]):
        row = await journal.record_intent(T0 + 600 * i, alert(pod, f"fp-{i}"), "kubernetes_pod", workload=vllm)
        await journal.finish(row, "ok", "evicted", 1.0)
    journal.record_decision(T0 + 2000, alert("vllm-7d9f-ddddd", "fp-9"), "refused", "circuit_open", workload=vllm)
    row = await journal.record_intent(T0 + 100, alert("other-0", "fp-o"), "kubernetes_pod", workload=other)
    await journal.finish(row, "ok", "evicted", 1.0)
    await journal.record_circuit_reset([other], T0 + 200)
    await journal.drain()
    await journal.close()

    found = read_local_state(path, 3, 3600.0)
    assert found is not None
    assert found.open_circuits == {vllm}
    assert found.restart_times == {vllm: (T0, T0 + 600, T0 + 1200)}  # by workload; the reset forgave `other`
    # Three restarts within the hour spent the budget even without the refusal row.
    assert read_local_state(path, 3, 3600.0) == found
    clock = Clock(T0 + 2100)
    leases = MemoryLeases(clock)
    a = store(leases, clock, tmp_path / "a.epoch")
    await a.reinitialise(found, "dana", "from the journal", "journal")
    assert (await a.read())[0].open_circuits == {vllm}


def test_a_budget_spent_within_a_window_is_an_open_circuit_past_the_window():
    from llm_vitals.remediator.store.sqlite import spent

    assert spent([0.0, 600.0, 1200.0], 3, 3600.0)
    assert not spent([0.0, 3000.0, 6000.0], 3, 3600.0)
    assert not spent([0.0, 600.0], 3, 3600.0)


async def test_a_first_commit_landing_between_the_marker_and_the_lease_reads_is_no_loss(tmp_path):
    """Two replicas with no memory start at once: B's first commit (the Lease, then its marker) lands
    while A reads. A reads the marker before the Lease, so it sees either neither or the Lease; read the
    other way round, it saw no Lease, then B's marker, and refused every alert as `state_lost`."""
    clock = Clock(T0)
    leases = MemoryLeases(clock)
    a, b = store(leases, clock, tmp_path / "a.epoch"), store(leases, clock, tmp_path / "b.epoch", name="replica-b")
    real_get = leases.get_lease
    reads = 0

    async def a_reads(namespace: str, name: str):
        nonlocal reads
        reads += 1
        if reads == 2:  # between A's two reads: B's first commit, Lease and marker
            leases.get_lease = real_get
            await update(b, lambda s: node_cordoned(s, "gpu-7"))
            leases.get_lease = a_reads
        return await real_get(namespace, name)

    leases.get_lease = a_reads  # type: ignore[method-assign]
    state, _ = await a.read()
    assert reads == 2 and state.cordoned_nodes == frozenset({"gpu-7"}) and not a.health.lost
