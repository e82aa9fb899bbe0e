"""The pure GPU-fault rules (llm_vitals/exporter/gpu_faults/__init__.py): node conditions and taints, dcgm Xid/health, combining."""

from __future__ import annotations

import pytest

from llm_vitals.exporter.gpu_faults import (
    DcgmState,
    GpuFault,
    GpuReading,
    NodeRules,
    Taint,
    combine,
    dcgm_fault,
    file_fault,
    node_fault,
)
from llm_vitals.exporter.gpu_faults.xids import XidRules

RULES = NodeRules(taints=(Taint.parse("nvidia.com/gpu-xid-error"), Taint.parse("gpu=bad:NoExecute")))
READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}
MEM_OK = {"type": "GpuMemWatch", "status": "False", "reason": "GpuMemWatchIsHealthy", "message": "No Health Failures"}
MEM_BAD = {"type": "GpuMemWatch", "status": "True", "reason": "GpuMemWatchIsNotHealthy",
           "message": "ErrorCode:DCGM_FR_VOLATILE_DBE_DETECTED GPU:0 Recommended Action=RESTART_VM;"}
FELL_OFF = {"type": "SysLogsGPUFallenOff", "status": "True", "reason": "SysLogsGPUFallenOffIsNotHealthy",
            "message": "GPU has fallen off the bus"}
EKS_BAD = {"type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error", "message": "Xid 79"}
EKS_OK = {"type": "AcceleratedHardwareReady", "status": "True", "reason": "NvidiaReady", "message": ""}


@pytest.mark.parametrize(("conditions", "taints", "detail"), [
    ([], [], None),
    ([READY, MEM_OK, EKS_OK], [], None),
    ([READY, MEM_BAD], [], "GpuMemWatchIsNotHealthy: node n1 condition GpuMemWatch=True: ErrorCode:DCGM_FR_VOLATILE_DBE_DETECTED"),
    ([FELL_OFF, MEM_BAD], [], "SysLogsGPUFallenOffIsNotHealthy: node n1 condition SysLogsGPUFallenOff=True"),  # the node's order
    ([EKS_BAD], [], "NvidiaXID79Error: node n1 condition AcceleratedHardwareReady=False: Xid 79"),
    ([{"type": "GpuMemWatch", "status": "Unknown", "reason": "x"}], [], None),  # doubt is not a fault
    ([{"type": "AcceleratedHardwareReady", "status": "Unknown"}], [], None),
    ([{"type": "MemoryPressure", "status": "True", "reason": "KubeletHasInsufficientMemory"}], [], None),  # not a GPU condition
    ([{"type": "GpuMemWatch", "status": "True"}], [], "GpuMemWatchIsNotHealthy: node n1 condition GpuMemWatch=True"),  # no reason given
    ([], [{"key": "nvidia.com/gpu-xid-error", "value": "true", "effect": "NoSchedule"}],
     "nvidia.com/gpu-xid-error: node n1 is tainted nvidia.com/gpu-xid-error=true:NoSchedule"),
    ([], [{"key": "gpu", "value": "bad", "effect": "NoSchedule"}], None),  # effect must match
    ([], [{"key": "gpu", "value": "good", "effect": "NoExecute"}], None),  # value must match
    ([], [{"key": "gpu", "value": "bad", "effect": "NoExecute"}], "gpu: node n1 is tainted gpu=bad:NoExecute"),
    ([], [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}], None),
    ([MEM_BAD], [{"key": "nvidia.com/gpu-xid-error", "effect": "NoSchedule"}], "GpuMemWatchIsNotHealthy:"),  # conditions first
])
def test_node_fault_table(conditions, taints, detail) -> None:
    fault = node_fault("n1", conditions, taints, RULES)
    if detail is None:
        assert fault is None
    else:
        assert fault is not None and fault.source == "node" and fault.detail.startswith(detail)


def test_node_conditions_are_configurable() -> None:
    rules = NodeRules(conditions=frozenset({"MyNpdGpuProblem"}), ready_conditions=frozenset())
    assert node_fault("n", [MEM_BAD, EKS_BAD], [], rules) is None
    fault = node_fault("n", [{"type": "MyNpdGpuProblem", "status": "True", "reason": "XidSeen", "message": "m"}], [], rules)
    assert fault == GpuFault("node", "XidSeen: node n condition MyNpdGpuProblem=True: m")


