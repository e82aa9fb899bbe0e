"""The fleet soak (issue 30): days of a simulated fleet, time-compressed, through the remediator's real
gate, stores and journal, with the issue's invariants checked after every step.

A seeded schedule of incidents (bench/fleet_sim.py: one hang, a workload hanging again and again on
different nodes, a node whose pods keep hanging with no fault flagged, a GPU fault, a software hang
across replicas, rollouts mid-incident, replica crashes, a lost Lease, a newer replica's field, a
stale write) plays on a virtual clock over Deployments, StatefulSets and LeaderWorkerSet groups on
many nodes. Each step (one minute): incidents due happen, Prometheus evaluates LLMServerStuck
(`for: 1m`), both Alertmanagers of an HA pair send what is due (firing, re-sent every 15 minutes,
resolved), and each copy goes to a remediator replica through the service's own entry
(`Remediator.handle_payload`, the webhook handler's call). The humans then act (release a page, reset a circuit, repair a node,
re-initialise a lost state) and the invariants (bench/soak_invariants.py) judge what happened.

Real parts: `Remediator` (the service) with its `GateLoop`, the pure gate, `Actor`, `Ledger`, the
SQLite `Journal` of each replica, and the gate's store: the replicas' `LeaseStore` over an in-memory
API server's Lease (resourceVersion preconditions, dated answers), or the one replica's
`SqliteStore` in its journal's file. Swapped at the edges: the exporter's answer comes from the
simulated fleet as its last poll saw it (`SimExporter`, the loop's `FleetSource`), the API server's
reading of a pod from the fleet as it is now (`SimIdentities`, the loop's `IdentitySource`: a pod a
rollout replaced after the poll is refused `identity_mismatch`), and the executors act on it
(`SimActor` hands out `SimExecutor`s, the in-memory fakes behind the `Executor` protocol). A human's
re-initialisation of a lost Lease is the service's own (`Remediator.reinitialise`, behind
`POST /api/v1/state/reinit`, from empty).

    .venv/bin/python bench/soak.py [--days 30] [--workloads 200] [--seed 1] [--store lease|sqlite] [--json]

Exit status 1 when any invariant was violated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import resource
import sys
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, cast

REPO = Path(__file__).resolve().parent.parent
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import fleet_sim  # noqa: E402, F401 -- the tests reach the soak's own helper modules through it
import httpx  # noqa: E402
import soak_invariants  # noqa: E402, F401
from fleet_sim import Fleet, FleetConfig, Incident, schedule  # noqa: E402
from memory_leases import MemoryLeases  # noqa: E402
from soak_backstop import KubeletBackstop  # noqa: E402
from soak_invariants import (  # noqa: E402
    INVARIANTS,
    MAX_CORDONED_NODES,
    Action,
    Check,
    History,
    HumanAct,
    Marks,
    Seen,
    StoredState,
    unsettled,
)

from llm_vitals.remediator import identity  # noqa: E402
from llm_vitals.remediator.acting import Actor  # noqa: E402
from llm_vitals.remediator.executors import ExecResult  # noqa: E402
from llm_vitals.remediator.gate import Decision  # noqa: E402
from llm_vitals.remediator.journal import Journal  # noqa: E402
from llm_vitals.remediator.model import AlertFacts, FleetView, GateState, TargetStatus  # noqa: E402
from llm_vitals.remediator.payload import WebhookPayload  # noqa: E402
from llm_vitals.remediator.service import Remediator  # noqa: E402
from llm_vitals.remediator.settings import LeaseRef, Settings, build_settings  # noqa: E402
from llm_vitals.remediator.state_codec import BadState, from_json, to_json  # noqa: E402
from llm_vitals.remediator.store import GateStore, StateUnavailable  # noqa: E402
from llm_vitals.remediator.store.lease import LeaseStore  # noqa: E402
from llm_vitals.remediator.store.sqlite import SqliteStore  # noqa: E402

T0 = 1_800_000_000.0
STEP = 60.0  # one rule evaluation, one exporter poll that matters
REPLICAS = ("replica-a", "replica-b")

# The remediator's config in the soak: production-like, the ladder and GPU moves on.
SETTINGS: dict[str, Any] = {
    "listen": "127.0.0.1:0",
    "exporter_url": "http://127.0.0.1:9",  # never read: the loop's exporter is the simulated fleet
    "auth": {"none": True},
    "global_cooldown": "15m",  # as deploy/kubernetes/base/remediator.yaml ships it
    "budget": {"max_restarts": 3, "window": "1h"},
    "max_unhealthy": "40%",
    "storm_cooldown": "10m",
    "gpu_fault_action": "cordon_and_move",
    "escalate_within": "1h",
    "target_templates": [{"match": {"namespace": "llm"}, "executor": "kubernetes", "timeout": "30s"}],
    "max_cordoned_nodes": MAX_CORDONED_NODES,
}



# ---------------------------------------------------------------------------------------------
# The edges: the API server's Lease, the exporter, the executors
# ---------------------------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


class SimExporter:
    """The exporter's answer (`loop.FleetSource`), from the simulated fleet as it is now."""

    def __init__(self, soak: Soak):
        self.soak = soak

    async def fleet(self) -> FleetView | None:
        return self.soak.view()


