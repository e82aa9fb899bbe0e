"""The dynamic target set's pure rules, by tables: shard, desired set, reconcile, pod -> target, file_sd -> targets."""

from __future__ import annotations

from collections import Counter

import pytest

from llm_vitals.exporter.discovery.file_sd import FileSdError, parse_file_sd
from llm_vitals.exporter.discovery.kubernetes import PodView, pod_list_error, pod_port, pod_target, pod_view
from llm_vitals.exporter.discovery.targetset import DiscoveredTarget, build_target, desired, in_shard, reconcile, shard_of
from llm_vitals.exporter.settings import KubernetesDiscovery, ShardSettings, TargetSettings, parse_settings
from llm_vitals.kube.errors import ApiError


def static(name: str, port: int = 9000) -> TargetSettings:
    return TargetSettings(name=name, url=f"http://127.0.0.1:{port}")


def pod_target_of(name: str, uid: str = "u1", ip: str = "10.0.0.1", node: str | None = "n1") -> DiscoveredTarget:
    return build_target({"engine": "vllm"}, {}, name=f"llm/{name}", url=f"http://{ip}:8000", source="kubernetes[0]",
                        namespace="llm", pod=name, pod_uid=uid, node=node)


def test_the_shard_is_stable_and_splits_every_name_exactly_once() -> None:
    names = [f"llm/vllm-{i}" for i in range(1000)]
    # sha256, not hash(): the same on every replica and every run (PYTHONHASHSEED does not matter).
    assert shard_of("llm/vllm-0", 4) == shard_of("llm/vllm-0", 4) == 0
    owners = [[in_shard(name, ShardSettings(index=i, count=3)) for i in range(3)] for name in names]
    assert all(sum(row) == 1 for row in owners)
    sizes = Counter(row.index(True) for row in owners)
    assert min(sizes.values()) > 280, sizes  # roughly even: 1000 / 3
    assert all(in_shard(name, None) for name in names)


def test_desired_keeps_static_first_and_reports_a_name_given_twice() -> None:
    a, b = static("a"), static("b")
    dup = build_target({}, {}, name="a", url="http://127.0.0.1:1", source="file[0]")
    wanted, conflicts = desired([a, b], [[dup, pod_target_of("vllm-0")]], None)
    assert list(wanted) == ["a", "b", "llm/vllm-0"]
    assert wanted["a"] is a
    assert [(c.name, c.kept, c.dropped) for c in conflicts] == [("a", "static", "file[0]")]


def test_desired_applies_the_shard_to_static_and_discovered_targets() -> None:
    targets = [static(f"s{i}") for i in range(20)]
    pods = [pod_target_of(f"vllm-{i}") for i in range(20)]
    halves = [desired(targets, [pods], ShardSettings(index=i, count=2))[0] for i in range(2)]
    assert set(halves[0]).isdisjoint(halves[1])
    assert set(halves[0]) | set(halves[1]) == {t.name for t in [*targets, *pods]}


@pytest.mark.parametrize(("current", "wanted", "added", "removed", "changed"), [
    ({}, {"a": static("a")}, ["a"], [], []),
    ({"a": static("a")}, {}, [], ["a"], []),
    ({"a": static("a")}, {"a": static("a")}, [], [], []),  # equal settings: untouched, its state kept
    ({"a": static("a")}, {"a": static("a", 9001)}, [], [], ["a"]),  # moved: a fresh target
    # A pod recreated under the same name (new UID) is a new target, even on the same IP.
    ({"llm/v": pod_target_of("v", uid="u1")}, {"llm/v": pod_target_of("v", uid="u2")}, [], [], ["llm/v"]),
    ({"llm/v": pod_target_of("v")}, {"llm/v": pod_target_of("v")}, [], [], []),
])
def test_reconcile_says_what_was_added_removed_and_changed(current, wanted, added, removed, changed) -> None:
    changes = reconcile(current, wanted)
    assert [t.name for t in changes.added] == added
    assert list(changes.removed) == removed
    assert [t.name for t in changes.changed] == changed
    assert bool(changes) == bool(added or removed or changed)


def test_a_discovered_name_may_be_a_253_character_pod_under_its_namespace() -> None:
    long = "p" * 253
    target = build_target({}, {}, name=f"llm/{long}", url="http://10.0.0.1:8000", source="kubernetes[0]")
    assert target.name == f"llm/{long}"
    for bad in ("a b", "a/b/c", "x\"y", "", "/x"):
        with pytest.raises(ValueError, match="discovered target name"):
            build_target({}, {}, name=bad, url="http://10.0.0.1:8000", source="file[0]")


KUBE = KubernetesDiscovery(selector="app=vllm", port="http", template={"engine": "vllm", "stuck_after": "2m"})
RUNNING = PodView("llm", "vllm-0", "uid-0", "Running", "10.1.2.3", "node-a", (("http", 8000), ("metrics", 9000)))


