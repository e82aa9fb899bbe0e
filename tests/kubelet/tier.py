"""The drills' handle on the cluster: apply what workloads.py makes, find pods and their containers,
reach a pod's ports from the host (through a forwarder whose connections start in the cluster's
namespace), read a shim, the node's Docker events, and keep each drill's figures for the report.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .cluster import Cluster
from .history import History, PodSeen
from .workloads import NAMESPACE, Workload, as_yaml, server_workload

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / ".cache" / "real-kubelet"


@dataclass
class Report:
    """`.cache/real-kubelet/report.json`: the cluster's timings, each drill's figures; rewritten as drills end."""

    path: Path
    facts: dict[str, Any] = field(default_factory=dict)
    drills: dict[str, dict[str, Any]] = field(default_factory=dict)

    def drill(self, name: str, record: Mapping[str, Any]) -> None:
        self.drills[name] = dict(record)
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"facts": self.facts, "drills": self.drills}, indent=1, default=str))


@dataclass
class Tier:
    cluster: Cluster
    image: str
    rendered: list[dict[str, Any]]
    history: History
    report: Report
    drain_token: str = field(default_factory=lambda: secrets.token_hex(16))
    webhook_token: str = field(default_factory=lambda: secrets.token_hex(16))

    # -- objects --------------------------------------------------------------------------------

    def apply(self, docs: Sequence[Mapping[str, Any]]) -> None:
        self.cluster.kubectl("apply", "-f", "-", stdin=as_yaml(docs))

    def deploy(self, workload: Workload) -> float:
        """Apply one workload's Deployment and shim ConfigMap; the wall time it was applied."""
        began = time.time()
        self.apply(server_workload(self.rendered, workload, self.image))
        return began

    def get(self, path: str) -> dict[str, Any]:
        with self.cluster.client() as client:
            answer = client.get(path)
            answer.raise_for_status()
            return answer.json()

    def pod(self, name: str) -> dict[str, Any]:
        return self.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")

    def events(self, involved: str | None = None, reason: str | None = None) -> list[dict[str, Any]]:
        items = self.get(f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
        items += self.get("/api/v1/namespaces/default/events")["items"]  # a Node's events live in `default`
        return [e for e in items if (involved is None or e["involvedObject"].get("name") == involved)
                and (reason is None or e.get("reason") == reason)]

    def wait_ready(self, workload: str, timeout: float, *, other_than: Sequence[str] = ()) -> PodSeen:
        """A live, Ready pod of the workload (not one of `other_than`), as soon as the watch sees it."""
        def ready() -> PodSeen | None:
            return next((p for p in self.history.live(workload) if p.ready and p.name not in other_than), None)
        return self.history.wait(ready, timeout, f"a Ready pod of {workload}")

    def first(self, workload: str, pod: str, condition, since: float = 0) -> float | None:
        """When the watch first saw `condition(pod_seen)` for `pod` (after `since`), or None."""
        return next((p.at for p in self.history.of_workload(workload) if p.name == pod and p.at >= since and condition(p)),
                    None)

    # -- containers and nodes ------------------------------------------------------------------------

    def container_id(self, pod: str, container: str) -> str:
        status = self.pod(pod)["status"]["containerStatuses"]
        return next(c["containerID"] for c in status if c["name"] == container).removeprefix("docker://")

    @staticmethod
    def node_index(node: str) -> int:
        return int(node.rsplit(".", 1)[1])

    def host_pid(self, node: str, container_id: str) -> int:
        """The container's first process, as this machine's PID (the drills ptrace it from here)."""
        out = self.cluster.docker(self.node_index(node), "inspect", "-f", "{{.State.Pid}}", container_id)
        return int(out.stdout.strip())

    def docker_events(self, node: str, container_id: str, since: float) -> list[dict[str, Any]]:
        """The node's Docker events for one container since `since` (kill carries the signal)."""
        out = self.cluster.docker(self.node_index(node), "events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}",
                                  "--filter", f"container={container_id}", "--format", "{{json .}}")
        return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]

    def logs(self, node: str, container_id: str) -> str:
        out = self.cluster.docker(self.node_index(node), "logs", container_id, check=False)
        return out.stdout + out.stderr

    # -- reaching pods from the host -------------------------------------------------------------------

    def url(self, node: str, port: int) -> str:
        """http://127.0.0.1:P on the host, forwarded to node:port inside the cluster's namespace."""
        return f"http://127.0.0.1:{self.cluster.forward(node, port)}"

    def shim(self, node: str, shim_port: int, timeout: float = 5) -> dict[str, Any] | None:
        """The shim's view of its server (GET /api/v1/targets/vllm), None while it does not answer."""
        try:
            answer = httpx.get(f"{self.url(node, shim_port)}/api/v1/targets/vllm", timeout=timeout, trust_env=False)
            return answer.json() if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def metric(self, base_url: str, name: str, timeout: float = 5,
               labels: Callable[[str], bool] = lambda _: True) -> float:
        """The sum of the samples of `name` on a /metrics page whose label text `labels` accepts (0 when absent)."""
        text = httpx.get(f"{base_url}/metrics", timeout=timeout, trust_env=False).text
        pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$")
        return sum(float(m.group(2)) for line in text.splitlines()
                   if (m := pattern.match(line)) and labels(m.group(1) or ""))


def restarts(seen: PodSeen | None) -> dict[str, int]:
    return dict(seen.restarts) if seen else {}


def since(t0: float, t: float | None) -> float | None:
    return None if t is None else round(t - t0, 1)