class SimIdentities:
    """The identity check's edge (`loop.IdentitySource`, as `pods.IdentityReader` is): the pod by namespace
    and name, and its ReplicaSet, as the simulated API server holds them now, judged by the remediator's
    own rule (`identity.verified`). A pod a rollout replaced after the exporter's poll is not there by
    that UID (a StatefulSet's: the same name, a new UID) or by that name (a Deployment's)."""

    def __init__(self, soak: Soak):
        self.soak = soak

    async def check(self, status: TargetStatus) -> identity.Checked:
        if not status.namespace or not status.pod:
            return identity.Checked(None, Decision(False, "identity_mismatch", "the exporter names part of a pod"))
        pod, owner = self.soak.fleet.api_pod(status.namespace, status.pod)
        return identity.verified(status, pod, owner)


class SimExecutor:
    """An in-memory executor (the `Executor` protocol): acts on the simulated fleet and records what it was handed."""

    timeout = 30.0

    def __init__(self, soak: Soak, kind: str, facts: AlertFacts, status: TargetStatus | None, replica: str):
        self.soak, self.kind, self.facts, self.status, self.replica = soak, kind, facts, status, replica

    async def restart(self) -> ExecResult:
        soak, status = self.soak, self.status
        now = soak.clock()
        uid, node = (status.pod_uid, status.node) if status is not None else (None, None)
        at_fault = soak.fleet.node_at_fault(uid)
        found = soak.fleet.find(uid)
        matched = found is not None and status is not None and found[1].name == status.pod
        cordoned = None
        if self.kind == "cordon_and_move" and node is not None:
            done = soak.fleet.cordon_and_move(uid, node, now)
            cordoned = node
        else:
            done = soak.fleet.restart(uid, now) is not None
        soak.record_action(self.kind, self.facts, status, self.replica, done, at_fault, matched)
        if not done:
            return ExecResult("error", f"pod {uid} is gone already; nothing done", cordoned=cordoned)
        return ExecResult("ok", f"{self.kind} of {self.facts.target}", cordoned=cordoned)


class SimActor(Actor):
    """The real Actor (the restart lock, its ends through the ledger: releases, marking a cordoned node), handing
    out in-memory executors: the choice mirrors `Actor.executor_for` (a move for `cordon_and_move`, the
    whole group for a LeaderWorkerSet pod, else the pod), from the gate's decision."""

    soak: Soak

    def executor_for(self, facts: AlertFacts, decision: Decision, status: TargetStatus | None) -> SimExecutor:
        kind = ("cordon_and_move" if decision.reason == "cordon_and_move"
                else "group_restart" if status is not None and status.group is not None else "restart")
        return SimExecutor(self.soak, kind, facts, status, self.identity)


