"""The NVML rules (llm_vitals/exporter/gpu_faults/nvml.py), table-tested on the real H200 reading and variants of it.

`nvml-h200-healthy.json` is a real NVML read of a healthy H200 (tests/fixtures/gpu/README.md); every
faulty case below is that read with one field changed, as a faulty GPU would answer it.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import FIXTURES

from llm_vitals.exporter.gpu_faults import combine
from llm_vitals.exporter.gpu_faults.nvml import (
    ECC_VOLATILE_UNCORRECTED,
    HEALTH_FIELDS,
    RECOVERY_ACTION,
    REMAPPED_ROWS,
    RETIRED_PAGES_PENDING,
    GpuId,
    GpuRead,
    GpuStatus,
    NvmlError,
    NvmlRules,
    NvmlView,
    XidEvent,
    nvml_fault,
    overdue,
    read_errors,
    read_fault,
    read_from_capture,
    read_to_capture,
    select,
)
from llm_vitals.exporter.gpu_faults.xids import XidRules

CAPTURE = json.loads((FIXTURES / "gpu" / "nvml-h200-healthy.json").read_text())
H200 = read_from_capture(CAPTURE["gpus"][0], index=0, at=1_000.0)
UUID = "GPU-00000000-1111-2222-3333-444444444444"
RULES = NvmlRules()
LOST = NvmlError("GpuIsLost", "GPU is lost")
UNKNOWN = NvmlError("Unknown", "Unknown Error")


def variant(**fields) -> GpuRead:
    """The real H200 read with these fields changed."""
    return replace(H200, fields={**H200.fields, **fields})


def view(*statuses: GpuStatus, error: str | None = None) -> NvmlView:
    return NvmlView(tuple(statuses), error=error, opened=True)


def test_the_real_h200_read_has_every_health_field_and_retired_pages_unsupported():
    assert H200.gpu == GpuId(0, UUID)
    # The capture's recovery action is a field struct it did not convert (`{}`): not read here (nvidia-smi -q on
    # the same GPU: "GPU Recovery Action: None"). The project's own backend reads it (tests/real_gpu/).
    assert set(H200.fields) == set(HEALTH_FIELDS) - {RECOVERY_ACTION}
    assert H200.fields[ECC_VOLATILE_UNCORRECTED] == 0
    assert H200.fields[REMAPPED_ROWS] == (0, 0, 0, 0)
    assert H200.fields[RETIRED_PAGES_PENDING] == NvmlError("NotSupported", "Not Supported")


def test_the_real_h200_is_healthy_and_its_unsupported_field_is_no_error():
    assert read_fault(H200) is None
    assert read_errors(H200) == []
    assert nvml_fault(view(GpuStatus(H200.gpu, H200)), [0], RULES) == (None, None)


@pytest.mark.parametrize(("fields", "reason", "says"), [
    ({REMAPPED_ROWS: (0, 3, 0, 1)}, "row_remap_failure", "failure 1"),
    ({REMAPPED_ROWS: (0, 1, 1, 0)}, "row_remap_pending", "a GPU reset is owed"),
    ({ECC_VOLATILE_UNCORRECTED: 2}, "ecc_uncorrectable", "2 volatile uncorrectable ECC errors"),
    ({ECC_VOLATILE_UNCORRECTED: 1}, "ecc_uncorrectable", "1 volatile uncorrectable ECC error since"),
    ({RETIRED_PAGES_PENDING: 1}, "retired_pages_pending", "pages wait to be retired"),
    ({name: LOST for name in HEALTH_FIELDS}, "gpu_lost", "NVML_ERROR_GPU_IS_LOST"),
    ({REMAPPED_ROWS: LOST}, "gpu_lost", "answered to remapped_rows"),
    ({ECC_VOLATILE_UNCORRECTED: NvmlError("ResetRequired", "GPU requires restart")}, "gpu_reset_required", "needs a reset"),
    ({ECC_VOLATILE_UNCORRECTED: UNKNOWN}, "gpu_unknown_error", "NVML_ERROR_UNKNOWN to ecc_volatile_uncorrected"),
    # Precedence: the worse fact first.
    ({REMAPPED_ROWS: (0, 3, 1, 1), ECC_VOLATILE_UNCORRECTED: 4}, "row_remap_failure", "replace the GPU"),
    ({REMAPPED_ROWS: (0, 1, 1, 0), ECC_VOLATILE_UNCORRECTED: 1}, "ecc_uncorrectable", "1 volatile"),
    ({REMAPPED_ROWS: LOST, ECC_VOLATILE_UNCORRECTED: 9}, "gpu_lost", "fallen off the bus"),
    ({REMAPPED_ROWS: (0, 0, 1, 0), ECC_VOLATILE_UNCORRECTED: UNKNOWN}, "row_remap_pending", "pending 1"),
])  # fmt: skip
def test_a_faulty_variant_of_the_real_read_is_a_fault_with_its_reason_first(fields, reason, says):
    detail = read_fault(variant(**fields))
    assert detail is not None and detail.startswith(f"{reason}: GPU 0 ({UUID})"), detail
    assert says in detail
    fault, error = nvml_fault(view(GpuStatus(H200.gpu, variant(**fields))), [UUID], RULES)
    assert fault is not None and fault.source == "nvml" and fault.detail == detail
    assert error is None


@pytest.mark.parametrize("fields", [
    {REMAPPED_ROWS: (5, 2, 0, 0)},  # rows remapped at the last reset: done, nothing owed
    {ECC_VOLATILE_UNCORRECTED: NvmlError("NotSupported", "Not Supported")},  # ECC off or absent
    {name: NvmlError("NotSupported", "Not Supported") for name in HEALTH_FIELDS},
    {RETIRED_PAGES_PENDING: 0},
])  # fmt: skip
def test_healthy_or_unsupported_fields_are_no_fault_and_no_error(fields):
    read = variant(**fields)
    assert read_fault(read) is None
    assert read_errors(read) == []


def test_a_field_that_cannot_be_read_for_another_reason_is_an_error_never_a_fault():
    read = variant(**{ECC_VOLATILE_UNCORRECTED: NvmlError("NoPermission", "Insufficient Permissions")})
    assert read_fault(read) is None
    fault, error = nvml_fault(view(GpuStatus(read.gpu, read)), [0], RULES)
    assert fault is None
    assert error == f"nvml_read: GPU 0 ({UUID}) ecc_volatile_uncorrected: NVMLError_NoPermission: Insufficient Permissions"


XID79 = XidEvent(UUID, 79, at=1_764_870_507.0)


@pytest.mark.parametrize(("events", "xids", "reason"), [
    ((XID79,), NvmlRules(), "Xid79"),
    ((XidEvent(UUID, 48, 5.0),), NvmlRules(), "Xid48"),
    ((XidEvent(UUID, 31, 5.0),), NvmlRules(), None),  # a page fault of the application: restart_app
    ((XidEvent(UUID, 31, 5.0), XidEvent(UUID, 95, 6.0)), NvmlRules(), "Xid95"),
    ((XidEvent(UUID, 119, 5.0),), NvmlRules(), "Xid119"),  # GSP: in the catalog's reset bucket now
    ((XidEvent(UUID, 94, 5.0),), NvmlRules(), None),  # contained ECC: restart the application
    ((XidEvent(UUID, 119, 5.0),), NvmlRules(XidRules.of({119: "restart_app"})), None),  # overridden
    ((XID79,), NvmlRules(XidRules.of({79: "ignore"})), None),
])  # fmt: skip
def test_a_listed_critical_xid_event_is_a_fault_held_whatever_the_read_says(events, xids, reason):
    status = GpuStatus(H200.gpu, H200, xids=events)  # the read itself is healthy
    fault, _ = nvml_fault(view(status), [0], xids)
    if reason is None:
        assert fault is None
    else:
        assert fault is not None and fault.detail.startswith(f"{reason}: GPU 0 ({UUID}): NVML critical Xid (")
        assert "held until the GPU is seen reset or the exporter restarts" in fault.detail


def test_the_xid_comes_before_what_the_read_shows_as_the_cause():
    status = GpuStatus(H200.gpu, variant(**{name: LOST for name in HEALTH_FIELDS}), xids=(XID79,))
    fault, _ = nvml_fault(view(status), [0], RULES)
    assert fault is not None and fault.detail.startswith("Xid79: ") and "2025-12-04T17:48:27Z" in fault.detail


def test_a_gpu_that_cannot_be_read_now_keeps_its_last_read_and_shows_the_error():
    timeout = "nvml_timeout: nvmlDeviceGetRemappedRows (GPU 0) has not returned for 3.0 s (bound 1 s)"
    healthy = GpuStatus(H200.gpu, H200, error=timeout)
    assert nvml_fault(view(healthy), [0], RULES) == (None, timeout)
    faulty = GpuStatus(H200.gpu, variant(**{REMAPPED_ROWS: (0, 0, 1, 0)}), error=timeout)
    fault, error = nvml_fault(view(faulty), [0], RULES)
    assert fault is not None and fault.detail.startswith("row_remap_pending: ")
    assert error == timeout


def test_before_the_first_read_there_is_neither_fault_nor_error():
    assert nvml_fault(view(GpuStatus(H200.gpu)), [0], RULES) == (None, None)


def test_the_source_error_is_shown_to_every_target_and_is_never_a_fault():
    unavailable = "nvml_unavailable: nvidia-ml-py is not installed"
    assert nvml_fault(NvmlView(error=unavailable), [0], RULES) == (None, unavailable)


GPU1 = GpuId(1, "GPU-11111111-1111-2222-3333-444444444444")
TWO = view(GpuStatus(H200.gpu, H200), GpuStatus(GPU1, replace(variant(**{ECC_VOLATILE_UNCORRECTED: 3}), gpu=GPU1)))


@pytest.mark.parametrize(("wanted", "reason", "error"), [
    ([0], None, None),
    ([1], "ecc_uncorrectable", None),
    (["1"], "ecc_uncorrectable", None),
    ([GPU1.uuid], "ecc_uncorrectable", None),
    ([GPU1.uuid.upper()], "ecc_uncorrectable", None),  # a UUID's hex digits in either case
    ([0, 1], "ecc_uncorrectable", None),  # tensor parallel: any of its GPUs
    ([1, 0, 1], "ecc_uncorrectable", None),
    ([2], None, "nvml_no_such_gpu: no GPU 2 on this host (NVML sees: GPU 0 (GPU-0000"),
    (["GPU-ffffffff-0000-0000-0000-000000000000", 1], "ecc_uncorrectable", "nvml_no_such_gpu: no GPU GPU-ffff"),
])  # fmt: skip
def test_a_target_reads_only_its_own_gpus_by_index_or_uuid(wanted, reason, error):
    fault, errors = nvml_fault(TWO, wanted, RULES)
    assert (fault.detail.split(":")[0] if fault else None) == reason
    if error is None:
        assert errors is None
    else:
        assert errors is not None and errors.startswith(error), errors


def test_select_keeps_the_targets_order_and_names_each_gpu_once():
    found, errors = select(TWO, [1, GPU1.uuid, 0])
    assert [s.gpu.index for s in found] == [1, 0] and errors == []


def test_a_gpu_lost_while_enumerated_is_found_by_index_only():
    lost = GpuId(0, None)
    status = GpuStatus(lost, GpuRead(lost, {name: LOST for name in HEALTH_FIELDS}))
    fault, _ = nvml_fault(view(status), [0], RULES)
    assert fault is not None and fault.detail.startswith("gpu_lost: GPU 0 (UUID unknown)")
    fault, error = nvml_fault(view(status), [UUID], RULES)
    assert fault is None and error.startswith(f"nvml_no_such_gpu: no GPU {UUID}")


def test_nvml_comes_after_the_other_sources_when_combined():
    fault, _ = nvml_fault(view(GpuStatus(H200.gpu, variant(**{ECC_VOLATILE_UNCORRECTED: 1}))), [0], RULES)
    assert combine([None, None, None, fault]) == fault


@pytest.mark.parametrize(("call", "since", "now", "expected"), [
    (None, None, 10.0, None),
    ("nvmlDeviceGetRemappedRows", 9.5, 10.0, None),
    ("nvmlDeviceGetRemappedRows", 9.0, 10.0, None),  # exactly the bound: not yet
    ("nvmlDeviceGetRemappedRows", 8.0, 10.0, "nvml_timeout: nvmlDeviceGetRemappedRows (GPU 0) has not returned for 2.0 s (bound 1 s)"),
])  # fmt: skip
def test_a_call_is_overdue_only_past_its_bound(call, since, now, expected):
    assert overdue(call, since, now, 1.0, "GPU 0") == expected


def test_the_capture_shape_round_trips():
    again = read_from_capture(read_to_capture(H200), index=0, at=H200.at)
    assert again == H200


def test_nvml_error_parses_pynvml_text():
    assert NvmlError.parse("NVMLError_GpuIsLost: GPU is lost") == LOST
    assert str(LOST) == "NVMLError_GpuIsLost: GPU is lost"
