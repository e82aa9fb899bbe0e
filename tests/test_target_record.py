"""A target's record has one door: every change is a method of TargetRecord, and each bumps its
version, which is all the page cache (llm_vitals/exporter/page.py) compares."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import replace

import pytest
from conftest import REPO

from llm_vitals.exporter.gpu_faults import DcgmState, GpuFault, GpuFaultState, SourceRead
from llm_vitals.exporter.settings import parse_settings
from llm_vitals.exporter.state import StateStore, TargetRecord

NOW = 1_800_000_000.0


def fresh() -> TargetRecord:
    store = StateStore(parse_settings({"targets": [{"name": "gpu-a", "url": "http://127.0.0.1:9", "node": "n1"}]},
                                      environ={}), NOW)
    record = store.get("gpu-a")
    assert record is not None
    return record


def _poll(record: TargetRecord) -> None:
    record.record_poll(replace(record.verdict, state="down", up=False, error_reason="timeout", last_poll=NOW), NOW, 0.5)


def gpu(record: TargetRecord, source: str, fault: GpuFault | None, error: str | None = None, memory: object = None) -> None:
    """One GPU-fault source's read written through the record's one door, as the poller writes it."""
    record.set_gpu_faults(record.gpu_faults.with_read(source, SourceRead(fault, error, memory)))


# Each writer's change, and what it leaves on the record.
CHANGES: list[tuple[str, Callable[[TargetRecord], object], Callable[[TargetRecord], bool]]] = [
    ("a poll", _poll, lambda r: r.polls == 1 and r.poll_errors == {"timeout": 1} and r.poll_duration == 0.5
     and r.verdict.state == "down" and [state for _, _, state in r.history] == ["down"]),
    ("an internal poll error", lambda r: r.count_poll_error("internal"), lambda r: r.poll_errors == {"internal": 1}),
    ("a canary's result", lambda r: r.record_canary("ok", replace(r.verdict, last_canary_ok=NOW)),
     lambda r: r.canaries == {"ok": 1} and r.verdict.last_canary_ok == NOW),
    ("a canary task over", lambda r: r.canary_ended(), lambda r: r.canary_task is None),
    ("the canary's model", lambda r: r.set_model("tiny"), lambda r: r.model == "tiny"),
    ("a drain", lambda r: r.set_draining(True), lambda r: r.draining and not r.ready(NOW)),
    ("a GPU fault file", lambda r: gpu(r, "file", GpuFault("file", "Xid 79")), lambda r: r.gpu_fault == "Xid 79"),
    ("the node source's fault", lambda r: gpu(r, "node", GpuFault("node", "GpuXid")),
     lambda r: r.fault == GpuFault("node", "GpuXid") and r.gpu_fault_errors == {}),
    ("the node source's error", lambda r: gpu(r, "node", None, "HTTP 403"),
     lambda r: r.gpu_fault is None and r.gpu_fault_errors == {"node": "HTTP 403"}),
    ("a dcgm read", lambda r: gpu(r, "dcgm", GpuFault("dcgm", "Xid 79"), None, DcgmState({"GPU-1": 79.0}, {"GPU-1": "Xid 79"})),
     lambda r: r.gpu_faults.of("dcgm").fault == GpuFault("dcgm", "Xid 79")
     and r.gpu_faults.of("dcgm").memory.xids == {"GPU-1": 79.0}),
    ("a dcgm error", lambda r: gpu(r, "dcgm", None, "timeout"), lambda r: r.gpu_fault_errors == {"dcgm": "timeout"}),
    ("the NVML source's fault", lambda r: gpu(r, "nvml", GpuFault("nvml", "Xid 79")),
     lambda r: r.gpu_faults.of("nvml").fault == GpuFault("nvml", "Xid 79") and r.gpu_fault == "Xid 79"),
    ("the NVML source's error", lambda r: gpu(r, "nvml", None, "NVML not loaded"),
     lambda r: r.gpu_fault is None and r.gpu_fault_errors == {"nvml": "NVML not loaded"}),
]


@pytest.mark.parametrize("change,check", [(c, k) for _, c, k in CHANGES], ids=[name for name, _, _ in CHANGES])
def test_every_change_is_a_method_that_bumps_the_version(change, check) -> None:
    record = fresh()
    before = record.version
    change(record)
    assert check(record)
    assert record.version > before


@pytest.mark.parametrize("change", [
    lambda r: r.set_draining(False),
    lambda r: r.set_gpu_faults(GpuFaultState()),
], ids=["undrain", "no GPU-fault source read"])
def test_a_change_to_what_the_record_already_holds_keeps_the_version(change) -> None:
    # The GPU-fault sources are read at every poll: most polls change nothing.
    record = fresh()
    before = record.version
    change(record)
    assert record.version == before


async def test_a_canary_sent_is_a_change() -> None:
    record = fresh()
    before = record.version
    task = asyncio.create_task(asyncio.sleep(0))
    record.canary_sent(task, NOW)
    assert record.canary_task is task and record.last_canary_sent == NOW and record.version > before
    await task


def test_undo_is_a_change_too() -> None:
    record = fresh()
    record.set_draining(True)
    drained = record.version
    assert record.set_draining(False) and record.version > drained


@pytest.mark.parametrize("field", ["verdict", "draining", "polls", "poll_errors", "canaries", "gpu_faults", "model",
                                   "canary_task", "gpu_fault_errors", "history", "version"])
def test_what_the_record_holds_cannot_be_assigned(field: str) -> None:
    with pytest.raises(AttributeError):
        setattr(fresh(), field, None)


def test_no_module_but_state_reaches_into_the_record() -> None:
    # The record's own attributes are underscored; only llm_vitals/exporter/state.py may name them
    # (another class's `self._version` is its own business).
    private = {slot for slot in TargetRecord.__slots__ if slot.startswith("_")}
    assert "_verdict" in private and "_version" in private
    pattern = re.compile(r"(\w+)\s*\.\s*(" + "|".join(sorted(private)) + r")\b")
    state = REPO / "llm_vitals" / "exporter" / "state.py"
    offenders = []
    for folder in ("llm_vitals", "bench", "tools", "tests"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == state or ".cache" in path.parts:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if any(match.group(1) not in ("self", "cls") for match in pattern.finditer(line)):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
