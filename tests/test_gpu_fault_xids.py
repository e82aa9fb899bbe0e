"""Xids by NVIDIA's catalog, none lost, none cleared by a milder one, and a held one cleared by a GPU reset.

Issue 29's GPU cases, each failing on the code before it: the NVML reader kept the first 16 events
(16 application Xids, then a 79, flagged nothing); dcgm-exporter's gauge keeps only the last Xid (a
95 then a 43 within a poll was never flagged, and a held 95 was cleared by a later 43); the default
list lacked 74, 119, 120 and 154 and held 94, which the catalog says an application restart handles;
an NVML fault was held until the exporter restarted, even after a GPU reset.
"""

from __future__ import annotations

import queue

import pytest
from test_exporter_helpers import wait_for
from test_gpu_fault_dcgm import GPU1, HEALTHY, dcgm, read_gpus
from test_gpu_fault_nvml_poll import nvml_exporter
from test_gpu_fault_nvml_source import GPU0, Scripted, clock, make_source, read_of, wait_until  # noqa: F401  (fixtures)
from test_gpu_fault_nvml_source import HEALTHY as NVML_HEALTHY

from llm_vitals.exporter.gpu_faults import DcgmState, GpuReading, SourceRead, dcgm_fault
from llm_vitals.exporter.gpu_faults.dcgm import DcgmSource, SharedPages
from llm_vitals.exporter.gpu_faults.nvml import (
    GPU_IS_LOST,
    RECOVERY_ACTION,
    GpuRead,
    GpuStatus,
    NvmlError,
    NvmlRules,
    NvmlView,
    XidEvent,
    came_back,
    nvml_fault,
)
from llm_vitals.exporter.gpu_faults.xids import CATALOG, XidRules
from llm_vitals.exporter.settings import ConfigError, parse_settings

RULES = XidRules()


# NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, "Resolution
# Bucket (Immediate Action)"; as NVSentinel's xiderrorsmapping.csv ships it).
@pytest.mark.parametrize(("xid", "bucket", "fault"), [
    (48, "reset_gpu", True),  # double-bit ECC: WORKFLOW_XID_48, a GPU reset
    (63, "ignore", False),  # a row marked for remapping (the pending remap is read as a level)
    (64, "reset_gpu", True),  # a row remap failed
    (74, "reset_gpu", True),  # NVLink: WORKFLOW_NVLINK_ERR
    (79, "reboot_node", True),  # fallen off the bus: RESTART_BM
    (92, "ignore", False),  # excessive single-bit ECC interrupts
    (94, "restart_app", False),  # contained ECC: RESTART_APP, the GPU is fine
    (95, "reset_gpu", True),  # uncontained ECC
    (119, "reset_gpu", True),  # GSP RPC timeout
    (120, "reset_gpu", True),  # GSP error
    (154, "follow", False),  # the driver changed the GPU's recovery action: the Xid it came with decides
    (159, "ignore", False),  # a CHI non-fatal error (issue 38)
    (13, "restart_app", False),
    (31, "restart_app", False),
    (43, "ignore", False),
    (45, "restart_app", False),
    (999, "reset_gpu", True),  # not in the catalog (a newer driver's): fail closed, no restart on that GPU
])
def test_the_catalogs_buckets(xid: int, bucket: str, fault: bool) -> None:
    assert (RULES.bucket(xid), RULES.is_fault(xid)) == (bucket, fault)


def test_the_buckets_are_overridable_by_config() -> None:
    settings = parse_settings({"gpu_faults": {"xid_buckets": {94: "reset_gpu", 79: "ignore"}, "dcgm_xids": [13]},
                               "targets": [{"name": "a", "url": "http://127.0.0.1:8000"}]}, "test")
    dcgm_rules, nvml_rules = settings.gpu_faults.dcgm_xid_rules, settings.gpu_faults.nvml_xid_rules
    assert (dcgm_rules.is_fault(94), dcgm_rules.is_fault(79), dcgm_rules.is_fault(13)) == (True, False, True)
    assert (nvml_rules.is_fault(94), nvml_rules.is_fault(13)) == (True, False)
    with pytest.raises(ConfigError, match="xid_buckets"):
        parse_settings({"gpu_faults": {"xid_buckets": {94: "cordon"}}}, "test")


def test_the_worst_is_kept() -> None:
    assert RULES.worst([45, 95, 43, 79, 48]) == 79
    assert RULES.worst([13, 43, 94]) is None
    assert set(CATALOG) >= {48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154}


# -- NVML ---------------------------------------------------------------------------------------

H200 = GpuRead(GPU0, dict(NVML_HEALTHY), 0.0)


def status(*events: XidEvent, reset_at: float | None = None) -> NvmlView:
    return NvmlView((GpuStatus(GPU0, H200, events, reset_at=reset_at),), opened=True)


