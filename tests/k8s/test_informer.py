"""The one informer (llm_vitals.kube.informer) on the real API server, case by case.

Each case runs a real Informer on pods of a fresh namespace, with a watch timeout of a few seconds
and a backoff draw of 0 (so each wait is exactly 0.8, 1.6, 3.2 ... s), disturbs it the way the API
server really does, and checks what the informer did: which requests the API server's audit log
saw, the waits it took (recorded by its injected sleep) and the health it reported.

    resume      the server ends each watch: it is resumed from the last resourceVersion, never relisted
    gone        an API server restart after a write: the resumed watch gets 410 Gone (its watch cache
                begins later), and the informer relists after the relist backoff
    bookmark    a quiet watch gets BOOKMARK events (1.20 sends one two seconds before a watch ends):
                the next watch resumes from the bookmark's resourceVersion
    forbidden   without the right, 403: reported in the health with backoffs that grow, never a crash;
                granted, it lists
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from waits import wait_until

from llm_vitals.config import KubeAccess
from llm_vitals.kube.client import KubeClient
from llm_vitals.kube.errors import ApiError
from llm_vitals.kube.informer import Health, Informer
from llm_vitals.kube.objects import Query

from .control_plane import ControlPlane

EXPORTER = "llm-vitals-exporter"
READ_PODS = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]


@dataclass
class Run:
    """An informer under test and what it did."""

    cp: ControlPlane
    namespace: str
    informer: Informer[dict[str, Any]]
    waits: list[float]
    healths: list[Health]
    task: asyncio.Task[None]

    def watches(self, user: str = EXPORTER) -> list[str]:
        """The resourceVersion of each watch the API server began for this namespace, in order."""
        found = []
        for event in self.cp.audit(verb="watch", resource="pods", namespace=self.namespace, user=user,
                                   stage="ResponseStarted"):
            query = parse_qs(urlsplit(event["requestURI"]).query)
            found.append(query.get("resourceVersion", [""])[0])
        return found

    def lists(self, user: str = EXPORTER) -> int:
        return len(self.cp.audit(verb="list", resource="pods", namespace=self.namespace, user=user))


async def pod(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    return await asyncio.to_thread(cp.create_pod, namespace, name, labels={"app": "vllm"})


async def resume(run: Run) -> dict[str, Any]:
    await pod(run.cp, run.namespace, "a")
    await wait_until(_async(lambda: "a" in run.informer.objects), 10, "pod a seen")
    await wait_until(_async(lambda: len(run.watches()) >= 3), 20, "two watches ended by the server and resumed")
    await pod(run.cp, run.namespace, "b")
    await wait_until(_async(lambda: "b" in run.informer.objects), 10, "pod b seen")
    versions = [int(v) for v in run.watches()]
    return {"lists": run.lists(), "watches from a version, never older": versions == sorted(versions) and versions[0] > 0,
            "relists": run.informer.relists, "whys": {s.why for s in run.informer.steps}, "objects": set(run.informer.objects)}


async def gone(run: Run) -> dict[str, Any]:
    await pod(run.cp, run.namespace, "a")
    await wait_until(_async(lambda: "a" in run.informer.objects), 10, "pod a seen")
    # A write the informer does not see (a ConfigMap): the API server's next watch cache begins after it.
    await asyncio.to_thread(run.cp.request, "POST", f"/api/v1/namespaces/{run.namespace}/configmaps",
                            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bump"}})
    run.cp.stop_apiserver()
    await wait_until(_async(lambda: not run.informer.health.up), 30, "the outage reported")
    # In this thread (PR_SET_PDEATHSIG, see test_pod_discovery.py); it blocks the loop for the start.
    run.cp.start_apiserver()
    await wait_until(_async(lambda: run.informer.relists == 1 and run.informer.health.up), 60, "the relist after 410")
    gone_steps = [s for s in run.informer.steps if s.why == "gone"]
    return {"lists": run.lists(), "relists": run.informer.relists, "objects": set(run.informer.objects),
            "gone waits": [s.wait for s in gone_steps], "the 410 is no failure": not any(s.failure for s in gone_steps),
            "slept the gone wait": 0.8 in run.waits}


async def bookmark(run: Run) -> dict[str, Any]:
    listed = int(run.informer.resource_version or 0)
    # A pod in another namespace moves the API server's pod cache on; this watch sees only its bookmark.
    elsewhere = await asyncio.to_thread(run.cp.new_namespace, "elsewhere")
    other = await pod(run.cp, elsewhere, "x")
    await wait_until(_async(lambda: run.informer.bookmarks >= 1), 20, "a bookmark")
    await wait_until(_async(lambda: len(run.watches()) >= 2), 20, "the next watch")
    bookmarked = int(other["metadata"]["resourceVersion"])
    return {"lists": run.lists(), "relists": run.informer.relists, "objects": set(run.informer.objects),
            "version moved past the list": int(run.informer.resource_version or 0) >= bookmarked > listed,
            "next watch from the bookmark": int(run.watches()[1]) >= bookmarked}


async def forbidden(run: Run) -> dict[str, Any]:
    await pod(run.cp, run.namespace, "a")
    await wait_until(_async(lambda: len(run.waits) >= 3), 20, "three retries")
    health = run.informer.health
    refused = isinstance(health.error, ApiError) and health.error.status == 403 and not health.up
    waits_before_grant = run.waits[:3]
    running = not run.task.done()
    await asyncio.to_thread(run.cp.grant, run.namespace, EXPORTER, READ_PODS, name="informer-pods")
    await wait_until(_async(lambda: run.informer.health.up), 30, "the list once granted")
    return {"403 in the health, then up": refused and run.healths[-1].up, "still running": running,
            "waits": waits_before_grant, "objects": set(run.informer.objects), "relists": run.informer.relists}


def _async(predicate: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
    async def check() -> Any:
        return predicate()
    return check


CASES = [
    pytest.param(resume, 3, True, {"lists": 1, "watches from a version, never older": True, "relists": 0,
                                   "whys": {"resume"}, "objects": {"a", "b"}}, id="resume"),
    pytest.param(gone, 300, True, {"lists": 2, "relists": 1, "objects": {"a"}, "gone waits": [0.8],
                                   "the 410 is no failure": True, "slept the gone wait": True}, id="gone"),
    pytest.param(bookmark, 5, True, {"lists": 1, "relists": 0, "objects": set(), "version moved past the list": True,
                                     "next watch from the bookmark": True}, id="bookmark"),
    # 0.8, 1.6, 3.2: each failed list doubles the wait (draw 0); the first list after the grant is a relist.
    pytest.param(forbidden, 300, False, {"403 in the health, then up": True, "still running": True,
                                         "waits": [0.8, 1.6, 3.2], "objects": {"a"}, "relists": 0}, id="forbidden"),
]


@pytest.mark.parametrize(("scenario", "watch_seconds", "granted", "expected"), CASES)
async def test_the_informer_on_the_real_api_server(control_plane: ControlPlane, namespace: str, scenario, watch_seconds,
                                                   granted, expected) -> None:
    if granted:
        await asyncio.to_thread(control_plane.grant, namespace, EXPORTER, READ_PODS, name="informer-pods")
    waits: list[float] = []
    healths: list[Health] = []

    async def sleep(seconds: float) -> None:
        waits.append(round(seconds, 3))
        await asyncio.sleep(seconds)

    kube = KubeClient(KubeAccess(kubeconfig=control_plane.kubeconfig(EXPORTER)))
    informer: Informer[dict[str, Any]] = Informer(kube, Query("pods", namespace, "app=vllm"), dict, lambda name: None,
                                                  on_health=healths.append, sleep=sleep, draw=lambda: 0.0,
                                                  watch_seconds=watch_seconds)
    task = asyncio.create_task(informer.run())
    run = Run(control_plane, namespace, informer, waits, healths, task)
    started = time.monotonic()
    try:
        if granted:
            await wait_until(_async(lambda: informer.synced), 30, "the first list")
        observed = await scenario(run)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kube.close()
    print(f"{scenario.__name__}: {time.monotonic() - started:.1f} s, waits {waits}, steps {[s.why for s in informer.steps]}")
    assert observed == expected