# ---------------------------------------------------------------------------------------------
# Replicas and the people around them
# ---------------------------------------------------------------------------------------------


class Replica:
    """One remediator process: the service with its own journal, over the shared store (or its own file)."""

    def __init__(self, soak: Soak, identity: str):
        self.soak, self.identity = soak, identity
        self.journal: Journal | None = None
        self.store: GateStore[Any] | None = None
        self.service: Remediator | None = None

    async def start(self) -> None:
        soak = self.soak
        path = soak.directory / f"journal-{self.identity}.db"
        settings = soak.settings.model_copy(update={"state_path": path})
        self.journal = Journal(path)
        await self.journal.open(soak.clock())
        if soak.leases is not None:
            self.store = LeaseStore(soak.leases, LeaseRef(namespace="llm"), self.identity,  # the transport's shape
                                    settings.budget.window, soak.clock)
        else:
            store = SqliteStore(path, settings.budget.window, soak.clock)
            await store.open()
            self.store = store
        service = Remediator(settings, self.journal, self.store, cast(httpx.AsyncClient, None), soak.clock, {}, None)
        actor = SimActor(settings, {}, None, self.identity, service.ledger)
        actor.soak = soak
        service.actor = service.loop.actor = actor
        service.loop.exporter = SimExporter(soak)
        service.loop.identities = SimIdentities(soak)
        self.service = service

    async def stop(self) -> None:
        """A crash between two steps: what was committed stays, the process's memory goes."""
        assert self.service is not None and self.journal is not None
        await self.service.shutdown()
        await self.journal.close()
        if isinstance(self.store, SqliteStore):
            await self.store.close()
        self.service = self.journal = self.store = None


class Operator:
    """What a human does through the remediator's API: the routes' service calls. The merge's seams."""

    def __init__(self, soak: Soak):
        self.soak = soak

    def _service(self) -> Remediator:
        service = self.soak.replicas[0].service
        assert service is not None
        return service

    async def release_page(self, workload: str) -> list[str]:
        """End the workload's page; returns what the human's call did (the History's words for it)."""
        # POST /api/v1/workloads/release: the page ends, the ladder starts again.
        await self._service().release_workload(workload)
        return ["release_page"]

    async def reset_circuit(self, workload: str) -> None:
        await self._service().reset_circuits([workload])

    async def release_node(self, node: str) -> None:
        await self._service().release_node(node)

    async def pause(self, until: float | None, reason: str) -> None:
        """POST /api/v1/pause (until a time) or DELETE /api/v1/pause (None): the service call behind it."""
        await self._service().set_pause(until, reason)

    async def reinitialise(self) -> None:
        """POST /api/v1/state/reinit from empty: the service call behind it (replicas on a Lease only)."""
        service = self._service()
        if isinstance(service.store, LeaseStore):
            await service.reinitialise("empty", "the shared state was lost; the soak's human starts it afresh", "soak")


class SoakActor(Protocol):
    """Something besides the remediator that acts on the fleet each step (the humans; later the kubelet's
    liveness backstop, issue 33)."""

    async def step(self, soak: Soak, now: float) -> None: ...


class ReplicaTasks:
    """What each replica does by itself between webhooks, once a step (a minute, longer than either's
    interval): its follower re-reads the Lease (follow.py, every `lease.duration`), and its look
    (redecide.py, every holds.REDECIDE_INTERVAL) counts the restarts it did not make and decides again
    the targets it held whose hold has ended."""

    async def step(self, soak: Soak, now: float) -> None:
        for replica in soak.replicas:
            service = replica.service
            if service is None:
                continue
            if not service.store.last_is_current:
                try:
                    await service.store.read()
                except StateUnavailable:
                    pass  # counted by the store; the follower reads again at its next interval
            for decision in await service.loop.redecide():
                soak.tallies[f"redecided {decision.reason}"] += 1
            await service.wait_idle()


