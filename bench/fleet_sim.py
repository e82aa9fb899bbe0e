"""A simulated fleet for the soak (bench/soak.py): the truth about pods, nodes and hangs, the seeded
schedule of incidents, and what Prometheus and Alertmanager would send about it.

Pure and deterministic: plain data, a seeded `random.Random`, and the time passed in; no I/O, no
clock of its own. The soak wires it to the remediator's real parts; the invariants
(bench/soak_invariants.py) judge the record it keeps.

The fleet: Deployments, StatefulSets and LeaderWorkerSet groups in one namespace, their pods spread
over many GPU nodes. Each pod of a Deployment or StatefulSet is one exporter target; a
LeaderWorkerSet group is one target (its leader), restarted as a whole. A replaced pod stays on its
node while the node is schedulable: GPU pods are pinned by their model cache and their GPUs, which
is why a restart does not cure a GPU fault and a cordon does.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from llm_vitals.remediator.model import FleetView, TargetStatus

NAMESPACE = "llm"
# The exporter calls a target stuck once its work has been pending with nothing moving this long.
STUCK_AFTER = 120.0
# LLMServerStuck's `for:` (alerts/llm-vitals.rules.yml) and the rule evaluation interval.
RULE_FOR = 60.0
# alerts/alertmanager.yml, the remediator's route: re-sent while firing, by each of two Alertmanagers.
REPEAT_INTERVAL = 900.0
# ... its group_wait and group_interval there. Alertmanager flushes a group every group_interval and
# re-sends a firing alert at the first flush after repeat_interval has *passed* since its last
# notification (the notification log's entry is a moment later than the flush that sent it): 15m is
# a re-send every 16m. A resolved alert is sent at the next flush.
GROUP_WAIT = 0.0
GROUP_INTERVAL = 60.0


def resend_after(repeat_interval: float, group_interval: float) -> float:
    """The time between two notifications of a still-firing alert: the first flush strictly after
    `repeat_interval` (Alertmanager's rounding up to its `group_interval`)."""
    return (math.floor(repeat_interval / group_interval) + 1) * group_interval
HA_ALERTMANAGERS = 2


@dataclass
class Pod:
    name: str
    uid: str
    node: str
    started: float
    hangs_at: float | None = None  # the engine will stop moving at this time (truth)
    episode: int | None = None  # the hang episode it is in, once it hangs
    restarted_at: float | None = None  # its server container's last restart in place (the kubelet's)

    @property
    def ip(self) -> str:
        """The pod's IP, one per pod (from its UID's serial): what the exporter polls, what the API server gives."""
        serial = int(self.uid.rsplit("-", 1)[1])
        return f"10.{(serial >> 16) & 255}.{(serial >> 8) & 255}.{serial & 255}"


@dataclass
class Workload:
    key: str  # what the operator owns (docs/remediator.md): Deployment/llm/x, StatefulSet/..., LeaderWorkerSet/llm/x/0
    kind: str  # deployment | statefulset | lws
    name: str
    pods: list[Pod]  # one per target; an LWS group's leader (its workers go with it)
    # A software fault of the workload itself (a bad model, a request of death): its pods hang again
    # this many seconds after each start, until a human rolls it back (`bug_until`).
    bug_until: float = 0.0
    bug_every: tuple[float, float] = (300.0, 1200.0)
    bug_all_replicas: bool = False


@dataclass
class Node:
    name: str
    gpu_fault_since: float | None = None  # the exporter flags it on every pod of the node (node evidence)
    flaky_until: float = 0.0  # pods here hang again and again, with no fault any signal shows
    cordoned_by_vitals: bool = False
    cordoned_at: float | None = None


@dataclass
class Episode:
    """One hang of one pod, from the engine's stop to the pod's end or its cure."""

    id: int
    target: str
    workload: str
    pod_uid: str
    node: str
    cause: str
    start: float
    end: float | None = None


@dataclass
class RuleState:
    """LLMServerStuck for one target, as Prometheus evaluates it and Alertmanager notifies it."""

    active_since: float
    workload: str = ""
    fired_at: float | None = None
    sent_at: float | None = None


@dataclass(frozen=True)
class Incident:
    at: float
    kind: str
    subject: str  # a workload key, a node name, or "" for the remediator's incidents
    until: float = 0.0


INCIDENT_KINDS = (
    "hang",  # one pod hangs once; a restart cures it
    "recurring_hang",  # a workload's pods hang one at a time, again after each restart, on whichever node
    "replica_wide_hang",  # every replica of a workload hangs (a software hang across replicas), again after restarts
    "flaky_node",  # pods on one node hang again and again, with no GPU fault flagged (no node evidence)
    "gpu_fault",  # a node's GPU fails (flagged: node evidence); its pods hang, a restart on it does not help
    "rollout",  # a workload's pods are all replaced (often during one of the above)
    "replica_crash",  # a remediator replica dies and starts again
    "lost_lease",  # the shared state's Lease is deleted (replicas only)
    "newer_field",  # a newer replica writes a field this version does not know (replicas only)
    "stale_write",  # a replica writes over a version another replaced since it read (replicas only)
)

# Incidents of the remediator itself, played by the soak (all but the first need replicas on a Lease).
REMEDIATOR_KINDS = ("replica_crash", "lost_lease", "newer_field", "stale_write")


@dataclass(frozen=True)
class FleetConfig:
    workloads: int = 20
    days: float = 2.0
    seed: int = 1
    pods_per_node: int = 4
    # Expected incidents per workload-day (workload kinds) or per node-day (node kinds), and per day.
    rates: tuple[tuple[str, float], ...] = (
        ("hang", 0.05), ("recurring_hang", 0.004), ("replica_wide_hang", 0.004), ("flaky_node", 0.004),
        ("gpu_fault", 0.008), ("rollout", 0.05), ("replica_crash", 0.5), ("lost_lease", 0.1), ("newer_field", 0.1),
        ("stale_write", 1.0),
    )
    # Rollouts that land while one of the workload's pods hangs (the rest fall at random).
    rollout_mid_incident: float = 0.3
    # Alertmanager's repeat_interval, group_wait and group_interval on the remediator's route.
    repeat_interval: float = REPEAT_INTERVAL
    group_wait: float = GROUP_WAIT
    group_interval: float = GROUP_INTERVAL


def schedule(config: FleetConfig, t0: float, nodes: list[str], workloads: list[str], replicated: bool) -> list[Incident]:
    """The seeded schedule of incidents: every kind at least once (a short run still meets each),
    more as its rate and the run's size say."""
    rng = random.Random(f"schedule-{config.seed}")
    span = config.days * 86400.0
    out: list[Incident] = []
    for kind, rate in config.rates:
        if kind in REMEDIATOR_KINDS[1:] and not replicated:
            continue
        units = len(nodes) if kind in ("flaky_node", "gpu_fault") else len(workloads)
        per_day = rate * (1 if kind in REMEDIATOR_KINDS else units)
        count = max(1, _poisson(rng, per_day * config.days))
        for _ in range(count):
            # Nothing in the first hour: the fleet settles; nothing in the last three: hangs have their bound.
            at = t0 + round(rng.uniform(3600.0, max(3600.0, span - 3 * 3600.0)) / 60.0) * 60.0
            subject = rng.choice(nodes) if kind in ("flaky_node", "gpu_fault") else (
                "" if kind in REMEDIATOR_KINDS else rng.choice(workloads))
            until = at + rng.uniform(2 * 3600.0, 12 * 3600.0) if kind in ("recurring_hang", "replica_wide_hang",
                                                                           "flaky_node") else 0.0
            out.append(Incident(at, kind, subject, until))
    return sorted(out, key=lambda i: (i.at, i.kind, i.subject))


def _poisson(rng: random.Random, mean: float) -> int:
    count, total = 0, rng.expovariate(1.0) if mean > 0 else float("inf")
    while total < mean:
        count += 1
        total += rng.expovariate(1.0)
    return count


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def fingerprint(target: str) -> str:
    return hashlib.sha256(f"LLMServerStuck/{target}".encode()).hexdigest()[:16]


class Fleet:
    """The truth about the fleet, changed by incidents and by the remediator's actions."""

    def __init__(self, config: FleetConfig, t0: float):
        self.config = config
        self.rng = random.Random(f"fleet-{config.seed}")
        self._serial = 0
        self.episodes: list[Episode] = []
        self.rules: dict[str, RuleState] = {}
        self.rollouts: list[tuple[float, str]] = []  # (when, workload): rollouts that land mid-incident
        self.rollouts_mid_incident = 0
        self.version = 0  # moves with every change the exporter would show
        count = config.workloads
        kinds = ["deployment", "statefulset", "lws"]
        pods_total = sum(2 if kinds[i % 3] == "deployment" else 1 for i in range(count))
        self.nodes = {f"gpu-node-{i:03d}": Node(f"gpu-node-{i:03d}")
                      for i in range(max(4, -(-pods_total // config.pods_per_node) + 2))}
        self.workloads: dict[str, Workload] = {}
        node_names = sorted(self.nodes)
        for i in range(count):
            kind, name = kinds[i % 3], f"model-{i:03d}"
            key = {"deployment": f"Deployment/{NAMESPACE}/{name}", "statefulset": f"StatefulSet/{NAMESPACE}/{name}",
                   "lws": f"LeaderWorkerSet/{NAMESPACE}/{name}/0"}[kind]
            replicas = 2 if kind == "deployment" else 1
            pods = [Pod(self._pod_name(kind, name, r), self._uid(), node_names[(i * 2 + r) % len(node_names)], t0 - 86400.0)
                    for r in range(replicas)]
            self.workloads[key] = Workload(key, kind, name, pods)

    # -- names ------------------------------------------------------------------------------------

    def _uid(self) -> str:
        self._serial += 1
        return f"uid-{self._serial:08d}"

    def _pod_name(self, kind: str, name: str, replica: int) -> str:
        if kind == "deployment":
            return f"{name}-{self.rng.getrandbits(32):08x}"  # a ReplicaSet's pod: a new name every time
        return f"{name}-{replica}" if kind == "statefulset" else f"{name}-0"  # the LWS leader of group 0

    def pods(self) -> Iterator[tuple[Workload, Pod]]:
        for workload in self.workloads.values():
            for pod in workload.pods:
                yield workload, pod

    def find(self, uid: str | None) -> tuple[Workload, Pod] | None:
        for workload, pod in self.pods():
            if pod.uid == uid:
                return workload, pod
        return None

    def node_at_fault(self, uid: str | None) -> bool:
        """Whether the pod's hang now is its node's doing (a GPU fault, a flaky node), not its workload's."""
        found = self.find(uid)
        if found is None or found[1].episode is None:
            return False
        return self.episodes[found[1].episode].cause in ("gpu_fault", "flaky_node")

    # -- the exporter's view ----------------------------------------------------------------------

    def hung(self, pod: Pod, now: float) -> bool:
        return pod.hangs_at is not None and pod.hangs_at <= now

    def view(self, now: float) -> FleetView:
        """What the exporter's `/api/v1/targets` says now: stuck once hung for STUCK_AFTER, the node's GPU fault."""
        targets = {}
        for workload, pod in self.pods():
            stuck = self.hung(pod, now) and now - (pod.hangs_at or now) >= STUCK_AFTER
            node = self.nodes[pod.node]
            fault = node.gpu_fault_since is not None
            targets[pod.name] = TargetStatus(
                "stuck" if stuck else "idle", process_start_time=pod.started, gpu_fault=fault,
                gpu_fault_detail=f"Xid79: GPU has fallen off the bus on {pod.node}" if fault else None,
                recently_unhealthy=stuck, engine="vllm", namespace=NAMESPACE, pod=pod.name, pod_uid=pod.uid,
                node=pod.node, workload=workload.key, url=f"http://{pod.ip}:8000", last_restart_time=pod.restarted_at)
        return FleetView(targets)

    # -- the API server's view -------------------------------------------------------------------

    def api_pod(self, namespace: str, name: str) -> tuple[dict | None, dict | None]:
        """The pod of that name as the API server holds it now (None: no such pod), and the owner its
        workload needs read (a Deployment pod's ReplicaSet; else None): what the identity check reads."""
        found = next(((w, p) for w, p in self.pods() if p.name == name), None) if namespace == NAMESPACE else None
        if found is None:
            return None, None
        workload, pod = found
        metadata: dict = {"namespace": NAMESPACE, "name": pod.name, "uid": pod.uid}
        owner = None
        if workload.kind == "lws":
            metadata["labels"] = {"leaderworkerset.sigs.k8s.io/name": workload.name,
                                  "leaderworkerset.sigs.k8s.io/group-index": "0"}
            metadata["ownerReferences"] = [{"kind": "StatefulSet", "name": f"{workload.name}-0", "controller": True}]
        elif workload.kind == "statefulset":
            metadata["ownerReferences"] = [{"kind": "StatefulSet", "name": workload.name, "controller": True}]
        else:
            replica_set = f"{workload.name}-rs"
            metadata["ownerReferences"] = [{"kind": "ReplicaSet", "name": replica_set, "controller": True}]
            owner = {"metadata": {"namespace": NAMESPACE, "name": replica_set,
                                  "ownerReferences": [{"kind": "Deployment", "name": workload.name, "controller": True}]}}
        return {"metadata": metadata, "spec": {"nodeName": pod.node},
                "status": {"podIP": pod.ip, "podIPs": [{"ip": pod.ip}]}}, owner

    # -- time passing -----------------------------------------------------------------------------

    def tick(self, now: float) -> dict[str, str]:
        """Time passes to `now`: hangs whose time came begin their episode (some draw a rollout while
        they last), a human's rollbacks happen. Returns the targets the exporter calls stuck now, with
        their workloads. The rollouts drawn land later (`land_rollouts`)."""
        for workload in self.workloads.values():
            if workload.bug_until and workload.bug_until <= now:
                self.roll_back(workload.key, now)  # the human's rollback ends the bug
        stuck = {}
        for workload, pod in self.pods():
            if pod.hangs_at is None or pod.hangs_at > now:
                continue
            if pod.episode is None:
                self._begin(workload, pod, self._cause(workload, pod, now))
                if self.rng.random() < self.config.rollout_mid_incident:
                    if self.rng.random() < 0.5:
                        # As the alert first goes out: between the exporter's poll and the remediator's
                        # reading of the pod, which the API server has replaced by then.
                        at = math.ceil(((pod.hangs_at or now) + STUCK_AFTER) / 60.0) * 60.0 + RULE_FOR
                    else:
                        at = now + self.rng.uniform(300.0, 1800.0)
                    self.rollouts.append((at, workload.key))
            if now - pod.hangs_at >= STUCK_AFTER:
                stuck[pod.name] = workload.key
        return stuck

    def land_rollouts(self, now: float) -> None:
        """The rollouts drawn mid-incident whose time came replace their workload's pods now."""
        due = [r for r in self.rollouts if r[0] <= now]
        if due:
            self.rollouts = [r for r in self.rollouts if r[0] > now]
            for _, key in due:
                self.rollouts_mid_incident += 1
                self.rollout(key, now)

    def _cause(self, workload: Workload, pod: Pod, now: float) -> str:
        node = self.nodes[pod.node]
        if node.gpu_fault_since is not None:
            return "gpu_fault"
        if node.flaky_until > now:
            return "flaky_node"
        return "workload_bug" if workload.bug_until > now else "hang"

    def _begin(self, workload: Workload, pod: Pod, cause: str) -> None:
        episode = Episode(len(self.episodes), pod.name, workload.key, pod.uid, pod.node, cause, pod.hangs_at or 0.0)
        self.episodes.append(episode)
        pod.episode = episode.id
        self.version += 1

    def _end(self, pod: Pod, now: float) -> None:
        if pod.episode is not None and self.episodes[pod.episode].end is None:
            self.episodes[pod.episode].end = now

    # -- incidents --------------------------------------------------------------------------------

    def apply(self, incident: Incident, now: float) -> None:
        """A fleet incident happens now (the remediator's own incidents are the soak's)."""
        kind, rng = incident.kind, self.rng
        if kind == "hang":
            pods = [p for p in self.workloads[incident.subject].pods if p.hangs_at is None]
            if pods:
                rng.choice(pods).hangs_at = now
        elif kind in ("recurring_hang", "replica_wide_hang"):
            workload = self.workloads[incident.subject]
            workload.bug_until, workload.bug_all_replicas = incident.until, kind == "replica_wide_hang"
            for pod in workload.pods if workload.bug_all_replicas else workload.pods[:1]:
                if pod.hangs_at is None:
                    pod.hangs_at = now
        elif kind == "flaky_node":
            node = self.nodes[incident.subject]
            node.flaky_until = incident.until
            for _, pod in self.pods():
                if pod.node == node.name and pod.hangs_at is None:
                    pod.hangs_at = now + rng.uniform(0.0, 1800.0)
        elif kind == "gpu_fault":
            node = self.nodes[incident.subject]
            if node.gpu_fault_since is None:
                node.gpu_fault_since = now
                for _, pod in self.pods():
                    if pod.node == node.name and pod.hangs_at is None:
                        pod.hangs_at = now
        elif kind == "rollout":
            self.rollout(incident.subject, now)
        self.version += 1

    def rollout(self, key: str, now: float) -> None:
        """A new revision replaces every pod of the workload (a rollout, or a human's rollback)."""
        workload = self.workloads[key]
        for i, pod in enumerate(workload.pods):
            workload.pods[i] = self._replaced(workload, pod, pod.node, now)
        self._rearm(workload, now)
        self.version += 1

    # -- what the remediator's actions do ---------------------------------------------------------

    def restart(self, uid: str | None, now: float) -> str | None:
        """Replace the pod (and, for an LWS group, its workers) on its node; None when it is gone already."""
        found = self.find(uid)
        if found is None:
            return None
        workload, pod = found
        node = pod.node if not self.nodes[pod.node].cordoned_by_vitals else self._elsewhere(pod.node)
        workload.pods[workload.pods.index(pod)] = self._replaced(workload, pod, node, now)
        self._rearm(workload, now)
        self.version += 1
        return pod.node

    def cordon_and_move(self, uid: str | None, node_name: str, now: float) -> bool:
        """Cordon the node (marked as llm-vitals'), then move the pod elsewhere; False when the pod is gone."""
        node = self.nodes[node_name]
        if not node.cordoned_by_vitals:
            node.cordoned_by_vitals, node.cordoned_at = True, now
        found = self.find(uid)
        if found is None:
            return False
        workload, pod = found
        workload.pods[workload.pods.index(pod)] = self._replaced(workload, pod, self._elsewhere(node_name), now)
        self._rearm(workload, now)
        self.version += 1
        return True

    def repair(self, node_name: str, now: float) -> None:
        """A human fixed the node: its fault is gone and it is uncordoned."""
        node = self.nodes[node_name]
        node.gpu_fault_since, node.cordoned_by_vitals, node.cordoned_at = None, False, None
        self.version += 1

    def roll_back(self, key: str, now: float) -> None:
        """A human rolled the workload back: its bug is gone, its pods replaced."""
        self.workloads[key].bug_until = 0.0
        self.rollout(key, now)

    def _elsewhere(self, avoid: str) -> str:
        load: dict[str, int] = dict.fromkeys((n for n, v in self.nodes.items()
                                              if n != avoid and not v.cordoned_by_vitals and v.gpu_fault_since is None), 0)
        for _, pod in self.pods():
            if pod.node in load:
                load[pod.node] += 1
        if not load:
            return avoid
        return min(sorted(load), key=lambda n: load[n])

    def _replaced(self, workload: Workload, pod: Pod, node_name: str, now: float) -> Pod:
        self._end(pod, now)
        index = workload.pods.index(pod)
        new = Pod(self._pod_name(workload.kind, workload.name, index), self._uid(), node_name, now)
        new.hangs_at = self._next_hang(workload, node_name, now)
        return new

    def _next_hang(self, workload: Workload, node_name: str, now: float) -> float | None:
        """When a server started now on `node_name` hangs (its node's fault, its workload's bug), or never."""
        node = self.nodes[node_name]
        if node.gpu_fault_since is not None:
            return now + 60.0
        if node.flaky_until > now:
            return now + self.rng.uniform(600.0, 2400.0)
        if workload.bug_until > now and workload.bug_all_replicas:
            return now + self.rng.uniform(*workload.bug_every)
        return None

    def restart_container(self, uid: str | None, now: float) -> bool:
        """The kubelet restarts the pod's server container in place (the same pod, name, UID and node; a
        new start time the exporter reports as `last_restart_time`); False when the pod is gone."""
        found = self.find(uid)
        if found is None:
            return False
        workload, pod = found
        self._end(pod, now)
        pod.started, pod.restarted_at, pod.episode = now, now, None
        pod.hangs_at = self._next_hang(workload, pod.node, now)
        self._rearm(workload, now)
        self.version += 1
        return True

    def _rearm(self, workload: Workload, now: float) -> None:
        """A recurring bug (one replica at a time) strikes again on any replica, on whichever node it runs."""
        if workload.bug_until > now and not workload.bug_all_replicas and all(p.hangs_at is None for p in workload.pods):
            self.rng.choice(workload.pods).hangs_at = now + self.rng.uniform(*workload.bug_every)

    # -- Prometheus and Alertmanager --------------------------------------------------------------

    def notifications(self, stuck: dict[str, str], now: float) -> list[dict]:
        """Evaluate LLMServerStuck on the exporter's stuck targets (name -> workload) and return the
        payloads Alertmanager sends now: firing after `for:`, re-sent every `repeat_interval`, resolved
        once; each sent by both Alertmanagers of an HA pair."""
        out = []
        for name in sorted(set(stuck) - set(self.rules)):
            self.rules[name] = RuleState(now, workload=stuck[name])
        for name in sorted(self.rules):
            rule = self.rules[name]
            if name not in stuck:
                if rule.fired_at is not None and rule.sent_at is not None:  # resolved only where firing was sent
                    out.append(alert(name, rule.workload, rule.fired_at, "resolved", now))
                del self.rules[name]
                continue
            if rule.fired_at is None and now - rule.active_since >= RULE_FOR:
                rule.fired_at = now
            if rule.fired_at is None:
                continue
            # The group's first notification after group_wait, then re-sends at its flushes (resend_after).
            every = resend_after(self.config.repeat_interval, self.config.group_interval)
            if (now - rule.fired_at >= self.config.group_wait if rule.sent_at is None
                    else now - rule.sent_at >= every):
                rule.sent_at = now
                out.append(alert(name, rule.workload, rule.fired_at, "firing", now))
        return [payload for a in out for payload in [webhook(a)] * HA_ALERTMANAGERS]


def alert(target: str, workload: str, fired_at: float, state: str, now: float) -> dict:
    labels = {"alertname": "LLMServerStuck", "target": target, "severity": "critical", "remediation": "restart",
              "engine": "vllm", "namespace": NAMESPACE, "workload": workload}
    return {"status": state, "labels": labels, "annotations": {"summary": f"{target} is stuck"},
            "startsAt": iso(fired_at), "endsAt": iso(now) if state == "resolved" else "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph", "fingerprint": fingerprint(target)}


def webhook(one: dict) -> dict:
    """Alertmanager's v4 payload for one alert (group_by: alertname, target)."""
    return {"version": "4", "groupKey": f'{{}}:{{alertname="LLMServerStuck", target="{one["labels"]["target"]}"}}',
            "truncatedAlerts": 0, "status": one["status"], "receiver": "llm-vitals-remediator",
            "groupLabels": {"alertname": "LLMServerStuck", "target": one["labels"]["target"]},
            "commonLabels": dict(one["labels"]), "commonAnnotations": dict(one["annotations"]),
            "externalURL": "http://alertmanager:9093", "alerts": [one]}

