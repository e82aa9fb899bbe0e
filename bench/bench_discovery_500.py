"""500 discovered pods: how long until all are targets, and what it costs the exporter (CPU, RSS).

A real control plane (etcd + kube-apiserver 1.20.2, tests/k8s/control_plane.py, built by
`tools/real-k8s-setup.sh`), a few simulated vLLM backends (`llm-vitals-sim --backends N`), and the
real exporter CLI in a child process discovering pods by label with the `llm-vitals-exporter`
token and the Role of deploy/kubernetes/base/exporter.yaml. The bench creates `--pods` pod objects over
a few seconds (each then reported Running on 127.0.0.1, its `http` port one of the backends'), as a
kubelet would: two API writes per pod. It reports the time from the last write until every pod is
a target (the exporter's /healthz count), the exporter's CPU seconds over the whole burst, and its
RSS before and after. Without the control plane's binaries it prints one SKIPPED line and exits 0.

    .venv/bin/python bench/bench_discovery_500.py [--pods 500] [--backends 4] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from k8s.control_plane import ControlPlane, missing  # noqa: E402

from llm_vitals.demo.ports import free_port  # noqa: E402

SELECTOR = {"app": "vllm"}


def pod_rules() -> list[dict]:
    for doc in yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "base" / "exporter.yaml").read_text()):
        if doc and doc["kind"] == "Role" and doc["metadata"]["name"] == "llm-vitals-exporter-pods":
            return doc["rules"]
    raise SystemExit("no Role llm-vitals-exporter-pods in deploy/kubernetes/base/exporter.yaml")


async def create_pods(cp: ControlPlane, namespace: str, pods: int, ports: list[int], concurrency: int) -> float:
    """Create and 'kubelet' every pod; the monotonic time the last write returned."""
    gate = asyncio.Semaphore(concurrency)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    async with cp.async_client("admin") as api:
        async def one(i: int) -> None:
            name = f"vllm-{i:03d}"
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": SELECTOR},
                   "spec": {"nodeName": f"node-{i % 8}", "containers": [{
                       "name": "server", "image": "none", "ports": [{"name": "http", "containerPort": ports[i % len(ports)]}]}]}}
            async with gate:
                (await api.post(f"/api/v1/namespaces/{namespace}/pods", json=pod)).raise_for_status()
                status = {"status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                                     "startTime": now}}
                (await api.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status", json=status,
                                 headers={"Content-Type": "application/merge-patch+json"})).raise_for_status()
        await asyncio.gather(*(one(i) for i in range(pods)))
    return time.monotonic()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--backends", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    why = missing()
    if why is not None:
        print(f"SKIPPED: bench_discovery_500: {why}")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-discovery-") as tmp, ControlPlane(Path(tmp) / "k8s") as cp:
        namespace = cp.new_namespace("bench")
        cp.grant(namespace, "llm-vitals-exporter", pod_rules(), name="llm-vitals-exporter-pods")
        base = free_port()
        while not all(_free(base + i) for i in range(args.backends + 1)):
            base = free_port()
        sim = subprocess.Popen([str(REPO / ".venv" / "bin" / "llm-vitals-sim"), "--port", str(base), "--backends",
                                str(args.backends), "--no-control", "--log-level", "warning"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port = free_port()
        config = Path(tmp) / "exporter.yaml"
        config.write_text(yaml.safe_dump({
            "listen": f"127.0.0.1:{port}", "poll_interval": "5s", "log_level": "warning",
            "discovery": [{"kubernetes": {"namespaces": [namespace], "selector": "app=vllm", "port": "http",
                                          "kubeconfig": str(cp.kubeconfig("llm-vitals-exporter")),
                                          "template": {"engine": "vllm"}}}]}))
        exporter = subprocess.Popen([str(REPO / ".venv" / "bin" / "llm-vitals-exporter"), "--config", str(config)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(f"{url}/healthz", timeout=2)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline or exporter.poll() is not None:
                        raise SystemExit("the exporter did not start") from None
                    time.sleep(0.1)
            proc = psutil.Process(exporter.pid)
            time.sleep(2)  # its first list (empty) done
            rss_before = proc.memory_info().rss
            cpu_before = sum(proc.cpu_times()[:2])
            started = time.monotonic()
            last_write = asyncio.run(create_pods(cp, namespace, args.pods, [base + i for i in range(args.backends)],
                                                 args.concurrency))
            while True:
                count = httpx.get(f"{url}/healthz", timeout=5).json()["targets"]
                if count == args.pods:
                    all_in = time.monotonic()
                    break
                if time.monotonic() - last_write > 120:
                    raise SystemExit(f"only {count} of {args.pods} targets 120 s after the last write")
                time.sleep(0.01)
            cpu_burst = sum(proc.cpu_times()[:2]) - cpu_before
            time.sleep(10)  # two poll intervals of 500 targets
            rss_after = proc.memory_info().rss
            cpu_total = sum(proc.cpu_times()[:2]) - cpu_before
            print(f"pods: {args.pods} created and reported Running over {last_write - started:.1f} s "
                  f"({2 * args.pods} API writes, concurrency {args.concurrency}); {args.backends} simulated backends")
            print(f"all {args.pods} are targets {all_in - last_write:.2f} s after the last write")
            print(f"exporter CPU: {cpu_burst:.1f} s during the burst; {cpu_total:.1f} s including 10 s of polling all")
            print(f"exporter RSS: {rss_before / 2**20:.0f} MiB before, {rss_after / 2**20:.0f} MiB after")
        finally:
            for child in (exporter, sim):
                child.terminate()
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
    return 0


def _free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())
