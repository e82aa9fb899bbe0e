"""Remediator replicas (real `llm-vitals-remediator` processes) sharing one Lease on the real API server.

    exporter = await ExporterStandIn().start()            # GET /api/v1/targets, TargetView JSON
    exporter.put_pod(namespace, pod_object, state="stuck")  # the target <namespace>/<pod>
    grant_remediator_rbac(control_plane, namespace)         # the Role/ClusterRole of deploy/kubernetes/base/remediator.yaml
    a, b = await start_replicas(control_plane, namespace, exporter.url, tmp_path, global_cooldown=600)
    answer = await a.webhook(alert(target, fingerprint="f1"))
    await a.stop(); await b.kill()                           # SIGTERM / SIGKILL, by PID

The exporter stand-in: the remediator's re-check is answered by a small real aiohttp server whose
targets are `llm_vitals.targets.TargetView` objects carrying what pod discovery reports (namespace,
pod, pod_uid, node), so that a test can set exactly the view it needs at the moment it needs it: a
stale pod UID, a GPU fault, three pods stuck at once, a fleet healed at once. Everything else is
real: the remediator processes, their SQLite journals, the kube-apiserver, etcd, RBAC and the Lease.
The whole chain with the real exporter discovering the pods is test_chain_alertmanager_pair.py.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from aiohttp import web

from llm_vitals.remediator.store.lease import STATE_ANNOTATION
from llm_vitals.targets import TargetView

from .control_plane import REPO, ControlPlane, log_tail

TOKEN = "k8s-tier-webhook-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LEASE = "llm-vitals-remediator"  # the name the manifest's Role grants get/update on
USER = "llm-vitals-remediator"
MANIFEST = REPO / "deploy" / "kubernetes" / "base" / "remediator.yaml"
# Every alert of a run began at this moment unless told otherwise: a redelivery of one alert is the
# same (fingerprint, startsAt), as Alertmanager sends it. The simulated servers started an hour earlier.
ALERTS_BEGAN = time.time() - 60


def target_name(namespace: str, pod: str) -> str:
    return f"{namespace}/{pod}"


def target_view(namespace: str, pod: dict[str, Any], state: str = "stuck", **over: Any) -> dict[str, Any]:
    """The exporter's TARGET for a discovered pod, as TargetView JSON (its process started an hour ago)."""
    now = time.time()
    meta = pod["metadata"]
    fields: dict[str, Any] = {
        "name": target_name(namespace, meta["name"]), "engine": "vllm", "role": "backend",
        "url": "http://127.0.0.1:8000", "state": state,
        "reason": "no_progress" if state == "stuck" else "idle", "detail": "",
        "since": now - 120, "stuck_seconds": 90.0 if state == "stuck" else 0.0,
        "process_start_time": ALERTS_BEGAN - 3600, "last_poll": now, "up": True, "ready": state == "idle",
        "recently_unhealthy": state in ("stuck", "unresponsive", "down"),
        "namespace": namespace, "pod": meta["name"], "pod_uid": meta["uid"],
        "node": (pod.get("spec") or {}).get("nodeName"),
    }
    fields.update(over)
    return TargetView(**fields).model_dump(mode="json")


