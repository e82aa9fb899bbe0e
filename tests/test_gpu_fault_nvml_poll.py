"""The NVML source inside the exporter: `gpus:` and `gpu_faults.nvml` in the config; a live exporter whose
target's GPU faults through NVML (API, metric, readiness, status page, and the remediator's refusal);
a hung NVML call that stalls neither a poll nor a probe; and a host without nvidia-ml-py.

The NVML side is the source's seam (tests/test_gpu_fault_nvml_source.py's Scripted backend), never a
fake NVML library; the target is a real aiohttp server on loopback.
"""

from __future__ import annotations

import importlib.util
import queue
import time

import pytest
import yaml
from conftest import REPO
from test_exporter_helpers import BUSY_PAGE, IDLE_PAGE, FakeVllm, make_settings, make_target, record, start_exporter, target_json, wait_for
from test_gpu_fault_nvml_source import GPU0, HEALTHY, Hang, Scripted

from llm_vitals.exporter.gpu_faults.nvml import REMAPPED_ROWS
from llm_vitals.exporter.gpu_faults.nvml_source import NvmlSource
from llm_vitals.exporter.keys import POLLER
from llm_vitals.exporter.settings import ConfigError, load_settings, parse_settings
from llm_vitals.remediator.exporter_client import status_of
from llm_vitals.remediator.gate import AlertFacts, FleetView, GatePolicy, JournalState, decide
from llm_vitals.remediator.settings import load_settings as load_remediator_settings
from llm_vitals.targets import TargetView

FAILED_REMAP = {**HEALTHY, REMAPPED_ROWS: (0, 2, 0, 1)}


def settings_with(**target):
    return parse_settings({"targets": [{"name": "a", "url": "http://127.0.0.1:8000", **target}]}, "test", environ={})


@pytest.mark.parametrize("gpus", [[0], [0, 1], ["3"], [GPU0.uuid], [1, GPU0.uuid]])
def test_a_target_names_its_gpus_by_index_or_uuid(gpus):
    assert settings_with(gpus=gpus).targets[0].gpus == gpus


@pytest.mark.parametrize(("gpus", "message"), [
    ([-1], "a GPU is named by its index (0, 1, ...) or its UUID (GPU-...), not -1"),
    (["gpu0"], "not 'gpu0'"),
    (["GPU-"], "not 'GPU-'"),
    ([], "at least 1 item"),
])  # fmt: skip
def test_a_gpu_named_otherwise_is_a_config_error_naming_the_key(gpus, message):
    with pytest.raises(ConfigError) as caught:
        settings_with(gpus=gpus)
    assert str(caught.value).startswith("test: targets[0].gpus") and message in str(caught.value)


def test_the_nvml_settings_have_their_defaults_and_refuse_a_zero_bound():
    nvml = settings_with().gpu_faults.nvml
    assert (nvml.xids, nvml.interval, nvml.call_timeout, nvml.init_timeout) == ([], 5.0, 1.0, 10.0)
    with pytest.raises(ConfigError, match=r"^test: gpu_faults\.nvml\.call_timeout: must be > 0$"):
        parse_settings({"targets": [{"name": "a", "url": "http://127.0.0.1:8000"}],
                        "gpu_faults": {"nvml": {"call_timeout": 0}}}, "test", environ={})  # fmt: skip


def test_the_single_gpu_unit_sets_configs_pass_check_config(tmp_path):
    folder = REPO / "deploy" / "systemd" / "single-gpu"
    exporter = load_settings(folder / "exporter.yaml", environ={})
    assert exporter.targets[0].gpus == [0] and exporter.targets[0].url.port == 8000
    token = tmp_path / "webhook-token"
    token.write_text("s3cret\n")
    config = yaml.safe_load((folder / "remediator.yaml").read_text())
    config["auth"]["bearer_token_file"] = str(token)  # the credential systemd would hand over
    config["state_path"] = str(tmp_path / "remediator.db")
    (tmp_path / "remediator.yaml").write_text(yaml.safe_dump(config))
    remediator = load_remediator_settings(tmp_path / "remediator.yaml", environ={})
    assert set(remediator.targets) == {exporter.targets[0].name}


async def nvml_exporter(aiohttp_server, aiohttp_client, backend: Scripted, page: bytes = BUSY_PAGE, **nvml):
    """A live exporter with one target on GPU 0, its NVML source swapped for one over `backend`."""
    vllm = FakeVllm(page)
    server = await aiohttp_server(vllm.app())
    settings = make_settings([make_target("gpu-a", str(server.make_url("")), gpus=[0])])
    client = await start_exporter(aiohttp_client, settings)
    poller = client.app[POLLER]
    source = NvmlSource(backend, interval=0.01, event_wait=0.05, retry=0.01, **nvml)
    before, poller.nvml_source.source = poller.nvml_source.source, source
    if before is not None:
        before.stop()
    return client, record(client, "gpu-a"), source


