"""A target's GPU read from a dcgm-exporter page: the adapter on pages rendered from dcgm-exporter's
own template (tests/fixtures/dcgm/), and a live exporter reading a real aiohttp server serving them."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from conftest import REPO
from fake_http import app_of
from test_exporter_helpers import BUSY_PAGE, FakeVllm, make_settings, make_target, record, start_exporter, target_json, wait_for

from llm_vitals.exporter.engines import PageError
from llm_vitals.exporter.gpu_faults import GpuReading
from llm_vitals.exporter.gpu_faults.dcgm import SharedPages, parse_page, select_gpus
from llm_vitals.exporter.keys import POLLER
from llm_vitals.exporter.settings import ConfigError, DcgmSettings, parse_settings


def busy_target(name: str, url: str, **overrides):
    """A target on the static busy page, kept `busy` (not `stuck`) however slow the box: readiness then depends on the GPU fault alone."""
    return make_target(name, url, stuck_after=600, **overrides)

PAGES = REPO / "tests" / "fixtures" / "dcgm"
HEALTHY = (PAGES / "healthy.txt").read_bytes()
XID79 = (PAGES / "gpu1-xid79.txt").read_bytes()
XID13 = (PAGES / "gpu1-xid13-warn.txt").read_bytes()
GPU0 = "GPU-5a1b0c2e-7f0d-4c41-9d0b-2f4a8e6c1d01"
GPU1 = "GPU-9e3c7b14-2a6f-4e85-b1c0-7d5e3f9a2b02"
# dcgm-exporter's per-Xid total for GPU 1 (DCGM_EXP_XID_ERRORS_TOTAL in its collectors: every Xid is seen).
TOTAL_95_0 = (
    b'# TYPE DCGM_EXP_XID_ERRORS_TOTAL counter\n'
    b'DCGM_EXP_XID_ERRORS_TOTAL{gpu="1",UUID="' + GPU1.encode() + b'",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",'
    b'hostname="gpu-node-1",container="vllm",namespace="llm",pod="vllm-b",xid="95"} 0\n'
)


def dcgm(**kwargs) -> DcgmSettings:
    return DcgmSettings.model_validate({"url": "http://127.0.0.1:9400/metrics", **kwargs})


def read_gpus(body: bytes, dcgm: DcgmSettings) -> list[GpuReading]:
    """The target's GPUs on this page, as the poller reads them: `parse_page`, then `select_gpus`."""
    return select_gpus(parse_page(body), dcgm)


def test_the_gpu_is_found_by_pod_or_by_uuid() -> None:
    [by_pod] = read_gpus(XID79, dcgm(pod="vllm-b", namespace="llm"))
    [by_uuid] = read_gpus(XID79, dcgm(uuid=GPU1))
    assert by_pod == by_uuid
    assert (by_pod.uuid, by_pod.gpu, by_pod.xid, by_pod.failing) == (GPU1, "1", 79.0, (("ALL", "DCGM_FR_FALLEN_OFF_BUS"),))
    [healthy] = read_gpus(XID79, dcgm(pod="vllm-a"))
    assert (healthy.uuid, healthy.xid, healthy.failing) == (GPU0, 0.0, ())


def test_a_warning_is_not_a_failure() -> None:
    [gpu] = read_gpus(XID13, dcgm(pod="vllm-b"))
    assert gpu.xid == 13.0 and gpu.failing == ()


def test_a_pod_with_several_gpus_reads_them_all() -> None:
    page = XID79.replace(b'pod="vllm-b"', b'pod="vllm-a"')
    assert [g.uuid for g in read_gpus(page, dcgm(pod="vllm-a"))] == [GPU0, GPU1]


def test_a_health_line_without_the_pod_labels_still_counts_for_the_pods_gpu() -> None:
    page = b"\n".join(line.replace(b',container="vllm",namespace="llm",pod="vllm-b"', b"")
                      if line.startswith(b"DCGM_EXP_GPU_HEALTH_STATUS") else line for line in XID79.split(b"\n"))
    [gpu] = read_gpus(page, dcgm(pod="vllm-b", namespace="llm"))
    assert gpu.failing == (("ALL", "DCGM_FR_FALLEN_OFF_BUS"),)


def test_dcgm_exporters_old_label_names_are_read() -> None:
    page = XID79.replace(b"UUID=", b"uuid=").replace(b"pod=", b"pod_name=").replace(b"namespace=", b"pod_namespace=")
    [gpu] = read_gpus(page, dcgm(pod="vllm-b", namespace="llm"))
    assert gpu.uuid == GPU1 and gpu.xid == 79.0


