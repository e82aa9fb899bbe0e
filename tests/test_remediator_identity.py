"""The remediator checks a pod's identity itself (identity.py, pods.IdentityReader, loop.py).

Before, the exporter's answer was the identity: a file_sd target's `__llm_vitals_pod`, `_pod_uid`,
`_node` and `_workload` labels became the pod acted on and the workload counted, so a labels-only
target at an unrelated address could restart a whole LeaderWorkerSet group; a pod whose owner
reference lacked `controller: true`, whose ReplicaSet was unreadable, or that the exporter gave
`workload: null` was counted by its pod name (each new pod a fresh budget). Now the pod is read
from the API server (here a loopback stand-in, tests/k8s/test_workload_safety.py has the real one)
and only its UID, IP, node and owners count.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_remediator_executors import tls_files  # noqa: F401
from test_remediator_helpers import Clock, make_settings
from test_remediator_loop import OLD, T0, Fleet, MemoryStore, alert
from test_remediator_pods import GROUP_LABELS, api  # noqa: F401

from llm_vitals.remediator.acting import Actor, claim_seconds
from llm_vitals.remediator.identity import verified, workload_of_pod
from llm_vitals.remediator.journal import Journal
from llm_vitals.remediator.ledger import Ledger
from llm_vitals.remediator.loop import GateLoop
from llm_vitals.remediator.metrics import RemediatorMetrics
from llm_vitals.remediator.model import FleetView, TargetStatus
from llm_vitals.remediator.pods import IdentityReader
from llm_vitals.remediator.policy import policy_from

RS_OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "vllm-5d8f7", "uid": "rs", "controller": True}
DEPLOYMENT_OWNER = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm", "uid": "d", "controller": True}
REPLICA_SET = {"metadata": {"name": "vllm-5d8f7", "namespace": "llm", "ownerReferences": [DEPLOYMENT_OWNER]}}


def pod(name: str = "vllm-0", uid: str = "uid-1", ip: str = "10.0.0.5", node: str = "n1",
        owners: list[dict[str, Any]] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "llm", "uid": uid, "labels": labels or {}}
    if owners is not None:
        metadata["ownerReferences"] = owners
    return {"metadata": metadata, "spec": {"nodeName": node}, "status": {"podIP": ip, "podIPs": [{"ip": ip}]}}


SAID = TargetStatus("stuck", process_start_time=OLD, engine="vllm", namespace="llm", pod="vllm-0", pod_uid="uid-1",
                    node="n1", workload="Pod/llm/vllm-0", url="http://10.0.0.5:8000")

# name, what the exporter said, the pod the API server has, its ReplicaSet as read, reason or workload
CASES = [
    ("a Deployment's pod: the workload from its ReplicaSet's owner", SAID, pod(owners=[RS_OWNER]), REPLICA_SET,
     "Deployment/llm/vllm"),
    ("the exporter's workload null: still the Deployment, never the pod name", replace(SAID, workload=None),
     pod(owners=[RS_OWNER]), REPLICA_SET, "Deployment/llm/vllm"),
    ("an owner reference without controller: true is the owner", SAID,
     pod(owners=[{"kind": "StatefulSet", "name": "vllm", "uid": "s"}]), None, "StatefulSet/llm/vllm"),
    ("a DaemonSet", SAID, pod(owners=[{"kind": "DaemonSet", "name": "ds", "uid": "d", "controller": True}]), None,
     "DaemonSet/llm/ds"),
    ("a LeaderWorkerSet group, from the pod's labels, not the exporter's", replace(SAID, workload="Pod/llm/x"),
     pod(labels=GROUP_LABELS, owners=[{"kind": "StatefulSet", "name": "big-0", "uid": "s", "controller": True}]),
     None, "LeaderWorkerSet/llm/big/0"),
    ("a bare pod (no owners at all) is its own workload", SAID, pod(), None, "Pod/llm/vllm-0"),
    ("a bare ReplicaSet names itself (no rollout renames it)", SAID, pod(owners=[RS_OWNER]),
     {"metadata": {"name": "vllm-5d8f7"}}, "ReplicaSet/llm/vllm-5d8f7"),
    ("an IPv6 pod at its bracketed address", replace(SAID, url="http://[fd00::5]:8000"), pod(ip="fd00:0::5"), None,
     "Pod/llm/vllm-0"),
    ("the exporter names no node: the API server's", replace(SAID, node=None), pod(), None, "Pod/llm/vllm-0"),
    # Refused: never a guess.
    ("its ReplicaSet unreadable: owner_pending, not ReplicaSet/<rs>", SAID, pod(owners=[RS_OWNER]), None,
     "owner_pending"),
    ("no such pod", SAID, None, None, "identity_mismatch"),
    ("another UID (recreated, or a writer's guess)", SAID, pod(uid="uid-2"), None, "identity_mismatch"),
    ("the exporter names no UID", replace(SAID, pod_uid=None), pod(), None, "identity_mismatch"),
    ("a target at an unrelated address", replace(SAID, url="http://192.0.2.7:8000"), pod(), None,
     "identity_mismatch"),
    ("an address by name proves nothing", replace(SAID, url="http://vllm.llm.svc:8000"), pod(), None,
     "identity_mismatch"),
    ("another node", replace(SAID, node="n2"), pod(), None, "identity_mismatch"),
]


@pytest.mark.parametrize("said, found, owner, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_pod_is_the_targets_only_as_the_api_server_says_and_its_workload_is_read_from_it(said, found, owner,
                                                                                              expected):
    checked = verified(said, found, owner)
    if checked.refusal is not None:
        assert checked.status is None and checked.refusal.reason == expected, checked.refusal
        return
    assert checked.status is not None and checked.status.workload == expected
    assert checked.status.pod_uid == found["metadata"]["uid"] and checked.status.node == found["spec"]["nodeName"]


def test_a_mismatch_says_both_sides():
    checked = verified(replace(SAID, url="http://192.0.2.7:8000", node="n2"), pod(uid="uid-2"), None)
    assert checked.refusal is not None
    detail = checked.refusal.detail
    for said in ("'uid-1'", "'uid-2'", "'http://192.0.2.7:8000'", "['10.0.0.5']", "'n2'", "'n1'"):
        assert said in detail, detail


def test_a_replica_set_that_is_not_the_one_named_is_not_its_owner():
    other = {"metadata": {"name": "vllm-other", "ownerReferences": [DEPLOYMENT_OWNER]}}
    with pytest.raises(Exception, match="not 'vllm-5d8f7'"):
        workload_of_pod(pod(owners=[RS_OWNER]), other)


# -- the edge and the loop, against the loopback API server ------------------------------------------


@pytest.fixture
async def pod_loop(tmp_path: Path, api):  # noqa: F811
    """`make(status) -> (loop, store)`: a gate loop over a template target `llm/vllm-0`, acting on pods
    through the stand-in API server."""
    server, kube = api
    journals: list[Journal] = []

    async def make(status: TargetStatus, kube_access: bool = True, **over: Any):
        clock = Clock(T0)
        store = MemoryStore(clock)
        settings = make_settings(tmp_path, "http://127.0.0.1:1", {}, global_cooldown="0s",
                                 target_templates=[{"match": {"namespace": "llm"}, "executor": "kubernetes"}], **over)
        journal = Journal(tmp_path / f"journal-{len(journals)}.db")
        await journal.open(clock())
        journals.append(journal)
        policy = policy_from(settings)
        metrics = RemediatorMetrics(settings.targets, journal, lambda: store.last, clock)
        ledger = Ledger(store, journal, metrics, policy, clock, "replica-a", claim_seconds(0.0, 0.0), {})
        actor = Actor(settings, {}, kube if kube_access else None, "replica-a", ledger)
        fleet = Fleet(FleetView({"llm/vllm-0": status}))
        loop = GateLoop(policy, ledger, fleet, actor, IdentityReader(kube) if kube_access else None)
        return loop, store, actor, journal

    yield server, make
    for journal in journals:
        await journal.close()


async def test_a_labels_only_target_at_an_unrelated_address_cannot_restart_a_group(pod_loop):
    """The file_sd writer copied the leader's name, UID, node and its group's workload: before, the
    whole group was evicted; now the address gives it away and nothing is listed or evicted."""
    server, make = pod_loop
    server.add_pod("vllm-0", GROUP_LABELS, ip="10.0.0.5")
    server.add_pod("vllm-0-1", GROUP_LABELS, ip="10.0.0.6")
    forged = replace(SAID, workload="LeaderWorkerSet/llm/big/0", url="http://192.0.2.7:8000", pod_uid="uid-vllm-0")
    loop, store, actor, journal = await make(forged)
    decision = await loop.handle(alert("llm/vllm-0"))
    await actor.wait_idle()
    assert decision.reason == "identity_mismatch" and "192.0.2.7" in decision.detail
    assert [c for c in server.calls if c[0] != "GET_POD"] == [] and len(server.pods) == 2
    assert store.state.in_progress is None and store.state.restart_times == {}
    row = (await journal.actions(1))[0]
    assert row["reason"] == "identity_mismatch" and "10.0.0.5" in row["detail"]


async def test_a_deployments_pod_is_counted_against_the_deployment_the_api_server_names(pod_loop):
    server, make = pod_loop
    server.add_pod("vllm-0", ip="10.0.0.5", owners=[RS_OWNER])
    server.replica_sets["vllm-5d8f7"] = REPLICA_SET
    loop, store, actor, _ = await make(replace(SAID, pod_uid="uid-vllm-0", workload=None))
    decision = await loop.handle(alert("llm/vllm-0"))
    await actor.wait_idle()
    assert decision.reason == "allowed"
    assert set(store.state.restart_times) == {"Deployment/llm/vllm"}
    assert [c[0] for c in server.calls if c[0] in ("GET_POD", "GET_RS", "EVICT")] == ["GET_POD", "GET_RS", "EVICT"]


async def test_an_unreadable_replica_set_refuses_owner_pending_and_commits_nothing(pod_loop):
    server, make = pod_loop
    server.add_pod("vllm-0", ip="10.0.0.5", owners=[RS_OWNER])  # its ReplicaSet is not there (not cached, 403, ...)
    loop, store, actor, _ = await make(replace(SAID, pod_uid="uid-vllm-0", workload="ReplicaSet/llm/vllm-5d8f7"))
    decision = await loop.handle(alert("llm/vllm-0"))
    await actor.wait_idle()
    assert decision.reason == "owner_pending"
    assert store.version == 0 and "vllm-0" in server.pods


async def test_a_pod_the_api_server_will_not_show_is_unverified_and_without_access_too(pod_loop):
    server, make = pod_loop
    server.add_pod("vllm-0", ip="10.0.0.5")
    server.reads_fail = 403
    loop, _, actor, _ = await make(replace(SAID, pod_uid="uid-vllm-0"))
    assert (await loop.handle(alert("llm/vllm-0"))).reason == "identity_unverified"
    loop, _, actor, _ = await make(replace(SAID, pod_uid="uid-vllm-0"), kube_access=False)
    assert (await loop.handle(alert("llm/vllm-0"))).reason == "identity_unverified"
    await actor.wait_idle()
    assert "vllm-0" in server.pods


async def test_a_dry_run_checks_the_identity_as_a_live_run_does(pod_loop):
    """Before, a dry run skipped the identity check: it answered `dry_run` (would restart) for a pod the
    API server does not have, and counted a real pod against the exporter's workload, not its owner's."""
    server, make = pod_loop
    server.add_pod("vllm-0", ip="10.0.0.5", owners=[RS_OWNER])
    server.replica_sets["vllm-5d8f7"] = REPLICA_SET
    forged = replace(SAID, url="http://192.0.2.7:8000", pod_uid="uid-vllm-0")
    loop, store, actor, journal = await make(forged, dry_run=True)
    assert (await loop.handle(alert("llm/vllm-0"))).reason == "identity_mismatch"
    assert store.state.decided_keys == frozenset()
    loop, store, actor, journal = await make(replace(SAID, pod_uid="uid-vllm-0", workload=None), dry_run=True)
    assert (await loop.handle(alert("llm/vllm-0"))).reason == "dry_run"
    await journal.drain()
    row = (await journal.actions(1))[0]
    assert (row["decision"], row["workload"]) == ("dry_run", "Deployment/llm/vllm")
    await actor.wait_idle()
    assert [c for c in server.calls if c[0] not in ("GET_POD", "GET_RS")] == [] and "vllm-0" in server.pods