async def test_a_gpu_fault_read_through_nvml_flags_the_target_everywhere_and_the_remediator_refuses(aiohttp_server, aiohttp_client):
    backend = Scripted(xid_events=False)
    backend.reads[0] = queue.Queue()
    for _ in range(10_000):  # every read: a failed row remap
        backend.reads[0].put(FAILED_REMAP)
    client, rec, _ = await nvml_exporter(aiohttp_server, aiohttp_client, backend)
    await wait_for(lambda: rec.gpu_fault and rec.verdict.state == "stuck", what="a GPU fault on a stuck target")

    view = await target_json(client, "gpu-a")
    assert view["gpu_fault"] is True and view["gpu_fault_source"] == "nvml" and view["ready"] is False
    assert view["gpu_fault_detail"].startswith(f"row_remap_failure: {GPU0}: NVML remapped rows: correctable 0, "
                                               "uncorrectable 2, pending 0, failure 1: a row remap failed, replace the GPU")
    assert view["gpu_fault_errors"] == {}
    assert 'llm_vitals_gpu_fault{target="gpu-a"} 1.0' in await (await client.get("/metrics")).text()
    assert (await client.get("/probe/gpu-a/ready")).status == 503
    assert "GPU fault" in await (await client.get("/")).text()

    # The remediator's re-check of this very answer: stuck, but the GPU is faulty, so no restart.
    status = status_of(TargetView.model_validate(view), view)
    alert = AlertFacts("firing", {"alertname": "LLMServerStuck", "target": "gpu-a", "remediation": "restart"},
                       "fp", time.time() - 60)  # fmt: skip
    policy = GatePolicy(targets=frozenset({"gpu-a"}), global_cooldown=900, max_restarts=3, budget_window=3600,
                        max_unhealthy=1)  # fmt: skip
    decision = decide(alert, FleetView({"gpu-a": status}), JournalState(), policy, time.time())
    assert decision.reason == "gpu_fault" and not decision.allowed
    assert "row_remap_failure" in decision.detail


async def test_a_hung_nvml_call_stalls_no_poll_nor_probe_and_is_an_error_never_a_fault(aiohttp_server, aiohttp_client):
    backend = Scripted(xid_events=False)
    hang = Hang(then=dict(HEALTHY))
    backend.reads[0] = queue.Queue()
    backend.reads[0].put(hang)
    client, rec, source = await nvml_exporter(aiohttp_server, aiohttp_client, backend, page=IDLE_PAGE, call_timeout=0.2)
    try:
        await wait_for(hang.entered.is_set, what="the reader in the hung call")  # awaited: the polls start the source
        # The source's threads hang; the polls go on (real time, 0.2 s each) and see the bound pass.
        polls = rec.polls
        error = await wait_for(lambda: rec.gpu_fault_errors.get("nvml"), what="nvml_timeout shown")
        assert error.startswith("nvml_timeout: nvmlDeviceGetRemappedRows (GPU 0) has not returned for ")
        await wait_for(lambda: rec.polls >= polls + 5, what="five more polls while NVML hangs")
        assert rec.poll_duration is not None and rec.poll_duration < 0.5  # the page read; NVML is not waited on
        began = time.monotonic()
        assert (await client.get("/probe/gpu-a/ready")).status == 200  # idle, canaries answered, no fault
        assert time.monotonic() - began < 1.0
        view = await target_json(client, "gpu-a")
        assert view["gpu_fault"] is False and view["gpu_fault_errors"]["nvml"].startswith("nvml_timeout: ")
    finally:
        hang.release.set()
    await wait_for(lambda: "nvml" not in rec.gpu_fault_errors, what="the error cleared once the call returned")
    assert rec.gpu_fault is None
    source.stop()


async def test_without_nvidia_ml_py_the_exporter_runs_and_shows_why_never_a_fault(aiohttp_server, aiohttp_client):
    server = await aiohttp_server(FakeVllm(IDLE_PAGE).app())
    client = await start_exporter(aiohttp_client, make_settings([make_target("gpu-a", str(server.make_url("")), gpus=[0])]))
    rec = record(client, "gpu-a")
    error = await wait_for(lambda: rec.gpu_fault_errors.get("nvml"), what="the NVML source's error")
    if importlib.util.find_spec("pynvml") is None:  # the test venv: the [gpu] extra is not installed
        assert error == "nvml_unavailable: nvidia-ml-py is not installed: pip install 'llm-vitals[gpu]'"
    else:  # nvidia-ml-py without a driver (a GPU host would open)
        assert error.startswith("nvml_init: NVMLError_")
    await wait_for(lambda: rec.verdict.state == "idle", what="idle")
    view = await target_json(client, "gpu-a")
    assert view["gpu_fault"] is False and view["state"] == "idle"