@pytest.mark.parametrize(("page", "settings", "error"), [
    (HEALTHY, {"pod": "vllm-z"}, "no GPU of pod vllm-z on the dcgm-exporter page"),
    (HEALTHY, {"pod": "vllm-a", "namespace": "other"}, "no GPU of pod vllm-a in namespace other"),
    (HEALTHY, {"uuid": "GPU-nope"}, "no GPU of UUID GPU-nope"),
    (b"<html><body>502 Bad Gateway</body></html>", {"pod": "vllm-a"}, "not a dcgm-exporter page"),
    (b"", {"pod": "vllm-a"}, "not a dcgm-exporter page"),
    (b"\xff\xfe", {"pod": "vllm-a"}, "not UTF-8"),
    (HEALTHY.replace(b'pod="vllm-a"} 0', b'pod="vllm-a"} zero', 1), {"pod": "vllm-a"}, "non-numeric"),
])
def test_bad_pages_are_a_page_error_with_the_reason(page, settings, error) -> None:
    with pytest.raises(PageError, match=error):
        read_gpus(page, dcgm(**settings))


@pytest.mark.parametrize(("gpu", "message"), [
    ({}, "exactly one of pod and uuid"),
    ({"pod": "a", "uuid": "GPU-x"}, "exactly one of pod and uuid"),
    ({"uuid": "GPU-x", "namespace": "llm"}, "namespace goes with pod"),
])
def test_the_gpu_must_be_named_once(gpu, message) -> None:
    config = {"targets": [{"name": "a", "url": "http://127.0.0.1:8000", "dcgm": {"url": "http://127.0.0.1:9400/metrics", **gpu}}]}
    with pytest.raises(ConfigError, match=message):
        parse_settings(config, "test", environ={})


class FakeDcgmExporter:
    """A dcgm-exporter stand-in on loopback serving the fixture pages; `mode` makes it misbehave."""

    def __init__(self) -> None:
        self.page = HEALTHY
        self.mode = "ok"  # ok | html | 404 | hang
        self.reads = 0

    def app(self) -> web.Application:
        return app_of(("GET", "/metrics", self._metrics))

    async def _metrics(self, request: web.Request) -> web.Response:
        self.reads += 1
        if self.mode == "hang":
            await asyncio.sleep(30)
        if self.mode == "html":
            return web.Response(text="<html><body>It works!</body></html>", content_type="text/html")
        if self.mode == "404":
            return web.Response(status=404, text="404 page not found")
        return web.Response(body=self.page, content_type="text/plain")


async def watching(aiohttp_server, aiohttp_client, fake: FakeDcgmExporter, gpu: dict[str, str], dcgm_timeout: float):
    """An exporter watching one busy vLLM, `gpu-b`, and its GPU (`gpu`) on `fake`: its client and the target's record."""
    vllm_server, dcgm_server = await aiohttp_server(FakeVllm(BUSY_PAGE).app()), await aiohttp_server(fake.app())
    settings = make_settings([busy_target("gpu-b", str(vllm_server.make_url("")),
                                          dcgm={"url": str(dcgm_server.make_url("/metrics")), **gpu})],
                             gpu_faults={"dcgm_timeout": dcgm_timeout})
    client = await start_exporter(aiohttp_client, settings)
    return client, record(client, "gpu-b")


async def dcgm_exporter(aiohttp_server, aiohttp_client, gpu: dict[str, str]):
    fake = FakeDcgmExporter()
    client, rec = await watching(aiohttp_server, aiohttp_client, fake, gpu, dcgm_timeout=0.5)
    await wait_for(lambda: rec.verdict.state == "busy" and getattr(rec.gpu_faults.of("dcgm").memory, "xids", None),
                   what="busy, Xid baseline read")
    return client, rec, fake