@pytest.mark.parametrize(("events", "reset_at", "reason"), [
    ((XidEvent(GPU0.uuid, 45, 1.0, count=500), XidEvent(GPU0.uuid, 79, 2.0)), None, "Xid79"),
    ((XidEvent(GPU0.uuid, 95, 1.0), XidEvent(GPU0.uuid, 43, 2.0)), None, "Xid95"),  # the milder 43 came last
    ((XidEvent(GPU0.uuid, 95, 1.0), XidEvent(GPU0.uuid, 79, 2.0)), None, "Xid79"),  # the worst, not the first
    ((XidEvent(GPU0.uuid, 94, 1.0),), None, None),
    ((XidEvent(GPU0.uuid, 119, 1.0), XidEvent(GPU0.uuid, 120, 2.0)), None, "Xid119"),
    ((XidEvent(GPU0.uuid, 95, 1.0),), 5.0, None),  # the GPU was seen reset after it
    ((XidEvent(GPU0.uuid, 95, 1.0, count=2, last_at=6.0),), 5.0, "Xid95"),  # and it came again after the reset
])
def test_nvml_keeps_the_worst_xid_until_a_reset(events, reset_at, reason) -> None:
    fault, _ = nvml_fault(status(*events, reset_at=reset_at), [0], NvmlRules())
    assert (fault.detail.split(":")[0] if fault else None) == reason


LOST = NvmlError(GPU_IS_LOST, "GPU is lost")


@pytest.mark.parametrize(("before", "after", "back"), [
    ({RECOVERY_ACTION: 1}, {RECOVERY_ACTION: 0}, True),  # the driver asked for a reset, and no longer does
    ({RECOVERY_ACTION: 2}, {RECOVERY_ACTION: 0}, True),
    ({RECOVERY_ACTION: 1}, {RECOVERY_ACTION: 1}, False),
    ({RECOVERY_ACTION: 0}, {RECOVERY_ACTION: 0}, False),  # never in recovery: nothing was reset
    ({"ecc_volatile_uncorrected": LOST}, {"ecc_volatile_uncorrected": 0}, True),  # lost, then read again
    ({"ecc_volatile_uncorrected": LOST}, {"ecc_volatile_uncorrected": LOST}, False),
    (None, {RECOVERY_ACTION: 0}, False),  # the first read says nothing about a reset
])
def test_came_back(before, after, back) -> None:
    old = None if before is None else GpuRead(GPU0, {**NVML_HEALTHY, **before})
    assert came_back(old, GpuRead(GPU0, {**NVML_HEALTHY, **after})) is back


def test_a_recovery_action_is_a_fault_while_it_reads_so() -> None:
    asked = NvmlView((GpuStatus(GPU0, GpuRead(GPU0, {**NVML_HEALTHY, RECOVERY_ACTION: 1})),), opened=True)
    fault, _ = nvml_fault(asked, [0], NvmlRules())
    assert fault is not None and fault.detail.startswith("gpu_recovery_action:") and "a GPU reset" in fault.detail


def test_sixteen_application_xids_then_a_79_is_flagged(make_source) -> None:  # noqa: F811
    backend = Scripted()
    source = make_source(backend)
    wait_until(lambda: read_of(source), "the first read")
    for _ in range(16):
        backend.events.put([(GPU0.uuid, 45)])  # Xid 45 after each kill of an application
    backend.events.put([(GPU0.uuid, 79)])
    wait_until(lambda: any(e.xid == 79 for e in source.view().gpus[0].xids), "the Xid 79")
    fault, _ = nvml_fault(source.view(), [0], NvmlRules())
    assert fault is not None and fault.detail.startswith("Xid79:")
    (tally,) = [e for e in source.view().gpus[0].xids if e.xid == 45]
    assert tally.count == 16


def test_a_held_xid_clears_once_the_gpu_is_seen_reset(make_source) -> None:  # noqa: F811
    backend = Scripted()
    reads = backend.reads.setdefault(0, queue.Queue())
    source = make_source(backend)
    wait_until(lambda: read_of(source), "the first read")
    backend.events.put([(GPU0.uuid, 95)])
    wait_until(lambda: source.view().gpus[0].xids, "the Xid 95")
    assert nvml_fault(source.view(), [0], NvmlRules())[0] is not None
    reads.put({**NVML_HEALTHY, RECOVERY_ACTION: 1})  # the driver asks for a GPU reset (Xid 154's word)
    reads.put({**NVML_HEALTHY, RECOVERY_ACTION: 0})  # ... and, the GPU reset, no longer does
    wait_until(lambda: source.view().gpus[0].reset_at is not None, "the reset seen")
    assert nvml_fault(source.view(), [0], NvmlRules())[0] is None


# -- dcgm-exporter ------------------------------------------------------------------------------

def reading(xid: float, **counts: float) -> list[GpuReading]:
    return [GpuReading("GPU-a", "0", xid, (), {int(k[1:]): v for k, v in counts.items()})]


