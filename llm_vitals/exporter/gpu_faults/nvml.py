"""The NVML rules: pure functions from what NVML said about a target's GPUs to one fault, or none.

The fourth GPU-fault source (`nvml`, docs/gpu-faults.md), for hosts with the NVIDIA driver and no
dcgm-exporter nor node agent. The exporter's NVML source (llm_vitals/exporter/gpu_faults/nvml_source.py) reads
each GPU in threads of its own and hands these rules plain data: the last complete read of each GPU,
the critical Xid events seen, and why a GPU cannot be read now. A fault is, per GPU, in this order:

- `Xid<n>`: the most severe critical Xid event (NVML's event set) that NVIDIA's Xid catalog puts in a
  GPU-reset or node-reboot bucket (gpu_faults/xids.py). Every event is counted, however many
  application Xids came first, and a later milder one never replaces it. An event cannot be read
  again, so it is held until the GPU is seen reset (`came_back`: the driver asked for a recovery
  action, or the GPU answered lost or reset-required, and then a complete read shows it well) or
  the exporter restarts;
- `gpu_lost`: NVML answers NVML_ERROR_GPU_IS_LOST (fallen off the bus); `gpu_reset_required`: it answers
  NVML_ERROR_RESET_REQUIRED; `gpu_recovery_action`: NVML's GPU recovery action field
  (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, what `nvidia-smi -q` shows as "GPU Recovery Action") asks for
  a GPU reset, a node reboot or a P2P drain;
- `row_remap_failure`: a row remap failed (replace the GPU); `ecc_uncorrectable`: volatile uncorrectable
  ECC errors above 0; `row_remap_pending`: a remap waits for a GPU reset; `retired_pages_pending`: pages
  wait to be retired (GPUs before Ampere; H100/H200 remap rows instead);
- `gpu_unknown_error`: a health read answered NVML_ERROR_UNKNOWN.

A field the GPU does not support (NVML_ERROR_NOT_SUPPORTED: retired pages on an H200, ECC on a GPU
without it) is skipped, not an error. Any other failure (a call that has not returned within its
bound, no permission, no NVML at all) is an error kept beside the fault and never a fault by itself;
a GPU that cannot be read keeps its last read, so a hung call flags nothing new and clears nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_vitals.exporter.gpu_faults import GpuFault, _clip
from llm_vitals.exporter.gpu_faults.xids import XidRules

# The health fields a read takes, named as in tests/fixtures/gpu/nvml-h200-healthy.json (the recipe's capture):
# nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE), nvmlDeviceGetRemappedRows (corrected,
# uncorrected, pending, failure), nvmlDeviceGetRetiredPagesPendingStatus (1 = pending).
ECC_VOLATILE_UNCORRECTED = "ecc_volatile_uncorrected"
REMAPPED_ROWS = "remapped_rows"
RETIRED_PAGES_PENDING = "retired_pages_pending"
# nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): nvmlDeviceGpuRecoveryAction_t (0 none).
RECOVERY_ACTION = "recovery_action"
HEALTH_FIELDS: tuple[str, ...] = (ECC_VOLATILE_UNCORRECTED, REMAPPED_ROWS, RETIRED_PAGES_PENDING, RECOVERY_ACTION)
RECOVERY_ACTIONS = {1: "a GPU reset", 2: "a node reboot", 3: "a P2P drain", 4: "a P2P drain and a GPU reset",
                    5: "an IMEX domain recovery", 6: "a PCIe bus reset", 7: "a system reboot"}

# NVML's error names (pynvml's NVMLError_<name> classes) that decide something here.
NOT_SUPPORTED = "NotSupported"
GPU_IS_LOST = "GpuIsLost"
RESET_REQUIRED = "ResetRequired"
UNKNOWN = "Unknown"


@dataclass(frozen=True)
class NvmlError:
    """An NVML call's failure: NVML's error name (`GpuIsLost`, `NotSupported`, ...) and its text."""

    code: str
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> NvmlError:
        """`NVMLError_NotSupported: Not Supported` (how pynvml names and prints it) as an NvmlError."""
        name, _, rest = text.partition(":")
        return cls(name.strip().removeprefix("NVMLError_"), rest.strip())

    def __str__(self) -> str:
        return f"NVMLError_{self.code}" + (f": {self.text}" if self.text else "")


# A field's value as read (an int, or the remapped rows' 4 counts), or why it could not be read.
FieldValue = int | tuple[int, ...] | NvmlError


@dataclass(frozen=True)
class GpuId:
    """One GPU as NVML enumerated it: its index, and its UUID (None when NVML could not say: a lost GPU)."""

    index: int
    uuid: str | None

    def __str__(self) -> str:
        return f"GPU {self.index} ({self.uuid or 'UUID unknown'})"


@dataclass(frozen=True)
class GpuRead:
    """One complete read of a GPU's health fields (HEALTH_FIELDS), each a value or an NvmlError."""

    gpu: GpuId
    fields: Mapping[str, FieldValue]
    at: float = 0.0


