"""Re-checks targets through the exporters' `GET /api/v1/targets` (docs/interfaces.md, "Exporter API").

Concurrent callers share one in-flight request (single flight), and a successful read is reused
for `max_age` (default 1 s; the exporter itself polls every few seconds, so a younger read is as
fresh as "now" gets): a storm of 500 webhooks costs the exporter a handful of reads. Any failure
(connect, timeout, HTTP status, an answer over the size cap, bad JSON, an answer that is not
llm_vitals.targets.TargetsAnswer: a state this remediator does not know is doubt) is reported as `None`,
which the gate reads as "exporter unreachable: do nothing". With sharded exporters, FleetReader
reads every shard and joins their views.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import ValidationError

from llm_vitals.logs import log_event
from llm_vitals.targets import TargetsAnswer, TargetView

from .executors import redact_url
from .gate import FleetView, TargetStatus
from .shards import merge_views

log = logging.getLogger("llm_vitals.remediator.exporter")

# The exporter's answer is small (one object per target); anything bigger is not it.
_MAX_BYTES = 8 * 1024 * 1024


class ExporterClient:
    def __init__(self, base_url: str, client: httpx.AsyncClient, timeout: float, max_age: float = 1.0):
        self.url = base_url.rstrip("/") + "/api/v1/targets"
        self.source = redact_url(base_url.rstrip("/"))  # named in logs and journaled with the evidence
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
        view = FleetView(targets={t.name: status_of(t, whole, self.source) for t, whole in parsed})
        self._last = (read_at, view)  # failures are never cached: the next alert asks again
        return view


class FleetReader:
    """Every configured exporter (one per shard) read at once, as one fleet view (llm_vitals/remediator/shards.py).

    Each exporter keeps its own single flight, size cap, timeout and `max_age` cache. If any one
    cannot be read the view is None, the gate's "exporter unreachable: do nothing": the fleet gate
    cannot be judged on part of the fleet. A target reported by two exporters is logged once (until
    it is reported once again) and never acted on.
    """

    def __init__(self, clients: Sequence[ExporterClient]):
        if not clients:
            raise ValueError("no exporter to read")
        self.clients = list(clients)
        self._merged: tuple[tuple[FleetView, ...], FleetView] | None = None  # (the views read, their merge)
        self._reported: frozenset[str] = frozenset()  # duplicates already logged

    @classmethod
    def of(cls, urls: Sequence[str], client: httpx.AsyncClient, timeout: float, max_age: float) -> FleetReader:
        return cls([ExporterClient(url, client, timeout, max_age) for url in urls])

    async def fleet(self) -> FleetView | None:
        """The whole fleet as the exporters see it now, or None when any of them cannot be read."""
        if len(self.clients) == 1:
            return await self.clients[0].fleet()
        views = await asyncio.gather(*(c.fleet() for c in self.clients))
        if any(view is None for view in views):
            return None
        read = tuple(view for view in views if view is not None)
        # Each exporter's view is reused for max_age: so is their merge (a storm merges once).
        if self._merged is not None and all(a is b for a, b in zip(self._merged[0], read, strict=True)):
            return self._merged[1]
        merged, duplicates = merge_views([(c.source, v) for c, v in zip(self.clients, read, strict=True)])
        for name in sorted(set(duplicates) - self._reported):
            log_event(log, "target reported by more than one exporter: never acted on", level=logging.WARNING,
                      target=name, exporters=list(duplicates[name]))
        self._reported = frozenset(duplicates)
        self._merged = (read, merged)
        return merged


def status_of(target: TargetView, whole: dict[str, Any], source: str | None = None) -> TargetStatus:
    """What the gate reads of one TARGET, with the whole object kept as the journal's evidence."""
    return TargetStatus(
        state=target.state,
        process_start_time=target.process_start_time,
        last_restart_time=target.last_restart_at,
        gpu_fault=target.gpu_fault,
        gpu_fault_detail=target.gpu_fault_detail,
        recently_unhealthy=target.recently_unhealthy,
        engine=target.engine,
        namespace=target.namespace,
        pod=target.pod,
        pod_uid=target.pod_uid,
        node=target.node,
        raw=whole,
        source=source,
    )
