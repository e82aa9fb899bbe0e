"""Reading a target's GPU on a dcgm-exporter `/metrics` page: its Xid gauge and its DCGM health watches.

Written against dcgm-exporter's own source, github.com/NVIDIA/dcgm-exporter at commit
d5e5f510a1b6b393f39a43293ccd9dc985defc79 (internal/pkg/rendermetrics/render_metrics.go for the line
shape, internal/pkg/collector/gpu_health_collector.go for DCGM_EXP_GPU_HEALTH_STATUS,
internal/pkg/transformation/const.go for the pod labels; tests/fixtures/dcgm/make_pages.py renders
the test pages from them). Not checked against a live dcgm-exporter: there is no GPU here.

A GPU line carries `gpu="0"`, `UUID="GPU-..."` (`uuid` with dcgm-exporter's old-namespace option)
and, with its Kubernetes pod mapping, `pod`, `namespace` (`pod_name`, `pod_namespace` in the old
namespace). A pod with several GPUs has several. `parse_page` and `select_gpus` are pure;
`fetch_page` does the GET, and `SharedPages` lets every target on one node share one read (and one
parse) of its dcgm-exporter per interval.
Every failure is a PageError with a reason and detail: the caller keeps it and flags nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

import aiohttp

from llm_vitals.exporter.engines import PageError
from llm_vitals.exporter.engines.scan import Scanner, decode
from llm_vitals.exporter.gpu_faults import DCGM_HEALTH_FAIL, DcgmState, GpuReading, GpuTarget, SourceRead, dcgm_fault, lossy_gpus
from llm_vitals.exporter.gpu_faults.xids import XidRules
from llm_vitals.exporter.upstream import METRICS_ACCEPT, bounded_get


class DcgmSettings(Protocol):
    """Where a target's GPU is on a dcgm-exporter page (exporter/settings.py's DcgmSettings)."""

    @property
    def url(self) -> Any: ...

    @property
    def pod(self) -> str | None: ...

    @property
    def namespace(self) -> str | None: ...

    @property
    def uuid(self) -> str | None: ...

XID = "DCGM_FI_DEV_XID_ERRORS"
HEALTH = "DCGM_EXP_GPU_HEALTH_STATUS"
# dcgm-exporter's own per-Xid families (label `xid`), when its collectors list them: a count within
# its window (`--xid-count-window-size`), and a total since it started. The gauge above keeps only
# the last Xid; these keep every one, so a 95 followed by a 43 within one poll is still seen.
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
XID_TOTAL = "DCGM_EXP_XID_ERRORS_TOTAL"
_FAMILIES = (XID, HEALTH, XID_COUNT, XID_TOTAL)
_SCANNER = Scanner(list(_FAMILIES))


def _label(labels: Mapping[str, str], *names: str) -> str | None:
    return next((labels[name] for name in names if name in labels), None)


def _is_ours(labels: Mapping[str, str], dcgm: DcgmSettings) -> bool:
    if dcgm.uuid is not None:
        return _label(labels, "UUID", "uuid") == dcgm.uuid
    if _label(labels, "pod", "pod_name") != dcgm.pod:
        return False
    return dcgm.namespace is None or _label(labels, "namespace", "pod_namespace") == dcgm.namespace


# One XID or health line of a page: (metric name, its labels, its value).
Line = tuple[str, Mapping[str, str], float]


def parse_page(body: bytes) -> tuple[Line, ...]:
    """Every DCGM_FI_DEV_XID_ERRORS and DCGM_EXP_GPU_HEALTH_STATUS line of a page, read once for all its GPUs.

    PageError when the page is not a dcgm-exporter page (HTML, empty, not UTF-8, a malformed line).
    """
    found = _SCANNER.scan(decode(body))
    if not found:
        raise PageError("bad_metrics", f"not a dcgm-exporter page: no {XID} nor {HEALTH} line")
    return tuple((name, sample.labels(), sample.value) for name in _FAMILIES for sample in found.get(name, []))


def select_gpus(lines: tuple[Line, ...], dcgm: DcgmSettings) -> list[GpuReading]:
    """The target's GPUs among a page's lines, in page order; PageError when none is there."""
    # The GPUs are chosen by pod (or UUID) on any line, then joined by UUID: a health line without
    # the pod labels still counts for the pod's GPU.
    ours = {uuid for _, labels, _ in lines if (uuid := _label(labels, "UUID", "uuid")) and _is_ours(labels, dcgm)}
    # uuid -> (index, xids, failing, per-Xid counts by family)
    gpus: dict[str, tuple[str, list[float], list[tuple[str, str]], dict[str, dict[int, float]]]] = {}
    for name, labels, value in lines:
        uuid = _label(labels, "UUID", "uuid")
        if uuid is None or uuid not in ours:
            continue
        _, xids, failing, counts = gpus.setdefault(uuid, (labels.get("gpu", "?"), [], [], {}))
        if name == XID and value == value:  # a NaN Xid is no reading
            xids.append(value)
        elif name == HEALTH and value >= DCGM_HEALTH_FAIL:
            failing.append((labels.get("health_watch", "?"), labels.get("health_error_code", "")))
        elif name in (XID_COUNT, XID_TOTAL) and value == value and labels.get("xid", "").isdigit():
            counts.setdefault(name, {})[int(labels["xid"])] = value
    if not gpus:
        wanted = f"UUID {dcgm.uuid}" if dcgm.uuid else f"pod {dcgm.pod}" + (f" in namespace {dcgm.namespace}" if dcgm.namespace else "")
        raise PageError("bad_metrics", f"no GPU of {wanted} on the dcgm-exporter page")
    # The total is the better witness (it never falls within dcgm-exporter's life); the windowed count otherwise.
    return [GpuReading(uuid, index, xids[-1] if xids else None, tuple(failing), counts.get(XID_TOTAL) or counts.get(XID_COUNT))
            for uuid, (index, xids, failing, counts) in gpus.items()]


def lossy_detail(gpus: list[GpuReading]) -> str | None:
    """Why this read can lose Xid events, for gpu_fault_errors.dcgm; None when every GPU has per-Xid totals."""
    lossy = lossy_gpus(gpus)
    if not lossy:
        return None
    shown = ", ".join(f"GPU {gpu.gpu}" for gpu in lossy)
    return (f"xid_events_lossy: {shown}: the page has no {XID_TOTAL} (nor {XID_COUNT}), only {XID}, which keeps"
            " the last Xid: an Xid followed by another within one read is lost. Enable the per-Xid counter in"
            " dcgm-exporter's collectors (docs/gpu-faults.md)")


async def fetch_page(session: aiohttp.ClientSession, url: str, timeout: float, max_bytes: int) -> tuple[Line, ...]:
    """GET and parse a dcgm-exporter page; PageError for any upstream trouble (timeout, connect, too large, not 200, not a page)."""
    status, body = await bounded_get(session, url, timeout=timeout, max_bytes=max_bytes, headers={"Accept": METRICS_ACCEPT})
    if status != 200:
        raise PageError("http_status", f"dcgm-exporter answered HTTP {status}")
    return parse_page(body)


class SharedPages:
    """One read (and parse) of a dcgm-exporter page serves every target that asks for it within `fresh_for` seconds.

    One dcgm-exporter per node serves all of the node's GPUs (eight targets on an 8-GPU node): without
    this each target would fetch and parse the same page every poll. An 8-GPU page of 116 KB took
    2.6-6.8 ms to parse here (a loaded 2-core box); selecting one target's GPUs from it, 0.2-0.7 ms.
    A read in flight is shared too; a failed read is shared like a good one (each target keeps the
    error).
    """

    def __init__(self, fetch: Callable[[str], Awaitable[tuple[Line, ...]]], fresh_for: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fetch = fetch
        self.fresh_for = fresh_for
        self.clock = clock
        self.reads = 0
        self._pages: dict[str, tuple[float, asyncio.Future[tuple[Line, ...]]]] = {}

    async def get(self, url: str) -> tuple[Line, ...]:
        now = self.clock()
        entry = self._pages.get(url)
        if entry is None or now - entry[0] >= self.fresh_for:
            self.reads += 1
            entry = (now, asyncio.ensure_future(self.fetch(url)))
            self._pages[url] = entry
        # Shielded: one target's poll being cancelled must not cancel the read the others wait on.
        return await asyncio.shield(entry[1])

    async def close(self) -> None:
        """Cancel the reads still in flight (the poller is stopping): none may outlive its loop."""
        reads = [future for _, future in self._pages.values() if not future.done()]
        for future in reads:
            future.cancel()
        await asyncio.gather(*reads, return_exceptions=True)
        self._pages.clear()


class DcgmSource:
    """The `dcgm` source (FaultSource): the target's GPUs on its dcgm-exporter page, judged by `dcgm_fault`.

    An unreadable page (or one without the target's GPU) is an error kept beside the fault: it flags
    nothing new and clears nothing (the state the rule keeps between reads is the read's memory).
    """

    name = "dcgm"

    def __init__(self, pages: SharedPages, rules: XidRules) -> None:
        self.pages = pages
        self.rules = rules
        self._released: set[str] = set()  # targets whose held Xids a human released, until their next read

    def wants(self, target: GpuTarget) -> bool:
        return target.dcgm is not None

    async def read(self, target: GpuTarget, before: SourceRead) -> SourceRead:
        dcgm = target.dcgm
        gpus: list[GpuReading] | None = None
        error = None
        try:
            gpus = select_gpus(await self.pages.get(str(dcgm.url)), dcgm)
        except PageError as exc:
            error = f"{exc.reason}: {exc.detail}"
        state = before.memory if isinstance(before.memory, DcgmState) else DcgmState()
        if target.name in self._released:
            self._released.discard(target.name)
            state = replace(state, held={}, held_xid={})
        state, fault = dcgm_fault(state, gpus, self.rules)
        return SourceRead(fault, error, state, lossy_detail(gpus or []))

    def release(self, target: GpuTarget) -> None:
        """Forget the target's held Xid at its next read (the poll stays the one writer)."""
        self._released.add(target.name)