class Humans:
    """The people on call: each page, open circuit, faulty or cordoned node and lost state gets its
    human, after a seeded delay (a night, a weekend: up to a day and more)."""

    def __init__(self, seed: int):
        self.rng = random.Random(f"humans-{seed}")
        self.due: dict[tuple[str, str], float] = {}  # (what, subject) -> when the human acts
        self.next_pause: float | None = None  # a maintenance window: paused, then lifted by hand

    def _plan(self, key: tuple[str, str], now: float, low: float, high: float) -> None:
        if key not in self.due:
            self.due[key] = now + self.rng.uniform(low, high)

    async def step(self, soak: Soak, now: float) -> None:
        h = soak.history
        for workload, spans in h.pages.items():
            if spans[-1].end is None:
                self._plan(("release_page", workload), now, 3600.0, 30 * 3600.0)
        for kind, subject in list(h.held):
            if kind == "circuit":
                self._plan(("reset_circuit", subject), now, 3600.0, 12 * 3600.0)
        for name, node in soak.fleet.nodes.items():
            if node.gpu_fault_since is not None:
                self._plan(("repair", name), now, 2 * 3600.0, 36 * 3600.0)
            elif node.cordoned_by_vitals:
                self._plan(("repair", name), now, 3600.0, 12 * 3600.0)
        if h.lost and h.lost[-1].end is None:
            self._plan(("reinitialise", ""), now, 1800.0, 2 * 3600.0)
        # Now and then (every 1 to 4 days) a human pauses the remediator for a maintenance of up to two
        # hours and lifts the pause by hand, often before it ends: held hangs are decided again then.
        if self.next_pause is None:
            self.next_pause = now + self.rng.uniform(0.5, 2.0) * 86400.0
        if now >= self.next_pause:
            self.next_pause = now + self.rng.uniform(1.0, 4.0) * 86400.0
            length = self.rng.uniform(1800.0, 7200.0)
            self.due[("pause", str(int(now + length)))] = now
            self.due[("unpause", "")] = now + self.rng.uniform(600.0, length)
        for key, at in sorted(self.due.items(), key=lambda kv: (kv[1], kv[0])):
            if at <= now and await self._act(soak, key, now):
                del self.due[key]

    async def _act(self, soak: Soak, key: tuple[str, str], now: float) -> bool:
        what, subject = key
        done = [what]
        try:
            if what == "release_page":
                done = await soak.operator.release_page(subject)
            elif what == "reset_circuit":
                await soak.operator.reset_circuit(subject)
            elif what == "repair":
                soak.fleet.repair(subject, now)
                soak.history.record_evidence(subject, False, now)
                await soak.operator.release_node(subject)
                done = ["release_node"]
            elif what == "reinitialise":
                await soak.operator.reinitialise()
            elif what == "pause":
                await soak.operator.pause(float(subject), "maintenance (the soak's human)")
            elif what == "unpause":
                await soak.operator.pause(None, "")
        except StateUnavailable:
            return False  # the state cannot be written now: the human tries again at the next step
        for act in done:
            soak.history.record_human(HumanAct(soak.history.next_seq(), now, act, subject))
            soak.tallies[f"human {act}"] += 1
        return True


# ---------------------------------------------------------------------------------------------
# The soak
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoakConfig:
    fleet: FleetConfig = field(default_factory=FleetConfig)
    store: str = "lease"  # lease (two replicas share a Lease) | sqlite (one replica, its file)
    settings: dict[str, Any] = field(default_factory=dict)  # overrides of SETTINGS
    kubelet: bool = True  # the kubelet's liveness backstop acts beside the remediator (soak_backstop.py)


@dataclass
class Report:
    """Each invariant's count of violations (each counted once), a few of them described, and the run's figures."""

    config: SoakConfig
    violations: dict[str, int]
    examples: dict[str, list[str]]
    figures: dict[str, Any]

    def ok(self) -> bool:
        return not any(self.violations.values())