@pytest.mark.parametrize(("reads", "faults"), [
    # A 95 and then a 43 within one poll: the gauge shows only 43, the per-Xid count shows the 95.
    ([reading(0), reading(43, x95=1, x43=1)], [False, True]),
    ([reading(0, x95=0), reading(43, x95=1, x43=1)], [False, True]),
    # A held 95 is not cleared by a later 43, nor by its count falling out of the window ...
    ([reading(0), reading(95, x95=1), reading(43, x95=1, x43=1), reading(43)], [False, True, True, True]),
    # ... nor by the gauge back at 0, nor its counts: a restarted dcgm-exporter reads 0 too (issue 38).
    ([reading(0), reading(95, x95=1), reading(0, x95=1)], [False, True, True]),
    ([reading(0), reading(95, x95=1), reading(0, x95=0)], [False, True, True]),
    # 94 then 79: the worse replaces the milder; 79 then 95: the worse stays.
    ([reading(0), reading(79, x79=1), reading(95, x79=1, x95=1)], [False, True, True]),
    ([reading(0), reading(94, x94=1)], [False, False]),  # contained ECC: restart the application
    ([reading(0), reading(119, x119=1)], [False, True]),
])
def test_dcgm_no_critical_xid_is_lost_or_cleared_by_a_milder_one(reads, faults) -> None:
    state, seen, details = DcgmState(), [], []
    for gpus in reads:
        state, fault = dcgm_fault(state, gpus, RULES)
        seen.append(fault is not None)
        details.append(fault.detail if fault else "")
    assert seen == faults
    if reads[-1][0].xid == 95 and len(reads) == 3 and reads[1][0].xid == 79:
        assert details[-1].startswith("Xid79:")


COUNTS = (
    '# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge\n'
    f'DCGM_EXP_XID_ERRORS_COUNT{{gpu="1",UUID="{GPU1}",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",'
    'hostname="gpu-node-1",container="vllm",namespace="llm",pod="vllm-b",window_size_in_ms="300000",xid="95"} 1\n'
    f'DCGM_EXP_XID_ERRORS_COUNT{{gpu="1",UUID="{GPU1}",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",'
    'hostname="gpu-node-1",container="vllm",namespace="llm",pod="vllm-b",window_size_in_ms="300000",xid="43"} 1\n'
)


def test_the_per_xid_count_lines_are_read_for_the_targets_gpu() -> None:
    (gpu,) = read_gpus(HEALTHY + COUNTS.encode(), dcgm(pod="vllm-b"))
    assert gpu.uuid == GPU1 and gpu.xid_counts == {95: 1.0, 43: 1.0}
    (plain,) = read_gpus(HEALTHY, dcgm(pod="vllm-b"))
    assert plain.xid_counts is None


# -- a human's release ---------------------------------------------------------------------------


async def test_a_human_release_ends_a_held_dcgm_xid_at_the_next_read() -> None:
    lines = {"now": [("DCGM_FI_DEV_XID_ERRORS", {"gpu": "1", "UUID": GPU1, "pod": "vllm-b"}, 0.0)]}

    async def fetch(url: str):
        return tuple(lines["now"])

    target = parse_settings({"targets": [{"name": "a", "url": "http://127.0.0.1:8000",
                                          "dcgm": {"url": "http://127.0.0.1:9400/metrics", "pod": "vllm-b"}}]},
                            "test").targets[0]
    source = DcgmSource(SharedPages(fetch, fresh_for=0.0), RULES)
    read = await source.read(target, SourceRead())
    lines["now"] = [("DCGM_FI_DEV_XID_ERRORS", {"gpu": "1", "UUID": GPU1, "pod": "vllm-b"}, 79.0)]
    read = await source.read(target, read)
    assert read.fault is not None and read.fault.detail.startswith("Xid79:")
    assert (await source.read(target, read)).fault is not None  # the gauge keeps 79: held
    source.release(target)
    released = await source.read(target, read)
    assert released.fault is None and (await source.read(target, released)).fault is None


async def test_a_human_release_through_the_exporter_ends_a_held_nvml_xid(aiohttp_server, aiohttp_client) -> None:
    backend = Scripted()
    client, rec, source = await nvml_exporter(aiohttp_server, aiohttp_client, backend)
    await wait_for(lambda: read_of(source), what="the first NVML read")
    backend.events.put([(GPU0.uuid, 95)])
    await wait_for(lambda: rec.gpu_fault and rec.gpu_fault.startswith("Xid95:"), what="the Xid 95 held")
    answer = await client.post("/api/v1/targets/gpu-a/gpu_fault/release")
    assert answer.status == 200 and (await answer.json())["released"] == ["nvml"]
    await wait_for(lambda: rec.gpu_fault is None, what="the release applied at the next poll")
    assert (await client.post("/api/v1/targets/nope/gpu_fault/release")).status == 404
