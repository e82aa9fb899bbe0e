"""A target's workload, by tables: the pod rule (labels and owners), then what a template, a file_sd
label or a static target key names, and where the workload shows (target_info, the API, the page)."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest

from llm_vitals.config import KubeAccess
from llm_vitals.exporter.collector import read, target_texts
from llm_vitals.exporter.discovery.file_sd import parse_file_sd
from llm_vitals.exporter.discovery.kubernetes import PodSource, PodView, pod_target, pod_view, replica_set_list_error
from llm_vitals.exporter.discovery.workload import (
    Controller,
    ReplicaSets,
    controller_of,
    group_of,
    pod_workload,
    replica_set_controller,
)
from llm_vitals.exporter.settings import KubernetesDiscovery, parse_settings
from llm_vitals.exporter.state import StateStore, target_view
from llm_vitals.exporter.status_page import render_page
from llm_vitals.kube.client import KubeClient
from llm_vitals.kube.errors import ApiError, KubeUnavailable
from llm_vitals.kube.informer import Informer
from llm_vitals.kube.objects import Query

RS = Controller("ReplicaSet", "vllm-5d8f7")
DEPLOYMENT = Controller("Deployment", "vllm")
LWS = ("big", "2")
LISTED = ReplicaSets({"vllm-5d8f7": DEPLOYMENT, "bare-rs": None}, listed=True)
NOT_LISTED = ReplicaSets()
FORBIDDEN = ReplicaSets(failing=True)
# Listed once, failing now: what was read stays good.
LISTED_THEN_FAILING = ReplicaSets({"vllm-5d8f7": DEPLOYMENT}, listed=True, failing=True)


# Each row: the pod's LeaderWorkerSet labels, its controller, what is known of the ReplicaSets; its workload.
@pytest.mark.parametrize(("group", "controller", "replica_sets", "workload"), [
    # Pod -> ReplicaSet -> Deployment.
    (None, RS, LISTED, "Deployment/llm/vllm"),
    (None, RS, LISTED_THEN_FAILING, "Deployment/llm/vllm"),
    # A ReplicaSet no controller owns is the workload itself.
    (None, Controller("ReplicaSet", "bare-rs"), LISTED, "ReplicaSet/llm/bare-rs"),
    # Another controller of ReplicaSets (Argo Rollouts) names itself.
    (None, RS, ReplicaSets({"vllm-5d8f7": Controller("Rollout", "canary")}, listed=True), "Rollout/llm/canary"),
    # Cannot be read (no right): the ReplicaSet, stable until the template changes.
    (None, RS, FORBIDDEN, "ReplicaSet/llm/vllm-5d8f7"),
    # Listed, and this one not among them (not seen yet): the ReplicaSet too.
    (None, Controller("ReplicaSet", "newer"), LISTED, "ReplicaSet/llm/newer"),
    # Not listed yet, not failing either: wait rather than start under one name and move to another.
    (None, RS, NOT_LISTED, None),
    (None, Controller("StatefulSet", "vllm"), NOT_LISTED, "StatefulSet/llm/vllm"),
    (None, Controller("DaemonSet", "node-llm"), NOT_LISTED, "DaemonSet/llm/node-llm"),
    (None, Controller("Job", "bench-7"), NOT_LISTED, "Job/llm/bench-7"),
    # A bare pod is its own workload.
    (None, None, LISTED, "Pod/llm/vllm-0"),
    # A LeaderWorkerSet group: its labels win over the StatefulSet that owns each group's pods.
    (LWS, Controller("StatefulSet", "big-2"), NOT_LISTED, "LeaderWorkerSet/llm/big/2"),
    (LWS, None, NOT_LISTED, "LeaderWorkerSet/llm/big/2"),
    (LWS, RS, NOT_LISTED, "LeaderWorkerSet/llm/big/2"),
])
def test_a_pods_workload_is_read_from_its_labels_and_owners(group, controller, replica_sets, workload) -> None:
    assert pod_workload("llm", "vllm-0", group, controller, replica_sets) == workload


@pytest.mark.parametrize(("labels", "group"), [
    ({"leaderworkerset.sigs.k8s.io/name": "big", "leaderworkerset.sigs.k8s.io/group-index": "0"}, ("big", "0")),
    ({"leaderworkerset.sigs.k8s.io/name": "big", "leaderworkerset.sigs.k8s.io/group-index": "11",
      "leaderworkerset.sigs.k8s.io/worker-index": "3"}, ("big", "11")),
    ({"leaderworkerset.sigs.k8s.io/name": "big"}, None),  # no group index: not a group, the owners decide
    ({"leaderworkerset.sigs.k8s.io/group-index": "0"}, None),
    ({"leaderworkerset.sigs.k8s.io/name": "big", "leaderworkerset.sigs.k8s.io/group-index": "x"}, None),
    ({"leaderworkerset.sigs.k8s.io/name": "", "leaderworkerset.sigs.k8s.io/group-index": "0"}, None),
    ({}, None),
    (None, None),
])
def test_a_leaderworkerset_group_needs_both_labels(labels, group) -> None:
    assert group_of(labels) == group


@pytest.mark.parametrize(("references", "controller"), [
    ([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "vllm-5d8f7", "uid": "u", "controller": True,
      "blockOwnerDeletion": True}], RS),
    # Only the managing owner counts: another owner (a garbage-collection parent) is not the controller.
    ([{"kind": "ConfigMap", "name": "c", "uid": "u1"},
      {"kind": "StatefulSet", "name": "vllm", "uid": "u2", "controller": True}], Controller("StatefulSet", "vllm")),
    # No reference marked controller: the first owner, never none (which made the pod its own workload).
    ([{"kind": "ReplicaSet", "name": "r", "uid": "u", "controller": False}], Controller("ReplicaSet", "r")),
    ([{"kind": "StatefulSet", "name": "s", "uid": "u"}, {"kind": "ConfigMap", "name": "c", "uid": "u1"}],
     Controller("StatefulSet", "s")),
    ([{"kind": "ReplicaSet", "uid": "u", "controller": True}], None),  # no name: nothing to name it by
    (["not a mapping"], None),
    ([], None),
    (None, None),
])
def test_the_owner_is_the_reference_marked_controller_else_the_first(references, controller) -> None:
    assert controller_of({"ownerReferences": references}) == controller


def test_a_replica_sets_json_gives_its_deployment() -> None:
    replica_set = {"metadata": {"name": "vllm-5d8f7", "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm", "uid": "d", "controller": True}]}}
    assert replica_set_controller(replica_set) == DEPLOYMENT
    assert replica_set_controller({"metadata": {"name": "bare-rs"}}) is None


def test_pod_view_reads_the_labels_and_owners_a_workload_needs() -> None:
    pod = {"metadata": {"namespace": "llm", "name": "big-2-1", "uid": "u",
                        "labels": {"leaderworkerset.sigs.k8s.io/name": "big", "leaderworkerset.sigs.k8s.io/group-index": "2"},
                        "ownerReferences": [{"kind": "StatefulSet", "name": "big-2", "uid": "s", "controller": True}]},
           "spec": {}, "status": {"phase": "Running", "podIP": "10.0.0.9"}}
    view = pod_view(pod)
    assert (view.group, view.controller) == (LWS, Controller("StatefulSet", "big-2"))


KUBE = KubernetesDiscovery(selector="app=vllm", port=8000, template={"engine": "vllm"})


def running(name: str = "vllm-5d8f7-x2x", controller: Controller | None = RS) -> PodView:
    return PodView("llm", name, "uid", "Running", "10.1.2.3", "node-a", controller=controller)


def test_a_deployments_pod_target_carries_the_deployment() -> None:
    target, why = pod_target(running(), KUBE, "kubernetes[0]", {}, LISTED)
    assert why is None and target is not None
    assert (target.name, target.workload) == ("llm/vllm-5d8f7-x2x", "Deployment/llm/vllm")


def test_a_replica_sets_pod_waits_for_the_first_list_and_is_shown_meanwhile() -> None:
    target, why = pod_target(running(), KUBE, "kubernetes[0]", {})
    assert target is None
    assert why == "owner_pending: waiting for the ReplicaSets of namespace llm to be listed"
    target, why = pod_target(running(), KUBE, "kubernetes[0]", {}, FORBIDDEN)
    assert target is not None and target.workload == "ReplicaSet/llm/vllm-5d8f7"


def test_a_templates_workload_wins_over_the_owners_and_needs_no_replica_set() -> None:
    config = KUBE.model_copy(update={"template": {"engine": "vllm", "workload": "vllm-fleet"}})
    for pod in (running(), running(controller=None), running(controller=Controller("StatefulSet", "s"))):
        target, why = pod_target(pod, config, "kubernetes[0]", {})
        assert why is None and target is not None and target.workload == "vllm-fleet"


def test_a_static_target_is_its_own_workload_unless_it_names_one() -> None:
    settings = parse_settings({"targets": [{"name": "gpu-a", "url": "http://127.0.0.1:1"},
                                           {"name": "gpu-b", "url": "http://127.0.0.1:2", "workload": "box-1/vllm"}]},
                              environ={})
    assert [t.effective_workload for t in settings.targets] == ["gpu-a", "box-1/vllm"]


@pytest.mark.parametrize("bad", ["", "a b", "/lead", "x\"y", "a" * 513])
def test_a_workload_that_is_no_safe_label_value_is_refused_at_load(bad) -> None:
    with pytest.raises(Exception, match="workload"):
        parse_settings({"targets": [{"name": "a", "url": "http://127.0.0.1:1", "workload": bad}]}, environ={})


FILE_SD = """
- targets: ["10.0.0.1:8000", "10.0.0.2:8000"]
  labels: {__llm_vitals_workload: Deployment/llm/vllm}
