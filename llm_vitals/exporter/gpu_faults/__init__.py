"""GPU faults, in one home: the sources that read them, the rules that judge them, and the aggregate the poller calls.

Each source implements `FaultSource` (a name, `wants(target)`, and `read(target, before)` giving a
`SourceRead`: a fault or none, why it could not be read, and what it keeps for its next read). The
aggregate (`reader.GpuFaultReader`) asks each source a target wants, once per poll, and hands the
record one `GpuFaultState`, written by one setter (`TargetRecord.set_gpu_faults`). docs/gpu-faults.md
is the user's view.

- `file.py`: the `gpu_fault_file` a node agent writes;
- `node.py`: the Kubernetes node's conditions and taints, from the cache the node watch fills;
- `node_watch.py`: the list-then-watch of the cluster's Nodes, which only feeds that cache (the
  poller's aggregate is the one writer);
- `dcgm.py`: the target's GPUs on a dcgm-exporter page;
- `nvml_source.py` (threads), `nvml_pynvml.py` (the binding) and `nvml.py` (the rules): NVML;
- `xids.py`: NVIDIA's Xid catalog, shared by dcgm and NVML.

The pure rules below judge the first three sources:

- `file`: the target's `gpu_fault_file` (a node agent writes it); its first line is the detail
  (`file_fault`: an unreadable file keeps the fault it held).
- `node`: the Kubernetes node's conditions and taints (`node_fault`).
- `dcgm`: the target's GPU on a dcgm-exporter page (`dcgm_fault`): an Xid event in a GPU-reset or
  node-reboot bucket of NVIDIA's catalog (gpu_faults/xids.py), held until a human releases it, or a
  failing DCGM health watch.

`combine` makes one fault of them, the first source in that order winning the detail. Every detail
starts with a reason word and a colon (`GpuMemWatchIsNotHealthy: ...`): the remediator's
cordon_and_move taints the node with that word (llm_vitals/remediator/gate.py `taint_value`).

No I/O in this module: the sources read, these functions decide.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from llm_vitals.exporter.gpu_faults.xids import FOLLOW, XidRules

# NVSentinel's node conditions (True = unhealthy). Its gpu-health-monitor names one condition per
# DCGM health watch (`GpuMemWatch`, reason `GpuMemWatchIsNotHealthy`, message `... Recommended
# Action=...`); its syslog-health-monitor sets `SysLogsXIDError`, `SysLogsSXIDError` and
# `SysLogsGPUFallenOff` (NVIDIA/NVSentinel: health-monitors/syslog-health-monitor, the gpu-health-monitor
# tests). Power and clock warnings are Events there, not conditions, so they are not listed.
# Node Problem Detector ships no GPU condition of its own: a custom-plugin condition is added by name.
NVSENTINEL_CONDITIONS: tuple[str, ...] = (
    "GpuMemWatch", "GpuInforomWatch", "GpuPcieWatch", "GpuNvlinkWatch", "GpuThermalWatch",
    "GpuDriverWatch", "GpuAllWatch",
    "SysLogsXIDError", "SysLogsSXIDError", "SysLogsGPUFallenOff",
)
# Conditions whose *False* is the fault: the EKS node monitoring agent's accelerated-hardware check
# (AcceleratedHardwareReady=False, reasons such as `NvidiaXID79Error`, `DCGMError`).
READY_CONDITIONS: tuple[str, ...] = ("AcceleratedHardwareReady",)
# DCGM_EXP_GPU_HEALTH_STATUS values: dcgmHealthWatchResult PASS 0, WARN 10, FAIL 20. A warning
# (a clock throttle, a PCIe replay rate) is not a fault a restart cannot fix: only FAIL counts.
DCGM_HEALTH_FAIL = 20.0

DETAIL_CHARS = 300


@dataclass(frozen=True)
class GpuFault:
    """One flagged GPU fault: which source said so, and the detail shown as `gpu_fault_detail`."""

    source: str  # file | node | dcgm
    detail: str


@dataclass(frozen=True)
class Taint:
    """A configured taint pattern: key, and optionally value and effect (`key[=value][:effect]`)."""

    key: str
    value: str | None = None
    effect: str | None = None

    @classmethod
    def parse(cls, text: str) -> Taint:
        """`key[=value][:effect]`; ValueError when the key is empty."""
        rest, _, effect = text.partition(":")
        key, eq, value = rest.partition("=")
        if not key.strip():
            raise ValueError(f"taint {text!r}: the key is empty (key[=value][:effect])")
        return cls(key.strip(), value if eq else None, effect or None)

    def matches(self, taint: Mapping[str, Any]) -> bool:
        return (taint.get("key") == self.key
                and (self.value is None or (taint.get("value") or "") == self.value)
                and (self.effect is None or taint.get("effect") == self.effect))


@dataclass(frozen=True)
class NodeRules:
    """Which node conditions and taints count as a GPU fault."""

    conditions: frozenset[str] = frozenset(NVSENTINEL_CONDITIONS)  # a fault when True
    ready_conditions: frozenset[str] = frozenset(READY_CONDITIONS)  # a fault when False
    taints: tuple[Taint, ...] = ()


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 1] + "…"


def node_fault(node: str, conditions: Iterable[Mapping[str, Any]], taints: Iterable[Mapping[str, Any]],
               rules: NodeRules) -> GpuFault | None:
    """The node's first faulty condition (in the node's order), else its first matching taint, else None.

    `conditions` and `taints` are the Node's `status.conditions` and `spec.taints` as the API gives
    them (dicts with type/status/reason/message and key/value/effect). A condition whose status is
    Unknown is not a fault: an agent that stopped reporting is doubt, not evidence.
    """
    for condition in conditions:
        kind, status = condition.get("type"), condition.get("status")
        if (kind in rules.conditions and status == "True") or (kind in rules.ready_conditions and status == "False"):
            reason = condition.get("reason") or f"{kind}{'IsNotHealthy' if status == 'True' else 'NotReady'}"
            message = condition.get("message") or ""
            return GpuFault("node", _clip(f"{reason}: node {node} condition {kind}={status}"
                                          + (f": {message}" if message else "")))
    for taint in taints:
        for pattern in rules.taints:
            if pattern.matches(taint):
                shown = taint.get("key", "") + (f"={taint['value']}" if taint.get("value") else "") + f":{taint.get('effect', '')}"
                return GpuFault("node", _clip(f"{taint.get('key')}: node {node} is tainted {shown}"))
    return None


# -- dcgm-exporter -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuReading:
    """One GPU's lines on a dcgm-exporter page: its ids, its Xid gauge, and its failing health watches."""

    uuid: str
    gpu: str  # the index as dcgm-exporter labels it ("0")
    xid: float | None  # DCGM_FI_DEV_XID_ERRORS; None when the page has no such line
    failing: tuple[tuple[str, str], ...] = ()  # (health_watch, health_error_code) at FAIL
    # Xid -> DCGM_EXP_XID_ERRORS_TOTAL (else _COUNT) when the page has them; None when it has neither.
    xid_counts: Mapping[int, float] | None = None


