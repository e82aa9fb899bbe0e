"""Re-checks targets through the exporter's `GET /api/v1/targets` (docs/interfaces.md, "Exporter API").

Concurrent callers share one in-flight request (single flight), and a successful read is reused
for `max_age` (default 1 s; the exporter itself polls every few seconds, so a younger read is as
fresh as "now" gets): a storm of 500 webhooks costs the exporter a handful of reads. Any failure
(connect, timeout, HTTP status, an answer over the size cap, bad JSON, an answer that is not
llm_vitals.targets.TargetsAnswer: a state this remediator does not know is doubt) is reported as `None`,
which the gate reads as "exporter unreachable: do nothing".
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import httpx
from pydantic import ValidationError

from llm_vitals.logs import log_event
from llm_vitals.targets import TargetsAnswer, TargetView

from .executors import redact_url
from .gate import FleetView, TargetStatus

log = logging.getLogger("remediator.exporter")

# The exporter's answer is small (one object per target); anything bigger is not it.
_MAX_BYTES = 8 * 1024 * 1024


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
                body = await self._read()
                answer = TargetsAnswer.model_validate_json(body)
                # The whole object of each target is kept as the journal's evidence.
                raw = json.loads(body)["targets"]
                parsed = list(zip(answer.targets, raw, strict=True))
        except (httpx.HTTPError, ValueError, ValidationError, TimeoutError) as exc:
            log_event(log, "exporter unreachable", level=logging.WARNING, url=redact_url(self.url),
                      error=type(exc).__name__, detail=str(exc)[:200])
            return None
        view = FleetView(targets={t.name: status_of(t, whole) for t, whole in parsed})
        self._last = (read_at, view)  # failures are never cached: the next alert asks again
        return view


def status_of(target: TargetView, whole: dict[str, Any]) -> TargetStatus:
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