def held_pages(state: GateState) -> frozenset[str]:
    """The workloads the stored state holds a page for: its `pages`, or a ladder whose last step is
    `page` (an older state's page)."""
    return frozenset(state.pages) | {w for w, (step, _) in state.ladder.items() if step == "page"}


def stored(state: GateState, fields: frozenset[str]) -> StoredState:
    # The budget counts the remediator's own restarts and those it saw others make (the kubelet's).
    budget = {w: (*state.restart_times.get(w, ()), *state.outside_restarts.get(w, ()))
              for w in set(state.restart_times) | set(state.outside_restarts)}
    return StoredState(held_pages(state), frozenset(state.open_circuits), frozenset(state.cordoned_nodes), fields,
                       budget, frozenset(state.backoff_refused))


class Soak:
    """One soak: the fleet, the replicas, the people, the schedule, and the invariants' running counts."""

    def __init__(self, config: SoakConfig, directory: Path):
        self.config = config
        self.directory = directory
        self.clock = Clock(T0)
        self.settings: Settings = build_settings({**SETTINGS, **config.settings,
                                                  "state_path": str(directory / "x.db")}, {})
        self.fleet = Fleet(config.fleet, T0)
        self.leases = MemoryLeases(self.clock) if config.store == "lease" else None
        self.replicas = [Replica(self, name) for name in (REPLICAS if self.leases is not None else REPLICAS[:1])]
        self.rng = random.Random(f"deliveries-{config.fleet.seed}")
        self.history = History(self.settings.budget.window, self.settings.budget.max_restarts,
                               backoff_base=float(self.settings.budget.backoff.initial))
        self.operator = Operator(self)
        # Who else acts each step, after the webhooks: each replica's own tasks (its follower, its look at
        # held targets), the kubelet's liveness backstop, and the people.
        self.actors: list[SoakActor] = [ReplicaTasks()]
        if config.kubelet:
            self.actors.append(KubeletBackstop())
        self.actors.append(Humans(config.fleet.seed))
        self.incidents = deque(schedule(config.fleet, T0, sorted(self.fleet.nodes), sorted(self.fleet.workloads),
                                        self.leases is not None))
        self.counts: dict[str, int] = {name: 0 for name in INVARIANTS}
        self.seen: dict[str, set[Any]] = {name: set() for name in INVARIANTS}
        self.examples: dict[str, list[str]] = {name: [] for name in INVARIANTS}
        self.marks = Marks()
        self.hangs: list[Any] = []  # the hangs not settled yet (soak_invariants.hang_outcome)
        self.tallies: Counter[str] = Counter()
        self.polled: FleetView = self.fleet.view(T0)
        self._state: tuple[Any, StoredState | None] | None = None
        self._orphans: set[str] = set()

    # -- what the remediator sees and does --------------------------------------------------------

    def view(self) -> FleetView:
        """The exporter's answer: its last poll."""
        return self.polled

    def record_action(self, kind: str, facts: AlertFacts, status: TargetStatus | None, replica: str, done: bool,
                      node_at_fault: bool, pod_matched: bool = True) -> None:
        cordoned = sum(1 for n in self.fleet.nodes.values() if n.cordoned_by_vitals)
        workload = (status.workload if status is not None else None) or facts.labels.get("workload", facts.target or "")
        self.history.record_action(Action(self.history.next_seq(), self.clock(), kind, workload, facts.target or "",
                                          status.node if status is not None else None, replica, done, cordoned,
                                          node_at_fault, pod_matched))
        self.tallies[f"action {kind}"] += 1

    # -- the run ----------------------------------------------------------------------------------

    async def run(self) -> Report:
        started, cpu = time.monotonic(), time.process_time()
        for replica in self.replicas:
            await replica.start()
        end = T0 + self.config.fleet.days * 86400.0
        try:
            while self.clock.now < end:
                await self.step()
        finally:
            for replica in self.replicas:
                if replica.service is not None:
                    await replica.stop()
        figures = {
            "simulated_days": self.config.fleet.days, "workloads": len(self.fleet.workloads),
            "targets": sum(len(w.pods) for w in self.fleet.workloads.values()), "nodes": len(self.fleet.nodes),
            "store": self.config.store, "replicas": len(self.replicas), "steps": int((end - T0) / STEP),
            "hang_episodes": len(self.fleet.episodes), "rollouts_mid_incident": self.fleet.rollouts_mid_incident,
            "wall_seconds": round(time.monotonic() - started, 1),
            "cpu_seconds": round(time.process_time() - cpu, 1),
            "lease_conflicts": self.leases.conflicts if self.leases is not None else 0,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            **dict(sorted(self.tallies.items())),
        }
        return Report(self.config, dict(self.counts), self.examples, figures)

    async def step(self) -> None:
        self.clock.now += STEP
        now = self.clock.now
        while self.incidents and self.incidents[0].at <= now:
            await self.incident(self.incidents.popleft(), now)
        stuck = self.fleet.tick(now)
        self.polled = self.fleet.view(now)  # the exporter's poll: what it answers the remediator until the next
        payloads = self.fleet.notifications(stuck, now)
        # Rollouts land between the poll (and Prometheus's evaluation) and the delivery: the API server
        # holds the new pods, the exporter still names the old ones.
        self.fleet.land_rollouts(now)
        for payload in payloads:
            await self.deliver(payload)
        for actor in self.actors:
            await actor.step(self, now)
        self.count_orphans()
        self.check(now)

    def count_orphans(self) -> None:
        """Count one replica's claims that outlived their restart (every restart is over by a step's
        end): a release never written, ended by the replica's next decision (ledger.Ledger._orphan_ended)."""
        for replica in self.replicas:
            holder = replica.store.last.in_progress_by if replica.store is not None else None
            if holder is not None and not replica.store.claims_expire and holder not in self._orphans:
                self._orphans.add(holder)
                self.tallies["claims outliving their restart"] += 1

    async def incident(self, incident: Incident, now: float) -> None:
        self.tallies[f"incident {incident.kind}"] += 1
        if incident.kind == "replica_crash":
            replica = self.rng.choice(self.replicas)
            await replica.stop()
            await replica.start()
            return
        if incident.kind == "lost_lease":
            assert self.leases is not None
            self.leases.delete()
            self.history.record_loss(now)
            return
        if incident.kind == "stale_write":
            assert self.leases is not None
            self.leases.meddle = True
            return
        if incident.kind == "newer_field":
            assert self.leases is not None
            name = f"x_newer_{int(now)}"
            if self.leases.write_field(name, {"written_by": "a newer replica"}):
                self.history.record_field(name)
            return
        faulty = {n for n, v in self.fleet.nodes.items() if v.gpu_fault_since is not None}
        self.fleet.apply(incident, now)
        for name, node in self.fleet.nodes.items():
            if node.gpu_fault_since is not None and name not in faulty:
                self.history.record_evidence(name, True, now)

    async def deliver(self, payload: dict[str, Any]) -> None:
        """One Alertmanager's copy of a notification, to whichever replica the Service picks."""
        replica = self.rng.choice(self.replicas)
        assert replica.service is not None
        outcome = await replica.service.handle_payload(WebhookPayload.model_validate(payload))
        await replica.service.wait_idle()
        self.tallies[f"webhook {outcome.status}"] += 1
        alert = payload["alerts"][0]
        for entry in outcome.decisions:
            self.tallies[f"decision {entry['reason']}"] += 1
            self.history.record_decision(Seen(self.history.next_seq(), self.clock(), alert["labels"]["target"],
                                              alert["labels"].get("workload"), entry["reason"], replica.identity))
            if entry["reason"] == "backoff":
                # Told only where the state the remediator's gauge reads holds the refusal.
                state = self.stored_state()
                if state is not None and alert["labels"].get("workload") in state.held_back:
                    self.history.record_told(alert["labels"]["target"], self.clock())
                    self.tallies["told backoff"] += 1

    # -- the invariants ---------------------------------------------------------------------------

    def stored_state(self) -> StoredState | None:
        """The shared state as stored now (None: gone or unreadable); re-read only when it changed."""
        if self.leases is not None:
            text = self.leases.state_text()
            if self._state is None or self._state[0] != text:
                if text is None:
                    view = None
                else:
                    try:
                        view = stored(from_json(text), frozenset(json.loads(text)))
                    except (BadState, ValueError):
                        view = None
                self._state = (text, view)
            return self._state[1]
        store = self.replicas[0].store
        if store is None:
            return None
        if self._state is None or self._state[0] is not store.last:
            self._state = (store.last, stored(store.last, frozenset(json.loads(to_json(store.last)))))
        return self._state[1]

    def check(self, now: float) -> None:
        state = self.stored_state()
        self.history.observe(state)
        self.hangs += self.fleet.episodes[self.marks.episodes:]  # new hangs join those not settled
        c = Check(self.history, self.marks, now, state, self.hangs)
        for name, invariant in INVARIANTS.items():
            for key in invariant(c):
                if key not in self.seen[name]:
                    self.seen[name].add(key)
                    self.counts[name] += 1
                    if len(self.examples[name]) < 3:
                        self.examples[name].append(self.describe(name, key))
        self.marks = Marks(len(self.history.actions), len(self.history.decisions), len(self.fleet.episodes))
        self.hangs = unsettled(self.hangs, self.history, now)

    def describe(self, name: str, key: Any) -> str:
        """A violation for a human: when, what, which workload."""
        seq = key if isinstance(key, int) else key[1] if isinstance(key, tuple) and isinstance(key[1], int) else None
        action = next((a for a in self.history.actions if a.seq == seq), None)
        if name == "hangs_handled_within_bound":
            e = self.fleet.episodes[key]
            return f"day {(e.start - T0) / 86400:.2f}: {e.cause} hang of {e.target} ({e.workload}) not handled"
        if action is not None:
            return (f"day {(action.at - T0) / 86400:.2f}: {action.kind} of {action.target} ({action.workload}, node"
                    f" {action.node}) by {action.replica}")
        return f"day {(self.clock() - T0) / 86400:.2f}: {key}"