class ExporterStandIn:
    """A real HTTP server answering the exporter's `GET /api/v1/targets` with whatever `targets` holds."""

    def __init__(self) -> None:
        self.targets: dict[str, dict[str, Any]] = {}
        self.reads = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    def put_pod(self, namespace: str, pod: dict[str, Any], state: str = "stuck", **over: Any) -> str:
        view = target_view(namespace, pod, state, **over)
        self.targets[view["name"]] = view
        return view["name"]

    def set_state(self, name: str, state: str) -> None:
        view = dict(self.targets[name], state=state, recently_unhealthy=state in ("stuck", "unresponsive", "down"),
                    reason="no_progress" if state == "stuck" else "idle", last_poll=time.time())
        self.targets[name] = TargetView(**view).model_dump(mode="json")

    async def _answer(self, request: web.Request) -> web.Response:
        self.reads += 1
        return web.json_response({"targets": list(self.targets.values()), "generated_at": time.time()})

    async def start(self) -> ExporterStandIn:
        app = web.Application()
        app.router.add_get("/api/v1/targets", self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def alert(target: str, fingerprint: str, starts_at: float | None = None, alertname: str = "LLMServerStuck") -> dict[str, Any]:
    """An Alertmanager v4 webhook payload with one firing alert for `target`."""
    started = datetime.fromtimestamp(starts_at if starts_at is not None else ALERTS_BEGAN, UTC)
    labels = {"alertname": alertname, "target": target, "remediation": "restart", "severity": "critical"}
    return {
        "version": "4", "status": "firing", "receiver": "llm-vitals-remediator", "groupKey": f"{{}}:{fingerprint}",
        "groupLabels": {"alertname": alertname}, "commonLabels": labels, "commonAnnotations": {},
        "externalURL": "http://alertmanager.test", "truncatedAlerts": 0,
        "alerts": [{"status": "firing", "labels": labels, "annotations": {},
                    "startsAt": started.isoformat().replace("+00:00", "Z"), "endsAt": "0001-01-01T00:00:00Z",
                    "generatorURL": "", "fingerprint": fingerprint}],
    }


def grant_remediator_rbac(control_plane: ControlPlane, namespace: str) -> None:
    """Give the remediator's user exactly the shipped manifest's Role (in `namespace`) and ClusterRole."""
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    role = next(d for d in docs if d["kind"] == "Role")
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    control_plane.grant(namespace, USER, role["rules"], name="llm-vitals-remediator")
    control_plane.grant(None, USER, cluster_role["rules"], name="llm-vitals-remediator")


class Replica:
    """One remediator process with its own journal; its identity names it in the Lease and in Events."""

    def __init__(self, name: str, config: dict[str, Any], run_dir: Path, clock_skew: float = 0.0):
        self.name = name
        self.config = config
        self.run_dir = run_dir
        # Seconds this replica's clock is off, through create_app's clock seam (tests/k8s/skewed_remediator.py).
        self.clock_skew = clock_skew
        self.log_path = run_dir / f"remediator-{name}.log"
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""

    async def start(self, timeout: float = 60.0, attempts: int = 3) -> Replica:
        """Start on a free port; again on another when something took that port first (it was free
        when chosen, and this tier's own loopback traffic takes hundreds of ephemeral ports)."""
        from llm_vitals.demo.ports import free_port

        for attempt in range(1, attempts + 1):
            log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                return await self._start_on(free_port(), timeout)
            except RuntimeError:
                if attempt == attempts or b"address already in use" not in self.log_path.read_bytes()[log_start:]:
                    raise
                await self.kill()  # it has exited; never leave one behind
        raise AssertionError("unreachable")

    async def _start_on(self, port: int, timeout: float) -> Replica:
        self.config = {**self.config, "listen": f"127.0.0.1:{port}"}
        path = self.run_dir / f"remediator-{self.name}.yaml"
        path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        argv = ["-m", "llm_vitals.remediator", "--config", str(path), "--log-level", "debug"]
        if self.clock_skew:
            argv = [str(Path(__file__).with_name("skewed_remediator.py")), str(path), str(self.clock_skew)]
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, *argv,
                cwd=REPO, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(trust_env=False, timeout=2) as client:
            while True:
                if self.proc.returncode is not None:
                    raise RuntimeError(f"remediator {self.name} exited with {self.proc.returncode}\n{self.tail()}")
                try:
                    if (await client.get(f"{self.url}/healthz")).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"remediator {self.name} not up after {timeout:g}s\n{self.tail()}")
                await asyncio.sleep(0.1)

    def tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, f"remediator {self.name}", lines)

    async def kill(self) -> None:
        """SIGKILL: no shutdown, no release of its claim in the Lease."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                await self.kill()

    async def webhook(self, payload: dict[str, Any], client: httpx.AsyncClient | None = None) -> httpx.Response:
        if client is not None:
            return await client.post(f"{self.url}/webhook", json=payload, headers=AUTH)
        async with httpx.AsyncClient(trust_env=False, timeout=60) as own:
            return await own.post(f"{self.url}/webhook", json=payload, headers=AUTH)

    async def get(self, path: str) -> Any:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            response = await client.get(f"{self.url}{path}", headers=AUTH)
            response.raise_for_status()
            return response.json()

    async def text(self, path: str) -> str:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            response = await client.get(f"{self.url}{path}")
            response.raise_for_status()
            return response.text

    async def actions(self) -> list[dict[str, Any]]:
        """This replica's journal, oldest first."""
        return list(reversed((await self.get("/api/v1/actions?limit=1000"))["actions"]))

    async def restarts(self) -> list[dict[str, Any]]:
        return [a for a in await self.actions() if a["decision"] == "restart"]