@dataclass(frozen=True)
class XidEvent:
    """Critical Xid events of one number from NVML's event set: which GPU (by UUID; None if NVML could
    not say), the Xid, when it first came (wall time), how many came, and when the last did."""

    uuid: str | None
    xid: int
    at: float
    count: int = 1
    last_at: float | None = None

    @property
    def latest(self) -> float:
        return self.at if self.last_at is None else self.last_at


@dataclass(frozen=True)
class GpuStatus:
    """What the source knows of one GPU now: its last complete read, its Xid events, why it cannot be read now."""

    gpu: GpuId
    read: GpuRead | None = None  # None before the first read completed
    xids: tuple[XidEvent, ...] = ()  # critical Xid events seen since the source started, one per number
    error: str | None = None  # e.g. `nvml_timeout: ...`: kept and shown, never a fault
    reset_at: float | None = None  # wall time a read last showed the GPU back from a recovery (`came_back`)


@dataclass(frozen=True)
class NvmlView:
    """The source as a whole at one moment: every GPU it enumerated, and why it cannot read at all (if so)."""

    gpus: tuple[GpuStatus, ...] = ()
    error: str | None = None  # nvml_unavailable, nvml_init, nvml_timeout while starting, nvml_events ...
    opened: bool = False  # NVML answered and the GPUs were enumerated


@dataclass(frozen=True)
class NvmlRules:
    """Which critical Xids are a fault: NVIDIA's catalog and its overrides (the rest of the rules are fixed)."""

    xids: XidRules = field(default_factory=XidRules)


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _errors(fields: Mapping[str, FieldValue]) -> dict[str, NvmlError]:
    return {name: value for name, value in fields.items() if isinstance(value, NvmlError)}


def _count(value: FieldValue | None) -> int | None:
    return value if isinstance(value, int) else None


def read_fault(read: GpuRead) -> str | None:
    """The detail of the fault this read shows (its reason first), or None: the level faults, no Xids."""
    gpu, fields = read.gpu, read.fields
    errors = _errors(fields)
    for code, reason, what in ((GPU_IS_LOST, "gpu_lost", "NVML_ERROR_GPU_IS_LOST: the GPU has fallen off the bus"),
                               (RESET_REQUIRED, "gpu_reset_required", "NVML_ERROR_RESET_REQUIRED: the GPU needs a reset")):
        calls = sorted(name for name, error in errors.items() if error.code == code)
        if calls:
            return _clip(f"{reason}: {gpu}: {what} (answered to {', '.join(calls)})")
    rows = fields.get(REMAPPED_ROWS)
    remap = rows if isinstance(rows, tuple) and len(rows) == 4 else None
    counts = (f"NVML remapped rows: correctable {remap[0]}, uncorrectable {remap[1]}, pending {remap[2]}, "
              f"failure {remap[3]}") if remap else ""
    action = _count(fields.get(RECOVERY_ACTION))
    if action:
        what = RECOVERY_ACTIONS.get(action, f"recovery action {action}")
        return _clip(f"gpu_recovery_action: {gpu}: NVML's GPU recovery action asks for {what}")
    if remap and remap[3] > 0:
        return _clip(f"row_remap_failure: {gpu}: {counts}: a row remap failed, replace the GPU")
    ecc = _count(fields.get(ECC_VOLATILE_UNCORRECTED))
    if ecc is not None and ecc > 0:
        return _clip(f"ecc_uncorrectable: {gpu}: {ecc} volatile uncorrectable ECC error{'s' if ecc != 1 else ''} "
                     "since the last driver load or GPU reset")
    if remap and remap[2] > 0:
        return _clip(f"row_remap_pending: {gpu}: {counts}: a GPU reset is owed")
    if _count(fields.get(RETIRED_PAGES_PENDING)) == 1:
        return _clip(f"retired_pages_pending: {gpu}: pages wait to be retired: a GPU reset is owed")
    unknown = sorted(name for name, error in errors.items() if error.code == UNKNOWN)
    if unknown:
        return _clip(f"gpu_unknown_error: {gpu}: NVML answered NVML_ERROR_UNKNOWN to {', '.join(unknown)}")
    return None


def read_errors(read: GpuRead) -> list[str]:
    """The read's failures that are neither a fault nor a field the GPU does not support (e.g. no permission)."""
    deciding = {NOT_SUPPORTED, GPU_IS_LOST, RESET_REQUIRED, UNKNOWN}
    return [f"nvml_read: {read.gpu} {name}: {error}" for name, error in _errors(read.fields).items()
            if error.code not in deciding]


def xid_fault(gpu: GpuId, events: Iterable[XidEvent], rules: NvmlRules, reset_at: float | None = None) -> str | None:
    """The most severe faulty Xid this GPU had since it was last seen reset, as a detail; None when none."""
    current = {event.xid: event for event in events if reset_at is None or event.latest > reset_at}
    worst = rules.xids.worst(current)
    if worst is None:
        return None
    event = current[worst]
    times = f"{event.count} events, the first" if event.count > 1 else "an event"
    return _clip(f"Xid{event.xid}: {gpu}: NVML critical Xid ({rules.xids.words(event.xid)}), {times} at "
                 f"{_stamp(event.at)}; held until the GPU is seen reset or the exporter restarts")


