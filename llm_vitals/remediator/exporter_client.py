"""Re-checks targets through the exporters' `GET /api/v1/targets` (docs/interfaces.md, "Exporter API").

Concurrent callers share one in-flight request (single flight), and a successful read is reused
for `max_age` (default 1 s; the exporter itself polls every few seconds, so a younger read is as
fresh as "now" gets): a storm of 500 webhooks costs the exporter a handful of reads. Any failure
(connect, timeout, HTTP status, an answer over the size cap, bad JSON, an answer that is not
llm_vitals.targets.TargetsAnswer) is reported as `None`, which the gate reads as "exporter
unreachable: do nothing". With sharded exporters, FleetReader reads every shard and joins their views.

Forward compatibility: a newer exporter may send a `state` or a `reason` this remediator does not
know. Only that target is in doubt: it is read as an `unknown_verdict` (never restarted, refused
with that reason, counted by the fleet gate only as its `recently_unhealthy` says), and the rest
of the answer is used. A target that is wrong in any other way still makes the whole answer doubt.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import aiohttp
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
    def __init__(self, base_url: str, client: aiohttp.ClientSession, timeout: float, max_age: float = 1.0):
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
        async with self.client.get(self.url, allow_redirects=False, timeout=aiohttp.ClientTimeout(total=self.timeout)) as response:
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}")
            body = bytearray()
            async for chunk in response.content.iter_chunked(64 * 1024):
                body += chunk
                if len(body) > _MAX_BYTES:
                    raise ValueError("answer too large")
            return bytes(body)

    async def _fetch(self) -> FleetView | None:
        read_at = time.monotonic()
        try:
            # This bounds the whole answer and its parsing, so an exporter that trickles bytes
            # cannot hold every waiting webhook past `timeout`.
            async with asyncio.timeout(self.timeout):
                body = await self._read()
                statuses = parse_targets(json.loads(body), self.source)
        except (aiohttp.ClientError, ValueError, ValidationError, TimeoutError) as exc:
            log_event(log, "exporter unreachable", level=logging.WARNING, url=redact_url(self.url),
                      error=type(exc).__name__, detail=str(exc)[:200])
            return None
        view = FleetView(targets=statuses)
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
    def of(cls, urls: Sequence[str], client: aiohttp.ClientSession, timeout: float, max_age: float) -> FleetReader:
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


# Words of a verdict a newer exporter may add; anything else wrong with a target is not forward compatibility.
_VERDICT_FIELDS = ("state", "reason")


def parse_targets(document: Any, source: str | None = None) -> dict[str, TargetStatus]:
    """The gate's view of one `/api/v1/targets` answer. Raises ValueError (ValidationError) when it
    is not one; a target whose only fault is an unknown state or reason is an `unknown_verdict`."""
    if not isinstance(document, dict) or not isinstance(document.get("targets"), list):
        raise ValueError("not an answer of /api/v1/targets (no `targets` list)")
    TargetsAnswer.model_validate({**document, "targets": []})
    statuses: dict[str, TargetStatus] = {}
    for whole in document["targets"]:
        status = _status_or_unknown(whole, source)
        statuses[status[0]] = status[1]
    return statuses


def _status_or_unknown(whole: Any, source: str | None) -> tuple[str, TargetStatus]:
    try:
        target = TargetView.model_validate(whole)
    except ValidationError as exc:
        errors = exc.errors()
        unknown = [e["loc"][0] for e in errors if len(e["loc"]) == 1 and e["loc"][0] in _VERDICT_FIELDS
                   and e["type"] == "literal_error" and isinstance(e.get("input"), str)]
        if not isinstance(whole, dict) or len(unknown) != len(errors):
            raise
        # Judge the rest of the object as it is, with known placeholders for the words in doubt.
        target = TargetView.model_validate({**whole, "state": "down", "reason": "connect"})
        said = ", ".join(f"{name} {whole[name]!r}" for name in unknown)
        why = f"the exporter says {said}, which this remediator does not know (a newer exporter?); never restarted"
        return target.name, replace(status_of(target, whole, source), state=str(whole["state"]), unknown_verdict=why)
    return target.name, status_of(target, whole, source)


def status_of(target: TargetView, whole: dict[str, Any], source: str | None = None) -> TargetStatus:
    """What the gate reads of one TARGET, with the whole object kept as the journal's evidence."""
    return TargetStatus(
        state=target.state,
        process_start_time=target.process_start_time,
        last_restart_time=target.last_restart_at,
        gpu_fault=target.gpu_fault,
        gpu_fault_detail=target.gpu_fault_detail,
        degraded=target.pace.degraded,
        recently_unhealthy=target.recently_unhealthy,
        engine=target.engine,
        namespace=target.namespace,
        pod=target.pod,
        pod_uid=target.pod_uid,
        node=target.node,
        workload=target.workload,
        url=target.url,
        raw=whole,
        source=source,
    )