def replica_config(control_plane: ControlPlane, namespace: str, exporter_url: str, run_dir: Path, name: str,
                   kubeconfig: Path | None = None, **over: Any) -> dict[str, Any]:
    """A replica's config: the Lease in `namespace`, templates taking every target in `namespace`."""
    token_file = run_dir / "webhook-token"
    token_file.write_text(TOKEN + "\n")
    template: dict[str, Any] = {"match": {"namespace": namespace}, "executor": "kubernetes", "timeout": "10s"}
    template.update(over.pop("template", {}))
    config: dict[str, Any] = {
        "exporter_url": exporter_url,
        "exporter_max_age": 0.2,
        "auth": {"bearer_token_file": str(token_file)},
        "state_path": str(run_dir / f"journal-{name}.db"),
        "global_cooldown": "10m",
        "budget": {"max_restarts": 3, "window": "1h"},
        "max_unhealthy": 2,
        "kubernetes": {"kubeconfig": str(kubeconfig or control_plane.kubeconfig(USER)), "identity": name,
                       "lease": {"namespace": namespace, "name": LEASE}},
        "target_templates": [template],
        # These drills judge what webhooks decide, one alert at a time; the remediator's own look
        # (issue 39: held targets decided again, the kubelet's restarts counted) is judged in-process
        # (tests/test_remediator_holds.py) and on the kubelet tier. A drill may turn it on.
        "redecide_interval": "0s",
    }
    config.update(over)
    return config


async def start_replicas(control_plane: ControlPlane, namespace: str, exporter_url: str, run_dir: Path,
                         names: tuple[str, ...] = ("replica-a", "replica-b"), kubeconfig: Path | None = None,
                         clock_skews: dict[str, float] | None = None, **over: Any) -> list[Replica]:
    run_dir.mkdir(parents=True, exist_ok=True)
    replicas = [Replica(n, replica_config(control_plane, namespace, exporter_url, run_dir, n, kubeconfig, **dict(over)),
                        run_dir, (clock_skews or {}).get(n, 0.0))
                for n in names]
    started = await asyncio.gather(*(r.start() for r in replicas), return_exceptions=True)
    failed = [r for r in started if isinstance(r, BaseException)]
    if failed:
        # The caller never gets the ones that did start: stop them here, or they outlive the test.
        await asyncio.gather(*(r.stop() for r in replicas))
        raise failed[0]
    return replicas


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    """The `controller: true` ownerReference naming `owner` (an object as the API server returned it)."""
    meta = owner["metadata"]
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"], "uid": meta["uid"],
            "controller": True}


def deployment_replica_set(control_plane: ControlPlane, namespace: str, deployment: str) -> dict[str, Any]:
    """A Deployment and a ReplicaSet it owns, both of 0 replicas: the owners of pods a test makes itself
    (`control_plane.create_pod(..., owners=[owner_reference(rs)])`) without a controller-manager. The
    remediator's identity check reads that ReplicaSet and counts the pods as `Deployment/<ns>/<deployment>`."""
    labels = {"app": deployment}
    template = {"metadata": {"labels": labels},
                "spec": {"containers": [{"name": "server", "image": "llm-vitals-test/none"}]}}
    owner = control_plane.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": deployment},
        "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": template}})
    owner = {**owner, "apiVersion": "apps/v1", "kind": "Deployment"}
    replica_set = control_plane.request("POST", f"/apis/apps/v1/namespaces/{namespace}/replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": f"{deployment}-5d8f7", "ownerReferences": [owner_reference(owner)]},
        "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": template}})
    return {**replica_set, "apiVersion": "apps/v1", "kind": "ReplicaSet"}


def lease(control_plane: ControlPlane, namespace: str) -> dict[str, Any]:
    return control_plane.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}")


def shared_state(control_plane: ControlPlane, namespace: str) -> dict[str, Any]:
    """The remediator's shared state, as the replicas wrote it into the Lease's annotation."""
    return json.loads(lease(control_plane, namespace)["metadata"]["annotations"][STATE_ANNOTATION])


def reasons(answers: list[httpx.Response]) -> list[str]:
    """The first decision's reason of each webhook answer."""
    return [a.json()["decisions"][0]["reason"] for a in answers]


async def finished_restarts(replicas: list[Replica]) -> list[dict[str, Any]]:
    """Every replica's restart rows once none is pending any more (else [])."""
    rows = [row for r in replicas for row in await r.restarts()]
    return [] if any(row["result"] == "pending" for row in rows) else rows


