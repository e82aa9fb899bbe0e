"""What the cluster did, as it happened: a watch of the namespace's pods and Endpoints, each change
kept with the time it was seen. Drills wait on it (state, not sleeps) and report from it: when a
pod turned Ready, each container's restart count, when a pod entered or left the Endpoints.

One thread per watch (plain httpx streaming, the API server's `?watch=1` JSON lines), resumed from
its last resourceVersion and relisted on a 410 Gone, stopped with `close()`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True)
class PodSeen:
    at: float
    event: str  # ADDED, MODIFIED, DELETED
    name: str
    uid: str
    node: str
    phase: str
    ready: bool
    deleting: bool
    restarts: dict[str, int]  # container -> restartCount
    started: dict[str, bool]


@dataclass(frozen=True)
class EndpointsSeen:
    at: float
    ready: frozenset[str]  # pod names in `addresses`
    not_ready: frozenset[str]  # pod names in `notReadyAddresses`


def pod_seen(event: str, pod: dict[str, Any], at: float) -> PodSeen:
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    containers = status.get("containerStatuses") or []
    return PodSeen(at, event, pod["metadata"]["name"], pod["metadata"]["uid"], pod["spec"].get("nodeName") or "",
                   status.get("phase", ""), ready, bool(pod["metadata"].get("deletionTimestamp")),
                   {c["name"]: c.get("restartCount", 0) for c in containers},
                   {c["name"]: bool(c.get("started")) for c in containers})


def endpoints_seen(endpoints: dict[str, Any] | None, at: float) -> EndpointsSeen:
    ready: set[str] = set()
    not_ready: set[str] = set()
    for subset in (endpoints or {}).get("subsets") or []:
        for key, into in (("addresses", ready), ("notReadyAddresses", not_ready)):
            for address in subset.get(key) or []:
                into.add((address.get("targetRef") or {}).get("name", address.get("ip", "?")))
    return EndpointsSeen(at, frozenset(ready), frozenset(not_ready))


@dataclass
class History:
    """Pods and one Service's Endpoints in `namespace`, watched from `client_factory()` clients."""

    client_factory: Callable[[], httpx.Client]
    namespace: str
    service: str
    pods: list[PodSeen] = field(default_factory=list)
    endpoints: list[EndpointsSeen] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    # Set when the run is being torn down (a failure, SIGTERM): every wait of a drill thread ends at once.
    cancelled: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> History:
        for name, path, keep in (
            ("pods", f"/api/v1/namespaces/{self.namespace}/pods", self._keep_pod),
            ("endpoints", f"/api/v1/namespaces/{self.namespace}/endpoints?fieldSelector=metadata.name%3D{self.service}",
             self._keep_endpoints),
        ):
            thread = threading.Thread(target=self._watch, args=(path, keep), name=f"watch-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def _keep_pod(self, event: str, obj: dict[str, Any]) -> None:
        seen = pod_seen(event, obj, time.time())
        with self._lock:
            self.pods.append(seen)

    def _keep_endpoints(self, event: str, obj: dict[str, Any]) -> None:
        seen = endpoints_seen(None if event == "DELETED" else obj, time.time())
        with self._lock:
            if not self.endpoints or (self.endpoints[-1].ready, self.endpoints[-1].not_ready) != (seen.ready, seen.not_ready):
                self.endpoints.append(seen)

    def _watch(self, path: str, keep: Callable[[str, dict[str, Any]], None]) -> None:
        version = ""
        separator = "&" if "?" in path else "?"
        while not self._stop.is_set():
            try:
                with self.client_factory() as client:
                    if not version:
                        listing = client.get(path)
                        listing.raise_for_status()
                        body = listing.json()
                        for item in body["items"]:
                            keep("ADDED", item)
                        version = body["metadata"]["resourceVersion"]
                    url = f"{path}{separator}watch=1&resourceVersion={version}&timeoutSeconds=30&allowWatchBookmarks=true"
                    with client.stream("GET", url, timeout=httpx.Timeout(60, read=45)) as stream:
                        for line in stream.iter_lines():
                            if self._stop.is_set():
                                return
                            if not line:
                                continue
                            event = json.loads(line)
                            obj = event["object"]
                            if event["type"] == "ERROR":
                                version = ""  # 410 Gone (or worse): list again
                                break
                            version = obj["metadata"]["resourceVersion"]
                            if event["type"] != "BOOKMARK":
                                keep(event["type"], obj)
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                self.errors.append(f"{time.strftime('%H:%M:%S')} {path}: {exc!r}")
                self._stop.wait(1)

    # -- reading ---------------------------------------------------------------------------------

    def of_workload(self, prefix: str) -> list[PodSeen]:
        with self._lock:
            return [p for p in self.pods if p.name.startswith(prefix + "-")]

    def latest(self, prefix: str) -> dict[str, PodSeen]:
        """The last seen state of each pod of a workload (by pod name), deleted ones included."""
        last: dict[str, PodSeen] = {}
        for seen in self.of_workload(prefix):
            last[seen.name] = seen
        return last

    def live(self, prefix: str) -> list[PodSeen]:
        """The workload's pods that exist and are not being deleted, as last seen."""
        return [p for p in self.latest(prefix).values() if p.event != "DELETED" and not p.deleting]

    def endpoints_of(self, pod: str) -> list[tuple[float, str]]:
        """(time, "ready" | "not ready" | "absent") each time `pod`'s place in the Endpoints changed."""
        changes: list[tuple[float, str]] = []
        with self._lock:
            seen = list(self.endpoints)
        for e in seen:
            where = "ready" if pod in e.ready else "not ready" if pod in e.not_ready else "absent"
            if not changes or changes[-1][1] != where:
                changes.append((e.at, where))
        return changes

    def cancel(self) -> None:
        """End every wait now (they raise), so drill threads let a failed or interrupted run tear down."""
        self.cancelled.set()

    def pause(self, seconds: float) -> None:
        """Sleep, unless the run is cancelled (then raise)."""
        if self.cancelled.wait(seconds):
            raise AssertionError("cancelled: the run is being torn down")

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
        """The first truthy value of `predicate()` (over what was seen so far), or AssertionError."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            self.pause(interval)
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last: {last!r}; "
                             f"watch errors: {self.errors[-3:]}")