def test_long_messages_are_clipped_and_flattened() -> None:
    fault = node_fault("n", [{**MEM_BAD, "message": "line\n" * 500}], [], RULES)
    assert fault is not None and len(fault.detail) <= 300 and "\n" not in fault.detail


@pytest.mark.parametrize(("text", "taint"), [
    ("k", Taint("k")),
    ("k=v", Taint("k", "v")),
    ("k:NoSchedule", Taint("k", None, "NoSchedule")),
    ("example.com/k=v:NoExecute", Taint("example.com/k", "v", "NoExecute")),
    ("k=", Taint("k", "")),
])
def test_taint_patterns_parse(text, taint) -> None:
    assert Taint.parse(text) == taint


def test_a_taint_pattern_without_a_key_is_refused() -> None:
    with pytest.raises(ValueError, match="key is empty"):
        Taint.parse("=v:NoSchedule")


XIDS = XidRules()


def gpu(xid: float | None, *failing: tuple[str, str], uuid: str = "GPU-a") -> GpuReading:
    return GpuReading(uuid, "0", xid, tuple(failing))


# Each row: the Xid values read in turn (None: the page could not be read); whether a fault shows after each.
@pytest.mark.parametrize(("xids", "faults"), [
    ([0, 0, 0], [False, False, False]),
    ([79], [False]),  # the first read is a baseline: a 79 from before we started is not known to be current
    ([0, 79, 79, 79], [False, True, True, True]),  # the gauge keeps 79: the fault holds
    ([0, 79, 0, 0], [False, True, True, True]),  # back to 0 (a restarted dcgm-exporter reads 0 too) never clears it
    ([0, 95, 0, 13], [False, True, True, True]),  # (issue 38): only a human's release ends a held Xid
    ([0, 154], [False, True]),  # a lone 154 where only the last Xid is kept: the Xid it followed was lost
    ([0, 62, 154, 45], [False, True, True, True]),  # 62 -> 154 -> 45, read one by one: the 62 holds
    ([0, 159, 159], [False, False, False]),  # 159, a CHI non-fatal error: nothing to do
    ([0, 79, 13], [False, True, True]),  # a milder Xid after it never clears it (issue 29)
    ([0, 95, 43, 43], [False, True, True, True]),  # nor does an application's 43 clear a held 95
    ([0, 94, 13], [False, False, False]),  # 94 (contained ECC): the catalog says restart the application
    ([0, 13, 13], [False, False, False]),  # a fault bucket only
    ([0, 48, 95], [False, True, True]),  # listed to listed: still a fault (the detail follows)
    ([0, 79, None, 79], [False, True, True, True]),  # an unreadable page holds, never clears
    ([0, None, 79], [False, False, True]),  # nor does it lose the baseline
    ([None, 79], [False, False]),  # no baseline before the first good read
    ([0, 94.5], [False, False]),  # not an integer Xid
])
def test_dcgm_xid_change_table(xids, faults) -> None:
    state, seen = DcgmState(), []
    for xid in xids:
        state, fault = dcgm_fault(state, None if xid is None else [gpu(xid)], XIDS)
        seen.append(fault is not None)
    assert seen == faults


def test_dcgm_xid_detail_names_the_change_and_the_gpu() -> None:
    state, _ = dcgm_fault(DcgmState(), [gpu(0)], XIDS)
    state, fault = dcgm_fault(state, [gpu(79)], XIDS)
    assert fault == GpuFault("dcgm", "Xid79: dcgm-exporter DCGM_FI_DEV_XID_ERRORS changed 0 -> 79 on GPU 0 (GPU-a): "
                                     "the node needs a reboot")


def test_dcgm_health_fail_is_a_fault_while_it_reads_so() -> None:
    state, fault = dcgm_fault(DcgmState(), [gpu(0, ("ALL", "DCGM_FR_UNCONTAINED_ERROR"))], XIDS)
    assert fault is not None and fault.detail.startswith("DCGM_FR_UNCONTAINED_ERROR: dcgm-exporter DCGM_EXP_GPU_HEALTH_STATUS FAIL")
    state, fault = dcgm_fault(state, [gpu(0)], XIDS)
    assert fault is None
    _, fault = dcgm_fault(state, [gpu(0, ("MEM", "DCGM_FR_OK"))], XIDS)  # FAIL without a code still names the watch
    assert fault is not None and fault.detail.startswith("DcgmHealthMEM:")


