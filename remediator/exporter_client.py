"""Re-checks targets through the exporter's `GET /api/v1/targets` (docs/interfaces.md, "Exporter API").

Concurrent callers share one in-flight request (single flight), and a successful read is reused
for `max_age` (default 1 s; the exporter itself polls every few seconds, so a younger read is as
fresh as "now" gets): a storm of 500 webhooks costs the exporter a handful of reads. Any failure
(connect, timeout, HTTP status, an answer over the size cap, bad JSON) is reported as `None`,
which the gate reads as "exporter unreachable: do nothing".
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from llm_vitals.logs import log_event

from .executors import redact_url
from .gate import FleetView, TargetStatus

log = logging.getLogger("remediator.exporter")

# The exporter's answer is small (one object per target); anything bigger is not it.
_MAX_BYTES = 8 * 1024 * 1024


class _Target(BaseModel):
    # The exporter may add fields; we read only these.
    model_config = ConfigDict(extra="ignore")
    name: str
    state: str
    process_start_time: float | None = None
    last_restart_at: float | None = None  # the exporter's last detected restart (counter reset)
    gpu_fault: bool = False
    recently_unhealthy: bool = False
    engine: str | None = None
    # A target discovered in Kubernetes: its own pod as the exporter saw it (null otherwise).
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None
    node: str | None = None


class _Targets(BaseModel):
    model_config = ConfigDict(extra="ignore")
    targets: list[dict[str, Any]]


class ExporterClient:
    def __init__(self, base_url: str, client: httpx.AsyncClient, timeout: float, max_age: float = 1.0):
        self.url = base_url.rstrip("/") + "/api/v1/targets"
        self.client = client
        self.timeout = timeout
        self.max_age = max_age
        self._inflight: asyncio.Future[FleetView | None] | None = None
        self._last: tuple[float, FleetView] | None = None  # (monotonic time of the read, view)

    async def fleet(self) -> FleetView | None:
        """The fleet as the exporter sees it now, or None when it cannot be read."""
        if self._last is not None and time.monotonic() - self._last[0] < self.max_age:
            return self._last[1]
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._fetch())
            self._inflight.add_done_callback(self._clear)
        # shield: one caller's cancellation (its client went away) must not cancel the others' read.
        return await asyncio.shield(self._inflight)

    def _clear(self, _: object) -> None:
        self._inflight = None

    async def _read(self) -> bytes:
        """The answer's body, refused as soon as it passes the cap (the rest is never read)."""
        async with self.client.stream("GET", self.url, timeout=self.timeout) as response:
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > _MAX_BYTES:
                    raise ValueError("answer too large")
            return bytes(body)

    async def _fetch(self) -> FleetView | None:
        read_at = time.monotonic()
        try:
            # httpx's timeout is per read; this bounds the whole answer, so an exporter that
            # trickles bytes cannot hold every waiting webhook past `timeout`.
            async with asyncio.timeout(self.timeout):
                raw = _Targets.model_validate_json(await self._read()).targets
                parsed = [(_Target.model_validate(t), t) for t in raw]
        except (httpx.HTTPError, ValueError, ValidationError, TimeoutError) as exc:
            log_event(log, "exporter unreachable", level=logging.WARNING, url=redact_url(self.url),
                      error=type(exc).__name__, detail=str(exc)[:200])  # fmt: skip
            return None
        view = FleetView(targets={t.name: status_of(t, whole) for t, whole in parsed})
        self._last = (read_at, view)  # failures are never cached: the next alert asks again
        return view


def status_of(target: _Target, whole: dict[str, Any]) -> TargetStatus:
    """What the gate reads of one TARGET, with the whole object kept as the journal's evidence."""
    return TargetStatus(
        state=target.state,
        process_start_time=target.process_start_time,
        last_restart_time=target.last_restart_at,
        gpu_fault=target.gpu_fault,
        recently_unhealthy=target.recently_unhealthy,
        engine=target.engine,
        namespace=target.namespace,
        pod=target.pod,
        pod_uid=target.pod_uid,
        node=target.node,
        raw=whole,
    )
