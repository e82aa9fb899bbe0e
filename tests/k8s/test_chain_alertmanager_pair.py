"""The chain on real parts: a hung simulated pod, restarted exactly once through two clustered
Alertmanagers that each deliver to a different remediator replica.

    llm-vitals-sim x2 (a backend each)  <- load (this process)
        ^ polls, canaries                  the pods vllm-0, vllm-1: Pod objects on the real API server,
    llm-vitals-exporter  --- list+watch -->  podIP 127.0.0.1, their `http` port a simulated backend
        ^ scrape                   ^ GET /api/v1/targets (the re-check: namespace, pod, pod_uid)
    real Prometheus (the shipped rules, short `for:`) -> Alertmanager 1 <-gossip-> Alertmanager 2
                                                             | webhook           | webhook
                                                        replica-a           replica-b  (one Lease)
                                                             \\-> kube-apiserver: DELETE pod (name + UID)

Every part is the real one: the exporter discovers the pods through the API server with the
`llm-vitals-exporter` token and the Role of deploy/kubernetes/base/exporter.yaml. The test plays the
kubelet and the ReplicaSet: when the hung pod is deleted it creates the replacement Pod object on the
same backend and restarts that simulated backend, as a new container would start.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from conftest import require_binary
from e2e_chain import ChainTimings, Load, _start_cli, _start_sim
from stack import RULES_FILE, ManagedProcess, alertmanager_config, start_on_free_port, write_rules_with_short_for

from llm_vitals.demo.ports import free_port

from .control_plane import REPO, ControlPlane
from .replicas import TOKEN, grant_remediator_rbac, pod_removals, start_replicas, stop_chain

BACKENDS = 2
EXPORTER = "llm-vitals-exporter"
TIMINGS = ChainTimings()


async def start_alertmanager_pair(run_dir: Path, webhook_urls: list[str]) -> list[tuple[ManagedProcess, str]]:
    """Two Alertmanagers gossiping on loopback (`--cluster.peer`), each with its own receiver URL."""
    binary = require_binary("prometheus-alertmanager")
    cluster_ports = [free_port(), free_port()]
    started: list[tuple[ManagedProcess, str]] = []
    for i, url in enumerate(webhook_urls):
        config = alertmanager_config(url, TOKEN, run_dir, repeat_interval=TIMINGS.repeat_interval)
        config_path = run_dir / f"alertmanager-{i}.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        storage = run_dir / f"am-{i}-data"
        storage.mkdir(exist_ok=True)

        def build(port: int, i: int = i, config_path: Path = config_path, storage: Path = storage) -> tuple[list[str], str]:
            web_url = f"http://127.0.0.1:{port}"
            return [
                binary, f"--config.file={config_path}", f"--storage.path={storage}",
                f"--web.listen-address=127.0.0.1:{port}", f"--web.external-url={web_url}/",
                f"--cluster.listen-address=127.0.0.1:{cluster_ports[i]}",
                f"--cluster.peer=127.0.0.1:{cluster_ports[1 - i]}",
                # Test-sized gossip: the second peer waits peer-timeout for the first's notification log.
                "--cluster.gossip-interval=100ms", "--cluster.pushpull-interval=2s",
                "--cluster.peer-timeout=3s", "--cluster.settle-timeout=5s",
                "--log.level=debug",
            ], f"{web_url}/-/ready"

        process, port = await start_on_free_port(f"alertmanager-{i}", build, run_dir / f"alertmanager-{i}.log")
        started.append((process, f"http://127.0.0.1:{port}"))
    return started


async def start_prometheus(run_dir: Path, exporter: str, alertmanagers: list[str]) -> tuple[ManagedProcess, str]:
    binary = require_binary("prometheus")
    rules = write_rules_with_short_for(RULES_FILE, run_dir / "rules.yml", seconds=TIMINGS.rules_for,
                                       overrides=TIMINGS.rules_for_overrides)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "llm-vitals", "static_configs": [{"targets": [exporter]}]}],
        # As Prometheus is run with an HA Alertmanager pair: every alert to both.
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": alertmanagers}]}]},
    }
    config_path = run_dir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def build(port: int) -> tuple[list[str], str]:
        url = f"http://127.0.0.1:{port}"
        return [binary, f"--config.file={config_path}", f"--storage.tsdb.path={run_dir / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{port}", f"--web.external-url={url}/"], f"{url}/-/ready"

    process, port = await start_on_free_port("prometheus", build, run_dir / "prometheus.log")
    return process, f"http://127.0.0.1:{port}"


async def test_two_clustered_alertmanagers_delivering_to_two_replicas_restart_a_hung_pod_exactly_once(
        control_plane: ControlPlane, namespace: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "chain"
    run_dir.mkdir()
    processes: list[ManagedProcess] = []
    replicas = []
    load = None
    hung, replacement = f"{namespace}/vllm-0", f"{namespace}/vllm-0-b"  # discovery's target names
    http = httpx.AsyncClient(trust_env=False, timeout=10)
    grant_remediator_rbac(control_plane, namespace)
    exporter_role = next(d for d in yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "base" / "exporter.yaml").read_text())
                         if d and d["kind"] == "Role" and d["metadata"]["name"] == "llm-vitals-exporter-pods")
    control_plane.grant(namespace, EXPORTER, exporter_role["rules"], name="llm-vitals-exporter-pods")
    try:
        # One simulator process per pod: `llm-vitals-sim --backends N` needs N consecutive free ports,
        # which this tier's own traffic (hundreds of loopback connections) often took.
        fleets = []
        for i in range(BACKENDS):
            (run_dir / f"sim-{i}").mkdir()
            fleets.append(await _start_sim(run_dir / f"sim-{i}", http, 1, TIMINGS))
            processes.append(fleets[-1].process)
        ports = [int(f.backend_urls[0].rsplit(":", 1)[1]) for f in fleets]
        for i, port in enumerate(ports):
            control_plane.create_pod(namespace, f"vllm-{i}", labels={"app": "vllm"}, port=port)
            control_plane.play_kubelet(namespace, f"vllm-{i}")
        exporter, exporter_url = await _start_cli("exporter", run_dir, http, lambda port: {
            "listen": f"127.0.0.1:{port}", "poll_interval": TIMINGS.poll_interval,
            "metrics_timeout": TIMINGS.metrics_timeout, "log_level": "info",
            "discovery": [{"kubernetes": {
                "namespaces": [namespace], "selector": "app=vllm", "port": "http",
                "kubeconfig": str(control_plane.kubeconfig(EXPORTER)),
                "template": {"engine": "vllm", "stuck_after": TIMINGS.stuck_after, "startup_grace": 30,
                             "canary": {"interval": TIMINGS.canary_interval, "timeout": TIMINGS.canary_timeout}}}}],
        })
        processes.append(exporter)
        replicas = await start_replicas(control_plane, namespace, exporter_url, run_dir / "replicas",
                                        global_cooldown="8s", exporter_max_age=0.5)
        pair = await start_alertmanager_pair(run_dir, [f"{r.url}/webhook" for r in replicas])
        processes += [p for p, _ in pair]
        pair_urls = [u for _, u in pair]
        prometheus, _ = await start_prometheus(run_dir, exporter_url.removeprefix("http://"),
                                               [u.removeprefix("http://") for u in pair_urls])
        processes.append(prometheus)

        async def states() -> dict[str, str]:
            return {t["name"]: t["state"] for t in (await http.get(f"{exporter_url}/api/v1/targets")).json()["targets"]}

        await wait(lambda: _all(states, {f"{namespace}/vllm-0", f"{namespace}/vllm-1"}, {"idle", "busy"}), 60,
                   "both pods discovered, idle or busy")
        load = await Load(fleets[0].backend_urls[0], workers=2, max_tokens=200).start()
        await wait(lambda: _is(states, hung, "busy"), 30, "vllm-0 busy")
        await fleets[0].fault(0, "hang")
        await wait(lambda: _is(states, hung, "stuck"), 30, "vllm-0 stuck")

        # The hung pod is evicted once; play the kubelet and the ReplicaSet for its replacement.
        await wait(lambda: asyncio.sleep(0, pod_removals(control_plane, namespace, "vllm-0")), 90,
                   "the hung pod's deletion")
        deleted_at = time.time()
        control_plane.create_pod(namespace, "vllm-0-b", labels={"app": "vllm"}, port=ports[0])
        control_plane.play_kubelet(namespace, "vllm-0-b")
        await http.post(f"{fleets[0].control_url}/backends/0/restart")
        await wait(lambda: _is(states, replacement, "busy"), 60, "the replacement pod discovered and serving")
        assert hung not in await states()  # the deleted pod is no target any more

        async def resolved() -> bool:
            # send_resolved: the resolution reaching a replica closes the episode.
            rows = [row for r in replicas for row in await r.actions()]
            return any(row["target"] == hung and row["decision"] == "resolved" for row in rows)

        await wait(resolved, 60, "the resolved LLMServerStuck at a replica")
        # Alertmanager re-sends a firing alert every 2 s: give a late duplicate time to arrive.
        while time.time() < deleted_at + 10:
            await asyncio.sleep(0.5)

        assert pod_removals(control_plane, namespace) == [201]  # evicted (pod_action: evict, the default)
        assert [(await f.states())[0]["restarts"] for f in fleets] == [1, 0]
        restarts = [row for r in replicas for row in await r.restarts()]
        assert [(row["target"], row["result"]) for row in restarts] == [(hung, "ok")], restarts
        delivered = {r.name: [row["reason"] for row in await r.actions() if row["target"] == hung] for r in replicas}
        print(f"decisions per replica for {hung}: {delivered}")
        restart_events = [e for e in control_plane.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
                          if e["reason"] == "LLMVitalsRestart"]
        assert [e["involvedObject"]["name"] for e in restart_events] == ["vllm-0"]
        assert all(e["source"]["component"] == "llm-vitals-remediator" for e in restart_events)
        # This namespace only: other tests on this control plane delete pods named vllm-1 too.
        assert pod_removals(control_plane, namespace, "vllm-1") == []
    finally:
        await stop_chain(load, replicas, processes, http)


async def _all(states, names: set[str], wanted: set[str]) -> bool:
    now = await states()
    return set(now) == names and set(now.values()) <= wanted


async def _is(states, name: str, state: str) -> bool:
    return (await states()).get(name) == state


async def wait(predicate, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await predicate()
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            last = exc
        if last:
            return last
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last: {last!r}")