def test_dcgm_any_of_several_gpus_flags_and_each_gpu_has_its_own_baseline() -> None:
    state, _ = dcgm_fault(DcgmState(), [gpu(0, uuid="GPU-a"), gpu(13, uuid="GPU-b")], XIDS)
    state, fault = dcgm_fault(state, [gpu(0, uuid="GPU-a"), gpu(79, uuid="GPU-b")], XIDS)
    assert fault is not None and "GPU-b" in fault.detail
    state, fault = dcgm_fault(state, [gpu(0, uuid="GPU-a"), gpu(0, uuid="GPU-b")], XIDS)
    assert fault is not None and "GPU-b" in fault.detail  # 0 again is no release


def counted(**counts: float) -> GpuReading:
    """A GPU whose page has the per-Xid totals (DCGM_EXP_XID_ERRORS_TOTAL): every Xid is seen."""
    return GpuReading("GPU-a", "0", None, (), {int(xid[1:]): value for xid, value in counts.items()})


# Per-Xid totals read in turn -> whether a fault shows after each (issue 38: 154 and 159 as NVIDIA's catalog says).
@pytest.mark.parametrize(("reads", "faults"), [
    ([{}, {"x154": 1}], [False, False]),  # 154 follows the Xid it came with: alone, where nothing is lost, no fault
    ([{}, {"x62": 1, "x154": 1, "x45": 1}], [False, True]),  # 62 -> 154 -> 45 within one read: the 62's GPU reset
    ([{}, {"x154": 1, "x45": 1}], [False, False]),  # 154 with an application's 45: the 45 decides
    ([{}, {"x159": 3}], [False, False]),
    ([{}, {"x95": 1}, {}, {"x95": 0}], [False, True, True, True]),  # a restarted dcgm-exporter's counts from 0 keep it
    ([{}, {"x95": 1}, {}, {"x95": 1}], [False, True, True, True]),
])
def test_dcgm_per_xid_totals_follow_the_catalog(reads, faults) -> None:
    state, seen = DcgmState(), []
    for read in reads:
        state, fault = dcgm_fault(state, [counted(**read)], XIDS)
        seen.append(fault is not None)
    assert seen == faults


def test_a_lone_154_names_the_lost_xid() -> None:
    state, _ = dcgm_fault(DcgmState(), [gpu(0)], XIDS)
    _, fault = dcgm_fault(state, [gpu(154)], XIDS)
    assert fault is not None and fault.detail.startswith("Xid154: ") and "the Xid it followed was lost" in fault.detail


def test_dcgm_xid_buckets_are_configurable() -> None:
    rules = XidRules.of({13: "reset_gpu"})
    state, _ = dcgm_fault(DcgmState(), [gpu(0)], rules)
    _, fault = dcgm_fault(state, [gpu(13)], rules)
    assert fault is not None
    quiet = XidRules.of({79: "ignore"})
    state, _ = dcgm_fault(DcgmState(), [gpu(0)], quiet)
    _, fault = dcgm_fault(state, [gpu(79)], quiet)
    assert fault is None


def test_combine_keeps_the_first_source_flagged() -> None:
    file, node, dcgm = GpuFault("file", "f"), GpuFault("node", "n"), GpuFault("dcgm", "d")
    assert combine([None, None, None]) is None
    assert combine([file, node, dcgm]) == file
    assert combine([None, node, dcgm]) == node
    assert combine([None, None, dcgm]) == dcgm


XID79 = GpuFault("file", "Xid 79: GPU has fallen off the bus")


# (fault held, text read, read error) -> (fault, error): an unreadable file fails safe.
@pytest.mark.parametrize(("before", "text", "error", "fault", "shown"), [
    (None, "Xid 79: GPU has fallen off the bus\nmore\n", None, XID79, None),
    (XID79, "", None, None, None),  # empty or absent: the agent cleared it
    (XID79, "  \n", None, None, None),
    (XID79, None, "cannot read /run/gpu-a.fault: Is a directory", XID79, "cannot read /run/gpu-a.fault: Is a directory"),
    (None, None, "cannot read /run/gpu-a.fault: Permission denied", None, "cannot read /run/gpu-a.fault: Permission denied"),
    (None, "x" * 500, None, GpuFault("file", "x" * 200), None),
])
def test_gpu_fault_file_rule_keeps_the_last_fault_when_the_file_cannot_be_read(before, text, error, fault, shown) -> None:
    assert file_fault(before, text, error) == (fault, shown)