# Each row: the pod, the config's port; the target's URL, or the skip reason's start.
@pytest.mark.parametrize(("pod", "port", "url", "skip"), [
    (RUNNING, "http", "http://10.1.2.3:8000", None),
    (RUNNING, "metrics", "http://10.1.2.3:9000", None),
    (RUNNING, 8080, "http://10.1.2.3:8080", None),  # a number need not be declared
    (RUNNING, "grpc", None, "no_port: no container port named 'grpc'"),
    (PodView("llm", "p", "u", "Running", None, "n"), "http", None, "no_ip:"),
    (PodView("llm", "p", "u", "Pending", None, None), "http", None, "not_running: phase Pending"),
    (PodView("llm", "p", "u", "Succeeded", "10.0.0.1", "n", (("http", 1),)), "http", None, "not_running: phase Succeeded"),
    (PodView("llm", "p", "u", "Running", "10.0.0.1", "n", (("http", 1),), deleting=True), "http", None, "terminating:"),
    (PodView("llm", "p", "u", "Running", "fd00::5", "n", (("http", 8000),)), "http", "http://[fd00::5]:8000", None),
])
def test_a_pod_is_a_target_only_when_running_with_an_ip_and_the_port(pod, port, url, skip) -> None:
    config = KUBE.model_copy(update={"port": port})
    target, why = pod_target(pod, config, "kubernetes[0]", {})
    if url is None:
        assert target is None and why is not None and why.startswith(skip), why
        return
    assert why is None and target is not None
    assert target.base_url == url
    assert (target.name, target.namespace, target.pod, target.pod_uid, target.node) == (
        f"llm/{pod.name}", "llm", pod.name, pod.uid, pod.node)
    assert (target.engine, target.stuck_after, target.source) == ("vllm", 120.0, "kubernetes[0]")


def test_a_template_that_does_not_make_a_target_is_a_skip_not_a_crash() -> None:
    config = KUBE.model_copy(update={"template": {"api_key_env": "UNSET_KEY"}})
    target, why = pod_target(RUNNING, config, "kubernetes[0]", {})
    assert target is None and why is not None and why.startswith("bad_target:") and "UNSET_KEY" in why


def test_pod_view_reads_the_json_form() -> None:
    pod = {"metadata": {"namespace": "llm", "name": "v", "uid": "u", "deletionTimestamp": None},
           "spec": {"nodeName": "n", "containers": [{"ports": [{"name": "http", "containerPort": 8000}]}, {}]},
           "status": {"phase": "Running", "podIP": "10.0.0.9"}}
    assert pod_view(pod) == PodView("llm", "v", "u", "Running", "10.0.0.9", "n", (("http", 8000),))
    assert pod_port(pod_view(pod), "8000") == 8000


def test_a_403_names_the_missing_right() -> None:
    text = pod_list_error(ApiError(403, "Forbidden"), "llm")
    assert "HTTP 403" in text and "list and watch on pods" in text and "llm" in text


def test_discovery_config_is_checked_at_load() -> None:
    base = {"discovery": [{"kubernetes": {"selector": "app=vllm", "port": "http"}}]}
    assert parse_settings(base, "t", environ={}).targets == []
    for bad, message in [
        ({"discovery": [{"kubernetes": {"selector": "a=b", "port": "http", "template": {"url": "http://x"}}}]},
         "a template may not set url"),
        ({"discovery": [{"kubernetes": {"selector": "a=b", "port": "http", "template": {"stuck_aftr": "1m"}}}]},
         "stuck_aftr"),
        ({"discovery": [{"kubernetes": {"selector": "a=b", "port": 0}}]}, "port must be 1-65535"),
        ({"discovery": [{}]}, "exactly one of kubernetes and file"),
        ({"targets": [{"name": "a", "url": "http://127.0.0.1:1"}], "shard": {"index": 2, "count": 2}},
         "shard.index must be below shard.count"),
        ({}, "give at least one target, or a discovery source"),
    ]:
        with pytest.raises(Exception, match=message):
            parse_settings(bad, "t", environ={})


FILE_SD = """
- targets: ["10.0.0.1:8000", "10.0.0.2:8000"]
  labels: {__llm_vitals_engine: sglang, __llm_vitals_stuck_after: 90s, team: a}
- targets: ["10.0.0.3:8443"]
  labels: {__llm_vitals_name: big-one, __scheme__: https}
- targets: ["10.0.0.4:8000", "10.0.0.5:8000"]
  labels: {__llm_vitals_name: two-names}
- targets: ["10.0.0.6:8000"]
  labels: {__llm_vitals_engine: nosuch}
- {labels: {}}
"""


def test_file_sd_groups_become_targets_and_bad_ones_are_skipped_with_their_reason() -> None:
    read = parse_file_sd(FILE_SD, "t.yaml", {"model": "tiny"}, "file[0]", {})
    by_name = {t.name: t for t in read.targets}
    assert list(by_name) == ["10.0.0.1:8000", "10.0.0.2:8000", "big-one"]
    assert (by_name["10.0.0.1:8000"].engine, by_name["10.0.0.1:8000"].stuck_after) == ("sglang", 90.0)
    assert by_name["big-one"].base_url == "https://10.0.0.3:8443" and by_name["big-one"].model == "tiny"
    assert read.skipped["t.yaml#2"].startswith("bad_group: a __llm_vitals_name label")
    assert read.skipped["t.yaml#3/10.0.0.6:8000"].startswith("bad_target: engine")
    assert read.skipped["t.yaml#4"].startswith("bad_group:")


@pytest.mark.parametrize(("text", "message"), [
    ('{"targets": []}', "must be a list of target groups"),
    ('[{"targets": ["a:1"]', "not valid JSON or YAML"),
])
def test_an_unusable_file_sd_document_is_an_error(text, message) -> None:
    with pytest.raises(FileSdError, match=message):
        parse_file_sd(text, "t.json", {}, "file[0]", {})


def test_an_empty_file_sd_document_has_no_targets() -> None:
    assert parse_file_sd("", "t.json", {}, "file[0]", {}).targets == ()