- targets: ["10.0.0.3:8000"]
  labels: {__llm_vitals_name: solo}
- targets: ["10.0.0.4:8000"]
"""


@pytest.mark.parametrize(("template", "workloads"), [
    ({}, ["Deployment/llm/vllm", "Deployment/llm/vllm", "solo", "10.0.0.4:8000"]),
    # The label wins over the template; the template over the target's own name.
    ({"workload": "rack-7"}, ["Deployment/llm/vllm", "Deployment/llm/vllm", "rack-7", "rack-7"]),
])
def test_a_file_sd_label_or_template_names_the_workload_else_the_target_is_its_own(template, workloads) -> None:
    read_ = parse_file_sd(FILE_SD, "t.yaml", template, "file[0]", {})
    assert [t.effective_workload for t in read_.targets] == workloads


def test_a_bad_workload_label_skips_that_group_with_its_reason() -> None:
    read_ = parse_file_sd('[{"targets": ["10.0.0.1:1"], "labels": {"__llm_vitals_workload": "a b"}}]', "t.json", {},
                          "file[0]", {})
    assert read_.targets == ()
    assert read_.skipped["t.json#0/10.0.0.1:1"].startswith("bad_target: workload:")


@pytest.mark.parametrize(("error", "words"), [
    (ApiError(403, "Forbidden", "replicasets.apps is forbidden"),
     ["HTTP 403 listing replicasets in namespace llm", "list and watch on replicasets (apps)",
      "has that ReplicaSet as its workload"]),
    (ApiError(500, "InternalError", "etcd"), ["HTTP 500 InternalError listing replicasets in namespace llm: etcd"]),
    (KubeUnavailable("the API server cannot be reached: refused"), ["listing replicasets in namespace llm: the API"]),
])
def test_a_replica_set_list_error_says_what_is_missing_and_what_happens_meanwhile(error, words) -> None:
    text = replica_set_list_error(error, "llm")
    assert all(word in text for word in words), text


def test_the_replica_sets_error_is_the_sources_error_and_the_pods_stay_targets() -> None:
    source = PodSource("kubernetes[0]", KUBE, {}, kube=KubeClient(KubeAccess()))  # connects on first use: never here
    source.replica_set_errors["llm"] = "HTTP 403 listing replicasets in namespace llm: ..."
    targets, status = source.current()
    assert targets == [] and status.up is False and status.error == "HTTP 403 listing replicasets in namespace llm: ..."


def test_the_workload_shows_in_target_info_the_api_and_the_status_page() -> None:
    settings = parse_settings({"targets": [{"name": "gpu-a", "url": "http://127.0.0.1:1"},
                                           {"name": "gpu-b", "url": "http://127.0.0.1:2", "workload": "Deployment/llm/vllm"}]},
                              environ={})
    store = StateStore(settings, now=100.0)
    texts = {record.name: target_texts(read(record, 101.0), 101.0)[0].decode() for record in store}
    assert texts["gpu-b"] == ('llm_vitals_target_info{engine="vllm",namespace="",node="",pod="",role="backend",'
                              'target="gpu-b",url="http://127.0.0.1:2",workload="Deployment/llm/vllm"} 1.0\n')
    assert 'workload="gpu-a"' in texts["gpu-a"]
    views = [target_view(record, 101.0) for record in store]
    assert [v.workload for v in views] == ["gpu-a", "Deployment/llm/vllm"]
    page = render_page(views, {}, None, 101.0)
    assert 'data-target="gpu-b" data-state="starting" data-workload="Deployment/llm/vllm"' in page
    assert '<span class="workload">Deployment/llm/vllm</span>' in page
    assert '<span class="workload">gpu-a</span>' not in page  # its own name is not said twice


def source_with(pods: dict[str, PodView], replica_sets: dict[str, Controller | None] | None) -> tuple[PodSource, list]:
    """A PodSource holding these pods (and ReplicaSets: None, not listed yet) as its informers would, reports kept."""
    source = PodSource("kubernetes[0]", KUBE, {}, kube=KubeClient(KubeAccess()))
    reports: list = []
    source._report = lambda targets, status: reports.append((targets, status))
    source.informers["llm"] = Informer(source.kube, Query("pods", "llm", "app=vllm"), pod_view, source._changed)
    source.informers["llm"].objects = dict(pods)
    replica_set_informer = Informer(source.kube, Query("replicasets", "llm"), replica_set_controller,
                                    partial(source._replica_set_changed, "llm"))
    replica_set_informer.objects = dict(replica_sets or {})
    replica_set_informer.synced = replica_sets is not None
    source.replica_set_informers["llm"] = replica_set_informer
    return source, reports


async def test_only_a_replica_set_that_owns_one_of_our_pods_makes_a_report() -> None:
    source, reports = source_with({"vllm-5d8f7-x2x": running()}, {"vllm-5d8f7": DEPLOYMENT, "other-app-1": None})
    first, _ = source.current()
    replica_sets = source.replica_set_informers["llm"]
    replica_sets.on_change("other-app-1")  # another app's ReplicaSet scaled: nothing of ours changed
    await asyncio.sleep(0)
    assert reports == []
    replica_sets.on_change("vllm-5d8f7")  # ours (a status update): reported, and the very same target kept
    await asyncio.sleep(0)
    assert len(reports) == 1 and reports[0][0][0] is first[0]
    replica_sets.on_change(None)  # a relist: reported
    await asyncio.sleep(0)
    assert len(reports) == 2


async def test_a_pod_waiting_for_the_first_list_becomes_a_target_when_it_comes() -> None:
    source, reports = source_with({"vllm-5d8f7-x2x": running()}, None)
    targets, status = source.current()
    assert targets == [] and status.skipped == {"llm/vllm-5d8f7-x2x": (
        "owner_pending: waiting for the ReplicaSets of namespace llm to be listed")}
    replica_sets = source.replica_set_informers["llm"]
    replica_sets.objects, replica_sets.synced = {"vllm-5d8f7": DEPLOYMENT}, True
    replica_sets.on_change(None)
    await asyncio.sleep(0)
    (targets, status), = reports
    assert [t.workload for t in targets] == ["Deployment/llm/vllm"] and status.skipped == {}
    # The Deployment lets go of its ReplicaSet (orphaned): the workload follows, as a new target.
    replica_sets.objects["vllm-5d8f7"] = None
    replica_sets.on_change("vllm-5d8f7")
    await asyncio.sleep(0)
    assert [t.workload for t in reports[-1][0]] == ["ReplicaSet/llm/vllm-5d8f7"]
