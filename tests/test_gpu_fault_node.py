"""The node source over the node watch's cache, and the watch's failures on a live exporter; the real API server is in tests/k8s/."""

from __future__ import annotations

import pytest
from test_exporter_helpers import BUSY_PAGE, FakeVllm, make_settings, make_target, record, start_exporter, target_json, wait_for

from llm_vitals.demo.ports import free_port
from llm_vitals.exporter.gpu_faults import GpuFault, NodeRules, SourceRead, Taint
from llm_vitals.exporter.gpu_faults.node import NodeSource
from llm_vitals.exporter.gpu_faults.node_watch import NodeCache, NodeView, NodeWatchRunner, node_view
from llm_vitals.exporter.gpu_faults.reader import GpuFaultReader
from llm_vitals.exporter.settings import ConfigError, parse_settings
from llm_vitals.exporter.state import StateStore


def busy_target(name: str, url: str, **overrides):
    """A target on the static busy page, kept `busy` (not `stuck`) however slow the box: readiness then depends on the GPU fault alone."""
    return make_target(name, url, stuck_after=600, **overrides)

RULES = NodeRules(taints=(Taint.parse("nvidia.com/gpu-xid-error"),))
BAD = NodeView(({"type": "GpuMemWatch", "status": "True", "reason": "GpuMemWatchIsNotHealthy", "message": "DBE"},))
GOOD = NodeView(({"type": "GpuMemWatch", "status": "False", "reason": "GpuMemWatchIsHealthy", "message": ""},))


async def apply(cache: NodeCache | None, rec, rules: NodeRules | None = None) -> None:
    """One poll's GPU-fault read of `rec` with only the node source, written as the poller writes it."""
    reader = GpuFaultReader([NodeSource(cache, rules or RULES)])
    rec.set_gpu_faults(await reader.read(rec.settings, rec.gpu_faults))


def store(*nodes: str | None) -> StateStore:
    targets = [{"name": f"t{i}", "url": f"http://127.0.0.1:{9000 + i}", **({"node": n} if n else {})} for i, n in enumerate(nodes)]
    return StateStore(parse_settings({"targets": targets}, "test", environ={}), 0.0)


# Each row: the cache, the target's node; the fault detail's start (or None), the node error's start (or None).
@pytest.mark.parametrize(("cache", "node", "fault", "error"), [
    (NodeCache({"n1": BAD}, synced=True), "n1", "GpuMemWatchIsNotHealthy: node n1", None),
    (NodeCache({"n1": BAD, "n2": GOOD}, synced=True), "n2", None, None),
    (NodeCache({"n1": BAD}, synced=True), "n9", None, "node n9 not found"),
    (NodeCache(), "n1", None, "the node watch has not listed the nodes yet"),
    (NodeCache(error="HTTP 403 Forbidden listing nodes"), "n1", None, "HTTP 403 Forbidden"),
    # The API server went away after a list: what was seen of the node stays, the error beside it.
    (NodeCache({"n1": BAD}, synced=True, error="the API server cannot be reached"), "n1", "GpuMemWatchIsNotHealthy", "the API server"),
    (NodeCache({"n1": NodeView(taints=({"key": "nvidia.com/gpu-xid-error", "value": "true", "effect": "NoSchedule"},))}, synced=True),
     "n1", "nvidia.com/gpu-xid-error: node n1 is tainted", None),
])
async def test_the_cache_gives_each_target_its_nodes_fault_or_why_not(cache, node, fault, error) -> None:
    [rec] = store(node)
    await apply(cache, rec)
    assert (rec.gpu_fault or None) is None if fault is None else rec.gpu_fault.startswith(fault)
    assert rec.gpu_fault_errors.get("node") is None if error is None else rec.gpu_fault_errors["node"].startswith(error)
    if fault:
        assert rec.fault is not None and rec.fault.source == "node" and rec.ready(0.0) is False


async def test_a_target_without_a_node_is_left_alone_and_an_error_clears() -> None:
    plain, on_node = store(None, "n1")
    await apply(NodeCache({"n1": BAD}, synced=True), plain)
    assert plain.gpu_fault is None and plain.gpu_fault_errors == {}
    await apply(NodeCache(), on_node)
    assert "node" in on_node.gpu_fault_errors
    await apply(NodeCache({"n1": GOOD}, synced=True), on_node)
    assert on_node.gpu_fault_errors == {} and on_node.gpu_fault is None
    await apply(NodeCache({"n1": BAD}, synced=True), on_node)
    await apply(None, on_node)  # the node watch stopped: nothing is kept from it
    assert on_node.gpu_fault is None and on_node.gpu_fault_errors == {}