def events(control_plane: ControlPlane, namespace: str, reason: str | None = None) -> list[dict[str, Any]]:
    items = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
    return [e for e in items if reason is None or e["reason"] == reason]


def pod_deletes(control_plane: ControlPlane, namespace: str, name: str | None = None) -> list[int]:
    """The HTTP codes of every pod DELETE the remediator sent in `namespace` (from the audit log)."""
    return [e["responseStatus"]["code"]
            for e in control_plane.audit(verb="delete", resource="pods", namespace=namespace, user=USER, name=name)]


def pod_evictions(control_plane: ControlPlane, namespace: str, name: str | None = None) -> list[int]:
    """The HTTP codes of every pod eviction (POST pods/{name}/eviction) the remediator sent in `namespace`:
    201 evicted, 429 refused by a PodDisruptionBudget, 409 the UID precondition failed, 404 gone."""
    return [e["responseStatus"]["code"]
            for e in control_plane.audit(verb="create", resource="pods", namespace=namespace, user=USER, name=name)
            if e["objectRef"].get("subresource") == "eviction"]


def pod_removals(control_plane: ControlPlane, namespace: str, name: str | None = None) -> list[int]:
    """Every eviction and delete of a pod the remediator sent in `namespace`, in the order sent (their codes)."""
    events = [e for e in control_plane.audit(resource="pods", namespace=namespace, user=USER, name=name)
              if e["verb"] == "delete" or (e["verb"] == "create" and e["objectRef"].get("subresource") == "eviction")]
    return [e["responseStatus"]["code"] for e in sorted(events, key=lambda e: e["requestReceivedTimestamp"])]


def refused_to_remediator(control_plane: ControlPlane, namespace: str, since: float) -> list[tuple[str, Any]]:
    """(verb, objectRef) of every 403 the API server gave the remediator's user in `namespace`, in
    `default` or cluster-wide, received at or after `since` and not while it was coming back from a
    stop (its RBAC refuses everyone until it has synced). The audit log is the worker's whole
    session: `since` leaves out the other tests' deliberate 403s (test_gpu_fault_node.py runs an
    exporter as this user to show a refused node list, cluster-wide)."""
    refused = []
    for e in control_plane.audit(user=USER):
        received = datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        if (e["responseStatus"]["code"] == 403 and e["objectRef"].get("namespace") in (namespace, "default", None)
                and received >= since and not control_plane.during_outage(e)):
            refused.append((e["verb"], e["objectRef"]))
    return refused


def rights_used(control_plane: ControlPlane, namespaces: tuple[str | None, ...]) -> set[tuple[str, str]]:
    """(verb, resource[/subresource]) of every request the remediator made in `namespaces` (the audit log)."""
    used = set()
    for e in control_plane.audit(user=USER):
        ref = e.get("objectRef") or {}
        if ref.get("namespace") in namespaces and ref.get("resource"):
            used.add((e["verb"], ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")))
    return used


class SlowLink:
    """A TCP relay to the API server that holds each chunk a client sends for `delay` seconds (TLS
    passes through untouched): it widens the gap between a replica's Lease read and its write, so
    that another writer lands in between and the write meets a real 409."""

    def __init__(self, control_plane: ControlPlane, delay: float):
        self.upstream_port = int(control_plane.url.rsplit(":", 1)[1])
        self.delay = delay
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> SlowLink:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def kubeconfig(self, control_plane: ControlPlane, user: str, path: Path) -> Path:
        """A copy of `user`'s kubeconfig whose server is this relay (the certificate names 127.0.0.1 too)."""
        doc = json.loads(control_plane.kubeconfig(user).read_text())
        doc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        path.write_text(json.dumps(doc))
        return path

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(self._pipe(reader, up_writer, self.delay), self._pipe(up_reader, writer, 0.0))
        finally:
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, delay: float) -> None:
        try:
            while data := await source.read(65536):
                if delay:
                    await asyncio.sleep(delay)
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            sink.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def stop_chain(load: Any, replicas: list[Replica], processes: list[Any], http: httpx.AsyncClient) -> None:
    """A chain test's teardown: its load, then the remediator replicas and the other processes (last
    started first), each printing the tail of its log for the test's report, then its HTTP client."""
    if load is not None:
        await load.stop()
    for replica in replicas:
        await replica.stop()
        print(replica.tail(40))
    for process in reversed(processes):
        await process.stop()
        print(process.log_tail(20))
    await http.aclose()