async def test_an_xid_change_to_79_flags_the_target_until_a_human_releases_it(aiohttp_server, aiohttp_client) -> None:
    client, rec, fake = await dcgm_exporter(aiohttp_server, aiohttp_client, {"pod": "vllm-b", "namespace": "llm"})
    view = await target_json(client, "gpu-b")
    assert view["gpu_fault"] is False and view["ready"] is True
    # The fixture pages are dcgm-exporter's defaults: the last Xid only, so events can be lost, and it says so.
    assert view["gpu_fault_errors"]["dcgm"].startswith("xid_events_lossy: GPU 1: the page has no DCGM_EXP_XID_ERRORS_TOTAL")
    assert 'llm_vitals_gpu_fault_events_lossy{target="gpu-b"} 1.0' in await (await client.get("/metrics")).text()

    fake.page = XID79
    await wait_for(lambda: rec.gpu_fault, what="gpu fault flagged")
    view = await target_json(client, "gpu-b")
    assert view["gpu_fault"] is True and view["ready"] is False and view["gpu_fault_source"] == "dcgm"
    assert view["gpu_fault_detail"].startswith(f"Xid79: dcgm-exporter DCGM_FI_DEV_XID_ERRORS changed 0 -> 79 on GPU 1 ({GPU1})")
    assert 'llm_vitals_gpu_fault{target="gpu-b"} 1.0' in await (await client.get("/metrics")).text()
    assert (await client.get("/probe/gpu-b/ready")).status == 503
    assert "GPU fault" in await (await client.get("/")).text()

    # The health watch passes again but the Xid gauge keeps 79: the fault holds.
    fake.page = XID79.replace(b'"DCGM_FR_FALLEN_OFF_BUS",health_watch="ALL",container="vllm",namespace="llm",pod="vllm-b"} 20',
                              b'"DCGM_FR_OK",health_watch="ALL",container="vllm",namespace="llm",pod="vllm-b"} 0')
    polls = rec.polls
    await wait_for(lambda: rec.polls >= polls + 3, what="three more polls")
    assert rec.gpu_fault is not None and rec.gpu_fault.startswith("Xid79")

    fake.page = HEALTHY  # the Xid gauge back to 0: a GPU reset, or a restarted dcgm-exporter that knows nothing
    polls = rec.polls
    await wait_for(lambda: rec.polls >= polls + 3, what="three more polls")
    assert rec.gpu_fault is not None and rec.gpu_fault.startswith("Xid79")  # issue 38: 0 is no release

    assert (await client.post("/api/v1/targets/gpu-b/gpu_fault/release")).status == 200
    await wait_for(lambda: rec.gpu_fault is None, what="gpu fault released")
    assert (await target_json(client, "gpu-b"))["ready"] is True


async def test_a_page_with_the_per_xid_totals_loses_no_event_and_says_nothing(aiohttp_server, aiohttp_client) -> None:
    fake = FakeDcgmExporter()
    fake.page = HEALTHY + TOTAL_95_0
    client, rec = await watching(aiohttp_server, aiohttp_client, fake, {"pod": "vllm-b"}, dcgm_timeout=0.5)
    await wait_for(lambda: rec.verdict.state == "busy" and getattr(rec.gpu_faults.of("dcgm").memory, "counts", None),
                   what="busy, the per-Xid totals read")
    assert (await target_json(client, "gpu-b"))["gpu_fault_errors"] == {}
    assert 'llm_vitals_gpu_fault_events_lossy{target="gpu-b"} 0.0' in await (await client.get("/metrics")).text()
    fake.page = HEALTHY + TOTAL_95_0.replace(b"} 0\n", b"} 1\n")  # a 95 whose gauge moved on (to 0 here): the total keeps it
    await wait_for(lambda: rec.gpu_fault, what="the 95 seen through its total")
    assert rec.gpu_fault.startswith("Xid95: dcgm-exporter DCGM_EXP_XID_ERRORS count for Xid 95 rose to 1")


async def test_a_gpu_by_uuid_with_failing_health_is_a_fault_while_it_fails(aiohttp_server, aiohttp_client) -> None:
    _, rec, fake = await dcgm_exporter(aiohttp_server, aiohttp_client, {"uuid": GPU1})
    fake.page = HEALTHY.replace(b'"DCGM_FR_OK",health_watch="MEM",container="vllm",namespace="llm",pod="vllm-b"} 0',
                                b'"DCGM_FR_VOLATILE_DBE_DETECTED",health_watch="MEM",container="vllm",namespace="llm",pod="vllm-b"} 20')
    await wait_for(lambda: rec.gpu_fault, what="gpu fault flagged")
    assert rec.gpu_fault.startswith("DCGM_FR_VOLATILE_DBE_DETECTED: dcgm-exporter DCGM_EXP_GPU_HEALTH_STATUS FAIL on GPU 1")
    fake.page = HEALTHY
    await wait_for(lambda: rec.gpu_fault is None, what="gpu fault cleared")