async def test_the_file_wins_the_detail_over_the_node() -> None:
    [rec] = store("n1")
    await apply(NodeCache({"n1": BAD}, synced=True), rec)
    rec.set_gpu_faults(rec.gpu_faults.with_read("file", SourceRead(GpuFault("file", "Xid 79 from dmesg"))))
    assert rec.gpu_fault == "Xid 79 from dmesg" and rec.fault is not None and rec.fault.source == "file"


def test_node_view_reads_the_api_json_shape() -> None:
    view = node_view({"metadata": {"name": "n1"}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
                      "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert view == NodeView(({"type": "Ready", "status": "True"},), ({"key": "k", "effect": "NoSchedule"},))
    assert node_view({"metadata": {"name": "n1"}}) == NodeView()


def test_a_bad_taint_pattern_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="the key is empty"):
        parse_settings({"gpu_faults": {"node_taints": [":NoSchedule"]}, "targets": [{"name": "a", "url": "http://127.0.0.1:1"}]},
                       "test", environ={})


@pytest.mark.parametrize(("kubeconfig", "error"), [
    ("missing", "cannot use the kubeconfig"),
    ("unreachable", "the API server cannot be reached"),
])
async def test_a_node_watch_that_cannot_work_is_an_error_kept_never_a_fault(aiohttp_server, aiohttp_client, tmp_path,
                                                                              kubeconfig, error) -> None:
    path = tmp_path / "kubeconfig"
    if kubeconfig == "unreachable":  # a real port that nothing listens on
        unreachable_kubeconfig(path)
    server = await aiohttp_server(FakeVllm(BUSY_PAGE).app())
    settings = make_settings([busy_target("gpu-a", str(server.make_url("")), node="n1")],
                             gpu_faults={"kubeconfig": str(path)})
    client = await start_exporter(aiohttp_client, settings)
    rec = record(client, "gpu-a")
    await wait_for(lambda: rec.verdict.state == "busy" and error in rec.gpu_fault_errors.get("node", ""), what=f"busy, {error!r} kept")
    view = await target_json(client, "gpu-a")
    assert view["gpu_fault"] is False and view["ready"] is True and view["node"] == "n1"


def unreachable_kubeconfig(path) -> str:
    """A kubeconfig whose API server is a free loopback port: the watch runs, and fails to list."""
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{free_port()}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return str(path)


async def test_the_node_watch_follows_each_config_started_and_stopped_and_the_source_takes_new_rules(tmp_path) -> None:
    kubeconfig = unreachable_kubeconfig(tmp_path / "kubeconfig")

    def config(node: str | None, taints: list[str]):
        target = {"name": "t0", "url": "http://127.0.0.1:9000", **({"node": node} if node else {})}
        return parse_settings({"targets": [target], "gpu_faults": {"kubeconfig": kubeconfig, "node_taints": taints}},
                              "test", environ={})

    without, with_node = config(None, []), config("n1", [])
    assert without.node_watch_access() is None and with_node.node_watch_access() is not None
    [rec] = store("n1")
    cache = NodeCache({"n1": NodeView(taints=({"key": "nvidia.com/gpu-xid-error", "effect": "NoSchedule"},))}, synced=True)
    runner = NodeWatchRunner(cache)
    source = NodeSource(cache, with_node.gpu_faults.node_rules)
    reader = GpuFaultReader([source])

    async def poll() -> None:
        rec.set_gpu_faults(await reader.read(rec.settings, rec.gpu_faults))

    try:
        await runner.follow(without.node_watch_access())
        assert not runner.running
        await runner.follow(with_node.node_watch_access())
        assert runner.running and runner.watch is not None
        first = runner.watch
        await poll()
        assert rec.gpu_fault is None  # the taint is not listed
        # A reload lists the taint: the source's rules change (Poller.reconfigure) and the next poll judges on them.
        relisted = config("n1", ["nvidia.com/gpu-xid-error"])
        await runner.follow(relisted.node_watch_access())
        source.rules = relisted.gpu_faults.node_rules
        assert runner.watch is first
        await poll()
        assert rec.gpu_fault is not None and rec.gpu_fault.startswith("nvidia.com/gpu-xid-error: node n1")
        # A reload that no target needs it for stops it and empties its cache: the next poll keeps nothing of it.
        await runner.follow(without.node_watch_access())
        assert not runner.running and cache.nodes == {} and not cache.synced
        source.cache = None  # what the app hands the poller once the watch stopped
        await poll()
        assert rec.gpu_fault is None and "node" not in rec.gpu_fault_errors
    finally:
        await runner.stop()