@dataclass(frozen=True)
class DcgmState:
    """What the dcgm rule remembers between reads: the last Xid gauge and per-Xid counts seen per GPU,
    and the Xid fault it holds per GPU (the Xid, and its detail)."""

    xids: Mapping[str, float] = field(default_factory=dict)  # uuid -> last Xid read
    held: Mapping[str, str] = field(default_factory=dict)  # uuid -> detail of an Xid fault not cleared yet
    counts: Mapping[str, Mapping[int, float]] = field(default_factory=dict)  # uuid -> Xid -> count last read
    held_xid: Mapping[str, int] = field(default_factory=dict)  # uuid -> the Xid of the held fault


def _xid_text(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def _events(gpu: GpuReading, before: DcgmState) -> list[tuple[int, str]]:
    """The Xid events this read shows for one GPU since the last: (Xid, how it showed). The first read
    is a baseline. A gauge back at 0, or counts that fell (a GPU reset, or a restarted dcgm-exporter
    counting from 0), is no event: it says nothing about the Xid held before it."""
    events: list[tuple[int, str]] = []
    last = before.xids.get(gpu.uuid)
    if gpu.xid is not None and last is not None and gpu.xid != last and gpu.xid != 0 and gpu.xid == int(gpu.xid):
        events.append((int(gpu.xid), f"DCGM_FI_DEV_XID_ERRORS changed {_xid_text(last)} -> {_xid_text(gpu.xid)}"))
    counted = before.counts.get(gpu.uuid)
    if gpu.xid_counts is not None and counted is not None:
        for xid, count in gpu.xid_counts.items():
            if count > counted.get(xid, 0.0):
                events.append((xid, f"DCGM_EXP_XID_ERRORS count for Xid {xid} rose to {count:g}"))
    return events


def lossy_gpus(readings: Sequence[GpuReading]) -> list[GpuReading]:
    """The GPUs whose page keeps only the last Xid (no DCGM_EXP_XID_ERRORS_TOTAL nor _COUNT): an Xid
    followed by another within one read is lost there."""
    return [gpu for gpu in readings if gpu.xid_counts is None]


def dcgm_fault(before: DcgmState, readings: Sequence[GpuReading] | None,
               xids: XidRules | None = None) -> tuple[DcgmState, GpuFault | None]:
    """The target's GPUs on this read, against what the last read left: (state to keep, fault or None).

    - Xid events: a change of `DCGM_FI_DEV_XID_ERRORS` (it keeps only the *last* Xid the GPU had, so
      only a change is an event), and any per-Xid count that rose (`DCGM_EXP_XID_ERRORS_TOTAL` or
      `_COUNT`, which keep every Xid: a 95 followed by a 43 within one read is still a 95). The most
      severe event NVIDIA's catalog puts in a fault bucket (`xids`) is held, and only a worse one
      replaces it: a later milder Xid never clears it, and neither does the gauge or a count falling
      back to 0 (a restarted dcgm-exporter starts from 0 as a GPU reset does, and a held 95 is not
      known to be over): only a human's release (`DcgmSource.release`) ends it. Xid 154 follows the
      Xid it came with; on a GPU whose page keeps only the last Xid, a 154 with no other Xid event in
      the read is held as a GPU reset: the Xid it followed was lost. The first read of a GPU is a
      baseline, never a fault: a 79 from before the exporter started is not known to be current,
      and a GPU still broken also fails its DCGM health watch, which is read as a level.
    - Health: any `DCGM_EXP_GPU_HEALTH_STATUS` watch at FAIL (20) is a fault while it reads so.
    - No reading (`None`: the page could not be read, or the GPU is not on it) changes nothing and
      flags nothing new; an Xid fault already held stays held until a reading clears it.
    """
    rules = xids if xids is not None else XidRules()
    if readings is None:
        return before, _first_held(before, ())
    xid_seen, held, held_xid, counts = dict(before.xids), dict(before.held), dict(before.held_xid), dict(before.counts)
    health: GpuFault | None = None
    for gpu in readings:
        events = _events(gpu, before)
        lone_follow = gpu.xid_counts is None and all(rules.bucket(xid) == FOLLOW for xid, _ in events)
        for xid, how in events:
            kept = held_xid.get(gpu.uuid)
            lost = lone_follow and rules.bucket(xid) == FOLLOW
            if (rules.is_fault(xid) or lost) and (kept is None or rules.rank(xid) > rules.rank(kept)):
                held_xid[gpu.uuid] = xid
                words = ("the Xid it followed was lost (this page keeps only the last Xid): taken as a GPU reset"
                         if lost else rules.words(xid))
                held[gpu.uuid] = _clip(f"Xid{xid}: dcgm-exporter {how} on GPU {gpu.gpu} ({gpu.uuid}): {words}")
        if gpu.xid is not None:
            xid_seen[gpu.uuid] = gpu.xid
        if gpu.xid_counts is not None:
            counts[gpu.uuid] = dict(gpu.xid_counts)
        if gpu.failing and health is None:
            watches = ", ".join(f"{watch} {code}" for watch, code in gpu.failing)
            code = next((c for _, c in gpu.failing if c and c != "DCGM_FR_OK"), f"DcgmHealth{gpu.failing[0][0]}")
            health = GpuFault("dcgm", _clip(f"{code}: dcgm-exporter DCGM_EXP_GPU_HEALTH_STATUS FAIL on GPU {gpu.gpu} "
                                            f"({gpu.uuid}): {watches}"))
    after = DcgmState(xid_seen, held, counts, held_xid)
    return after, _first_held(after, [g.uuid for g in readings]) or health


def _first_held(state: DcgmState, order: Iterable[str]) -> GpuFault | None:
    for uuid in [*order, *sorted(state.held)]:
        if uuid in state.held:
            return GpuFault("dcgm", state.held[uuid])
    return None


def file_fault(before: GpuFault | None, text: str | None, error: str | None) -> tuple[GpuFault | None, str | None]:
    """The `gpu_fault_file` rule: (fault, error) from one read of the file.

    `text` is what the file holds ("" when it is empty or absent: the agent cleared it); `error` is
    why it could not be read (a path made a directory, no permission). An unreadable file fails
    safe: the fault already held stays (`before`) and the error is shown beside it, never taken for
    a file cleared.
    """
    if error is not None:
        return before, error
    first = (text or "").strip().splitlines()
    return (GpuFault("file", first[0][:200]) if first else None), None


def combine(faults: Iterable[GpuFault | None]) -> GpuFault | None:
    """One fault from several sources: the first one flagged (callers pass file, node, dcgm in that order)."""
    return next((fault for fault in faults if fault is not None), None)


# -- the sources' protocol and the one state they leave on a record -----------------------------

SOURCES: tuple[str, ...] = ("file", "node", "dcgm", "nvml")  # the order `combine` gives the detail in


@dataclass(frozen=True)
class SourceRead:
    """One source's word on one target: its fault (or None), why it could not be read (or None), and
    what it keeps for its next read (dcgm's DcgmState; None for the others)."""

    fault: GpuFault | None = None
    error: str | None = None
    memory: Any = None
    # Read, but the source can lose fault events (dcgm-exporter keeping only the last Xid): shown with
    # the errors, and as llm_vitals_gpu_fault_events_lossy; it changes no fault.
    lossy: str | None = None


@dataclass(frozen=True)
class GpuFaultState:
    """A target's GPU faults as its last poll read them: one SourceRead per source that was read."""

    reads: Mapping[str, SourceRead] = field(default_factory=dict)

    def of(self, source: str) -> SourceRead:
        return self.reads.get(source) or SourceRead()

    @property
    def fault(self) -> GpuFault | None:
        """The fault of the first source that flags one, in SOURCES order."""
        if not self.reads:  # most targets name no GPU source: asked twice a poll, answered at once
            return None
        return combine(read.fault for name in SOURCES if (read := self.reads.get(name)) is not None)

    @property
    def errors(self) -> dict[str, str]:
        """Each source that could not be read, and why; or that was read but can lose fault events, and why."""
        return {name: text for name in SOURCES if (read := self.reads.get(name)) and (text := read.error or read.lossy)}

    @property
    def lossy(self) -> bool:
        """Whether a source read for the target can lose fault events (dcgm-exporter without per-Xid totals)."""
        return any(read.lossy for read in self.reads.values())

    def with_read(self, source: str, read: SourceRead) -> GpuFaultState:
        return GpuFaultState({**self.reads, source: read})


class GpuTarget(Protocol):
    """What the sources read of a target (exporter/settings.py's TargetSettings)."""

    @property
    def name(self) -> str: ...

    @property
    def gpu_fault_file(self) -> Any: ...

    @property
    def dcgm(self) -> Any: ...

    @property
    def gpus(self) -> list[int | str] | None: ...

    @property
    def node(self) -> str | None: ...


class FaultSource(Protocol):
    """One GPU-fault source: its name (the key in gpu_fault_errors), which targets it reads, and one read."""

    name: str

    def wants(self, target: GpuTarget) -> bool: ...

    def read(self, target: GpuTarget, before: SourceRead) -> Awaitable[SourceRead]: ...

    def release(self, target: GpuTarget) -> None:
        """A human says the target's GPU was reset or replaced: what the source holds for it (an Xid
        event, which cannot be read again) is over from its next read. Levels are read as they are."""
        ...