@pytest.mark.parametrize(("mode", "gpu", "error"), [
    ("html", {"pod": "vllm-b"}, "bad_metrics: not a dcgm-exporter page"),
    ("404", {"pod": "vllm-b"}, "http_status: dcgm-exporter answered HTTP 404"),
    ("hang", {"pod": "vllm-b"}, "timeout:"),
    ("ok", {"pod": "vllm-gone"}, "bad_metrics: no GPU of pod vllm-gone"),
])
async def test_a_dcgm_exporter_that_cannot_be_read_is_an_error_kept_never_a_fault(aiohttp_server, aiohttp_client, mode, gpu, error) -> None:
    fake = FakeDcgmExporter()
    fake.mode = mode
    client, rec = await watching(aiohttp_server, aiohttp_client, fake, gpu, dcgm_timeout=0.3)
    await wait_for(lambda: rec.verdict.state == "busy" and "dcgm" in rec.gpu_fault_errors, what="busy, the dcgm error kept")
    view = await target_json(client, "gpu-b")
    assert view["gpu_fault_errors"]["dcgm"].startswith(error)
    assert view["gpu_fault"] is False and view["ready"] is True  # doubt is never a fault, and the server is still judged


async def test_an_unreadable_page_holds_an_xid_fault_and_never_loses_the_baseline(aiohttp_server, aiohttp_client) -> None:
    _, rec, fake = await dcgm_exporter(aiohttp_server, aiohttp_client, {"pod": "vllm-b"})
    fake.page = XID79
    await wait_for(lambda: rec.gpu_fault, what="gpu fault flagged")
    fake.mode = "html"
    await wait_for(lambda: "dcgm" in rec.gpu_fault_errors, what="the dcgm error kept")
    assert rec.gpu_fault is not None and rec.gpu_fault.startswith("Xid79")
    fake.mode = "ok"
    await wait_for(lambda: not rec.gpu_fault_errors.get("dcgm", "").startswith("bad_metrics"), what="the error gone")
    assert rec.gpu_fault is not None and rec.gpu_fault.startswith("Xid79")


async def test_targets_on_one_node_share_one_read_of_its_page_per_interval() -> None:
    now, fetched = [0.0], []

    async def fetch(url: str):
        fetched.append(url)
        if url.endswith("/broken"):
            raise PageError("timeout", "no answer")
        return parse_page(HEALTHY)

    pages = SharedPages(fetch, fresh_for=4.5, clock=lambda: now[0])
    bodies = await asyncio.gather(*[pages.get("http://n1:9400/metrics") for _ in range(8)])  # 8 GPUs, one read
    assert bodies == [parse_page(HEALTHY)] * 8 and fetched == ["http://n1:9400/metrics"]
    now[0] = 4.4
    await pages.get("http://n1:9400/metrics")
    assert len(fetched) == 1
    now[0] = 4.5
    await pages.get("http://n1:9400/metrics")
    await pages.get("http://n2:9400/metrics")  # another node: its own read
    assert len(fetched) == 3
    for _ in range(2):  # a failed read is shared too, each asker gets the error
        with pytest.raises(PageError, match="no answer"):
            await pages.get("http://n1:9400/broken")
    assert len(fetched) == 4


async def test_a_live_exporter_reads_a_shared_dcgm_exporter_once_per_poll_not_once_per_target(aiohttp_server, aiohttp_client) -> None:
    vllm, fake = FakeVllm(BUSY_PAGE), FakeDcgmExporter()
    vllm_server, dcgm_server = await aiohttp_server(vllm.app()), await aiohttp_server(fake.app())
    url = str(dcgm_server.make_url("/metrics"))
    settings = make_settings([busy_target(name, str(vllm_server.make_url("")), dcgm={"url": url, "pod": pod})
                              for name, pod in (("gpu-a", "vllm-a"), ("gpu-b", "vllm-b"))])
    client = await start_exporter(aiohttp_client, settings)
    a, b = record(client, "gpu-a"), record(client, "gpu-b")
    await wait_for(lambda: a.polls >= 10 and b.polls >= 10, what="ten polls each")
    fake.page = XID79
    await wait_for(lambda: b.gpu_fault, what="gpu-b flagged")
    assert a.gpu_fault is None
    reads = client.app[POLLER].dcgm_pages.reads
    assert fake.reads == reads and reads <= max(a.polls, b.polls) + 2 < a.polls + b.polls
