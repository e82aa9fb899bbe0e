"""The whole chain on the kubelet tier, for the remediation drills (test_remediation.py) and the two
actors' drills (test_two_actors.py): one session-wide fleet, set up by the `fleet` fixture (conftest.py).

Prometheus and Alertmanager (Debian's, on this machine's loopback, outside the cluster) scrape the
fleet exporter, which discovers the pods through the API server with its own ServiceAccount and the
shipped RBAC, and the shims of the workloads that stay put (their liveness backstop's gauges);
the remediator runs in the cluster as its StatefulSet of 2 (its in-cluster service account, its
shared Lease, a journal each on a PersistentVolume). Alertmanager delivers every alert to both
replicas, as an HA pair of receivers does.

The workloads are deployed after the remediator: their shims ask a remediator replica's pod address
for their backstop's word (no cluster DNS here), so the whole chain is up, as on a real cluster.

The monitoring stack reaches into the cluster through forwarders (tests/kubelet/nsfwd.py): host
127.0.0.1 ports whose connections start in the cluster's namespace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import aiohttp
import httpx
from stack import RULES_FILE, RealStack, alertmanager_config, write_rules_with_short_for

from llm_vitals.demo.load import Load

from .history import PodSeen
from .tier import Tier
from .workloads import NAMESPACE, Workload, fleet_exporter, journal_volumes, remediator, simulator

# Drills 5 and 6 (test_remediation.py): one replica each.
REMEDIATION = [Workload(f"vllm-{x}", port, port + 1500, simulator(port), labels={"fleet": "yes"})
               for x, port in (("a", 8110), ("b", 8120), ("c", 8130))]
# The two actors' drills (test_two_actors.py): a Deployment of 2 hung at once (the fleet gate), and one
# replica hung while the remediator is paused, then stopped. Their pods stay put: Prometheus scrapes their shims.
STORM = Workload("vllm-storm", 8140, 9640, simulator(8140), replicas=2)
PAUSED = Workload("vllm-pause", 8150, 9650, simulator(8150))
WORKLOADS = [*REMEDIATION, STORM, PAUSED]
COOLDOWN_S = 30.0  # workloads.remediator's global_cooldown
EXPORTER_PORT = 9481  # the fleet exporter's (shipped: 9471, which the shims use)
REMEDIATOR_PORT = 9472
T = TypeVar("T")


class LoopThread:
    """An event loop in a thread of its own, for the monitoring stack's async API from sync drills."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="stack-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class Fleet:
    def __init__(self, tier: Tier, exporter_url: str, remediator_urls: list[str], stack: RealStack, loop: LoopThread,
                 workloads: dict[str, Workload]):
        self.tier, self.exporter_url, self.remediator_urls, self.stack, self.loop = tier, exporter_url, remediator_urls, stack, loop
        self.workloads = workloads  # by name, as deployed (their shims' remediator_url filled in)

    def targets(self) -> dict[str, dict[str, Any]]:
        answer = httpx.get(f"{self.exporter_url}/api/v1/targets", timeout=5, trust_env=False)
        return {t["name"]: t for t in answer.json()["targets"]}

    def target(self, pod: str) -> dict[str, Any] | None:
        try:
            return self.targets().get(f"{NAMESPACE}/{pod}")
        except (httpx.HTTPError, ValueError):
            return None

    def restarts_run(self) -> float:
        return sum(self.tier.metric(url, "llm_vitals_remediator_restarts_total") for url in self.remediator_urls)

    def decisions(self, reason: str, pods: Sequence[str]) -> float:
        """The gate's decisions for `reason` about these pods' targets, both replicas together (0 when a
        replica does not answer)."""
        targets = [f'target="{NAMESPACE}/{pod}"' for pod in pods]

        def about_them(labels: str) -> bool:
            return f'reason="{reason}"' in labels and any(t in labels for t in targets)

        total = 0.0
        for url in self.remediator_urls:
            try:
                total += self.tier.metric(url, "llm_vitals_remediator_decisions_total", labels=about_them)
            except httpx.HTTPError:
                continue
        return total

    def remediator(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A call to the first remediator replica with the act token (which grants reading too)."""
        return httpx.request(method, f"{self.remediator_urls[0]}{path}", timeout=10, trust_env=False,
                             headers={"Authorization": f"Bearer {self.tier.webhook_token}"}, **kwargs)

    def actions(self, workload: str) -> list[dict[str, Any]]:
        """The journal's rows about one workload, newest first."""
        answer = self.remediator("GET", "/api/v1/actions", params={"limit": "200"})
        answer.raise_for_status()
        return [row for row in answer.json()["actions"] if row.get("workload") == f"Deployment/{NAMESPACE}/{workload}"]

    def firing(self, alertname: str, *, pod: str | None = None, instances: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Prometheus's firing alerts of that name: about the fleet exporter's target `llm/<pod>`, or
        from the shims scraped at `instances` (host:port, as Prometheus names them)."""
        alerts = self.loop.run(self.stack.prometheus_alerts("firing"))
        return [a for a in alerts if a["labels"].get("alertname") == alertname
                and (pod is None or a["labels"].get("target") == f"{NAMESPACE}/{pod}")
                and (not instances or a["labels"].get("instance") in instances)]


def start(tier: Tier) -> Fleet:
    """The exporter, the remediator pair, then every workload (their shims asking a remediator replica),
    and the monitoring stack; each drill's workloads Ready."""
    began = time.time()
    tier.apply(fleet_exporter(tier.rendered, tier.image, EXPORTER_PORT))
    exporter_pod = tier.wait_ready("llm-vitals-exporter", 240)
    journals = [tier.cluster.run / f"journal-{i}" for i in range(2)]
    for d in journals:
        d.mkdir()
        os.chown(d, 10001, 10001)  # the image's uid; a provisioned volume would get it from fsGroup
    tier.apply(journal_volumes(journals))
    # No cluster DNS here: the remediator is told the exporter's pod address instead of its Service name.
    tier.apply(remediator(tier.rendered, tier.image, f"http://{exporter_pod.node}:{EXPORTER_PORT}"))
    replicas = wait_all_ready(tier, "llm-vitals-remediator", 2, 240)
    # ... and the shims a replica's pod address instead of the remediator's Service name.
    asked = f"http://{replicas[0].node}:{REMEDIATOR_PORT}"
    deployed = {w.name: dataclasses.replace(w, remediator_url=asked) for w in WORKLOADS}
    for w in deployed.values():
        tier.deploy(w)
    ready = {w.name: wait_all_ready(tier, w.name, w.replicas, 240) for w in deployed.values()}
    exporter_url = tier.url(exporter_pod.node, EXPORTER_PORT)
    remediator_urls = [tier.url(p.node, REMEDIATOR_PORT) for p in replicas]
    shims = [tier.url(p.node, w.shim_port).removeprefix("http://") for w in (STORM, PAUSED) for p in ready[w.name]]
    run = tier.cluster.run / "monitoring"
    run.mkdir()
    # The stuck alert's `for` (shipped 1 min) outlasts the fleet exporter's poll (5 s), so servers hung
    # at once are all stuck by the time the first one's alert reaches the gate: a storm, not one stuck
    # server and then a storm. 15 s keeps that here; every other rule fires after 2 s.
    rules = write_rules_with_short_for(RULES_FILE, run / "rules.yml", seconds=2, overrides={"LLMServerStuck": 15})
    am = alertmanager_config(f"{remediator_urls[0]}/webhook", tier.webhook_token, run, repeat_interval="10s")
    [receiver] = [r for r in am["receivers"] if r["name"] == "llm-vitals-remediator"]
    first = receiver["webhook_configs"][0]
    receiver["webhook_configs"] = [{**first, "url": f"{url}/webhook"} for url in remediator_urls]
    loop = LoopThread()
    stack = RealStack(run, scrape_targets={"llm-vitals": [exporter_url.removeprefix("http://")], "llm-vitals-shims": shims},
                      rule_files=[rules], alertmanager_config=am)
    loop.run(stack.__aenter__())
    tier.report.facts["fleet ready s"] = round(time.time() - began, 1)
    tier.report.facts["fleet"] = {"exporter": exporter_pod.node, "remediators": [p.node for p in replicas],
                                  "shims ask": asked}
    return Fleet(tier, exporter_url, remediator_urls, stack, loop, deployed)


def stop(fleet: Fleet) -> None:
    fleet.loop.run(fleet.stack.close())
    fleet.loop.close()


def wait_all_ready(tier: Tier, workload: str, replicas: int, timeout: float) -> list[PodSeen]:
    return tier.history.wait(lambda: (r := [p for p in tier.history.live(workload) if p.ready]) and len(r) == replicas and r,
                             timeout, f"{replicas} Ready pods of {workload}")


def wait_serving(fleet: Fleet, pod: str, timeout: float = 120) -> dict[str, Any]:
    return fleet.tier.history.wait(lambda: (t := fleet.target(pod)) and t["state"] in ("idle", "busy") and t,
                                   timeout, f"the exporter to judge llm/{pod} idle or busy")


def hang_under_load(fleet: Fleet, w: Workload, pods: Sequence[PodSeen], until: Callable[[], T]) -> tuple[float, T]:
    """Load each pod's server, hang every engine at once when the exporter reads them all busy (a hang
    stops admitting requests too: work must be in flight first); run `until()` with the load on."""
    servers = [fleet.tier.url(p.node, w.server_port) for p in pods]

    async def body() -> tuple[float, T]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            loads = [Load(session, server, workers=6, max_tokens=1500) for server in servers]
            for load in loads:
                load.start()
            try:
                await asyncio.to_thread(
                    fleet.tier.history.wait,
                    lambda: all((t := fleet.target(p.name)) and t["state"] == "busy" for p in pods),
                    60, f"the exporter to read {[p.name for p in pods]} busy", 0.5)
                for server in servers:
                    async with session.post(f"{server}/admin/fault", json={"fault": "hang"}) as answer:
                        assert answer.status == 200, await answer.text()
                wedged = time.time()
                return wedged, await asyncio.to_thread(until)
            finally:
                for load in loads:
                    await load.stop()

    return asyncio.run(body())


def after_last_restart(tier: Tier) -> None:
    """One restart or move at a time: the global cooldown after an earlier drill's restart refuses
    restarts and holds every workload's word (`cooldown`); let it pass."""
    if (last := tier.report.facts.get("last restart at")) is not None:
        time.sleep(max(0.0, last + COOLDOWN_S + 1 - time.time()))


def deleted(tier: Tier, workload: str, pod: str) -> float | None:
    return next((p.at for p in tier.history.of_workload(workload) if p.name == pod and (p.deleting or p.event == "DELETED")),
                None)


def live(tier: Tier, pod: PodSeen, w: Workload) -> tuple[int | None, dict[str, Any]]:
    """The shim's liveness answer to the kubelet's probe, and the backstop it reports there ({} when absent)."""
    try:
        answer = httpx.get(f"{tier.url(pod.node, w.shim_port)}/probe/vllm/live", timeout=5, trust_env=False)
        body = answer.json()
    except (httpx.HTTPError, ValueError):
        return None, {}
    return answer.status_code, body.get("backstop") or {}


def server_restarts(tier: Tier, workload: str, pod: str) -> int:
    """The most restarts of the pod's server container the watch ever saw."""
    return max((p.restarts.get("vllm", 0) for p in tier.history.of_workload(workload) if p.name == pod), default=0)