async def soak(config: SoakConfig) -> Report:
    """One seeded soak in a temporary directory (the journals and the SQLite state)."""
    # In memory where the system has a tmpfs: the journals' fsyncs (synchronous=FULL) would otherwise
    # make the soak wait on the disk for most of its run, with nothing of the remediator's judged by it.
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(prefix="llm-vitals-soak-", dir=shm if shm.is_dir() else None) as directory:
        return await Soak(config, Path(directory)).run()


def run(config: SoakConfig) -> Report:
    logging.getLogger("llm_vitals").setLevel(logging.ERROR)  # a day of decisions is a lot of log lines
    return asyncio.run(soak(config))


def format_report(report: Report) -> str:
    lines = [f"{'invariant':<38} {'violations':>10}"]
    for name, count in report.violations.items():
        lines.append(f"{name:<38} {count:>10}")
        for example in report.examples[name]:
            lines.append(f"    e.g. {example}")
    lines.append("")
    lines += [f"{k}: {v}" for k, v in report.figures.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--workloads", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--store", choices=("lease", "sqlite"), default="lease")
    parser.add_argument("--repeat-interval", type=float, default=FleetConfig().repeat_interval,
                        help="Alertmanager's repeat_interval on the remediator's route, in seconds")
    parser.add_argument("--global-cooldown", default=SETTINGS["global_cooldown"],
                        help="the remediator's global_cooldown (a duration: 5m, 900s)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    fleet = replace(FleetConfig(), days=args.days, workloads=args.workloads, seed=args.seed, repeat_interval=args.repeat_interval)
    config = SoakConfig(fleet, args.store, {"global_cooldown": args.global_cooldown})
    report = run(config)
    if args.json:
        print(json.dumps({"violations": report.violations, "examples": report.examples, "figures": report.figures},
                         indent=2))
    else:
        print(format_report(report))
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main())