def gpu_fault(status: GpuStatus, rules: NvmlRules) -> str | None:
    """One GPU's fault: its worst Xid first (the cause), then what its last read shows."""
    return (xid_fault(status.gpu, status.xids, rules, status.reset_at)
            or (read_fault(status.read) if status.read else None))


def _in_recovery(read: GpuRead) -> bool:
    errors = _errors(read.fields)
    return bool(_count(read.fields.get(RECOVERY_ACTION))) or any(
        error.code in (GPU_IS_LOST, RESET_REQUIRED) for error in errors.values())


def came_back(before: GpuRead | None, after: GpuRead) -> bool:
    """Whether `after` shows the GPU reset since `before`: `before` in a recovery (the driver's recovery
    action asked for one, or NVML answered GPU_IS_LOST or RESET_REQUIRED) and `after` out of it.

    What NVML offers: no reset counter, but the recovery action the driver sets with Xid 154 and
    clears once the GPU was reset, and the lost / reset-required answers that a reset ends.
    """
    return before is not None and _in_recovery(before) and not _in_recovery(after)


GpuRef = int | str  # a target's `gpus:` entry: an index, or a UUID (`GPU-...`)


def _matches(status: GpuStatus, ref: GpuRef) -> bool:
    if isinstance(ref, int) or ref.isdigit():
        return status.gpu.index == int(ref)
    return status.gpu.uuid is not None and status.gpu.uuid.lower() == ref.lower()


def select(view: NvmlView, wanted: Sequence[GpuRef]) -> tuple[list[GpuStatus], list[str]]:
    """The target's GPUs, in the order it names them, and an error for each one NVML does not show."""
    found: list[GpuStatus] = []
    errors: list[str] = []
    for ref in wanted:
        status = next((s for s in view.gpus if _matches(s, ref)), None)
        if status is None:
            if view.opened:  # before NVML answered, the source's own error says why
                seen = ", ".join(str(s.gpu) for s in view.gpus) or "none"
                errors.append(f"nvml_no_such_gpu: no GPU {ref} on this host (NVML sees: {seen})")
        elif status not in found:
            found.append(status)
    return found, errors


def nvml_fault(view: NvmlView, wanted: Sequence[GpuRef], rules: NvmlRules) -> tuple[GpuFault | None, str | None]:
    """A target's NVML fault (its first GPU with one, in its `gpus:` order) and its errors joined, or None.

    Errors never make a fault, and never clear one: a GPU that cannot be read now is judged on its
    last complete read (and its Xid events), with the error shown beside it.
    """
    gpus, errors = select(view, wanted)
    if view.error:
        errors.insert(0, view.error)
    fault: GpuFault | None = None
    for status in gpus:
        detail = gpu_fault(status, rules)
        if detail and fault is None:
            fault = GpuFault("nvml", detail)
        if status.error:
            errors.append(status.error)
        if status.read:
            errors.extend(read_errors(status.read))
    return fault, ("; ".join(errors) if errors else None)


def overdue(call: str | None, since: float | None, now: float, bound: float, where: str) -> str | None:
    """`nvml_timeout` when the call `where` is making has not returned within `bound` seconds, else None."""
    if call is None or since is None or now - since <= bound:
        return None
    return f"nvml_timeout: {call} ({where}) has not returned for {now - since:.1f} s (bound {bound:g} s)"


# -- the capture format --------------------------------------------------------------------------


def read_from_capture(gpu: Mapping[str, Any], index: int, at: float = 0.0) -> GpuRead:
    """One GPU of tests/fixtures/gpu/nvml-h200-healthy.json's shape (`{"value": ...}` or `{"error": "NVMLError_X: ..."}` per field)."""
    uuid = (gpu.get("uuid") or {}).get("value")
    fields: dict[str, FieldValue] = {}
    for name in HEALTH_FIELDS:
        entry = gpu.get(name)
        if not isinstance(entry, Mapping):
            continue
        if "error" in entry:
            fields[name] = NvmlError.parse(str(entry["error"]))
        elif isinstance(entry.get("value"), list):
            fields[name] = tuple(int(v) for v in entry["value"])
        elif entry.get("value") is not None:
            fields[name] = int(entry["value"])
    return GpuRead(GpuId(index, uuid), fields, at)


def read_to_capture(read: GpuRead) -> dict[str, Any]:
    """The inverse of read_from_capture, for a GPU run to write its reads in the fixtures' shape."""
    out: dict[str, Any] = {"uuid": {"value": read.gpu.uuid}, "index": read.gpu.index}
    for name, value in read.fields.items():
        out[name] = {"error": str(value)} if isinstance(value, NvmlError) else {
            "value": list(value) if isinstance(value, tuple) else value}
    return out
