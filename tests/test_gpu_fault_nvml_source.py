"""The NVML source's threads, bounds and errors (llm_vitals/exporter/gpu_faults/nvml_source.py), through its seam.

The backend here is a few plain functions that answer, fail or hang (a `Hang` blocks its thread on an
Event, as a hung NVML call blocks in C), never a fake NVML library. Time for the bounds is a clock
the test sets; threads are waited for by condition, with a deadline.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from llm_vitals.exporter.gpu_faults.nvml import (
    ECC_VOLATILE_UNCORRECTED,
    HEALTH_FIELDS,
    REMAPPED_ROWS,
    RETIRED_PAGES_PENDING,
    GpuId,
    NvmlError,
    NvmlRules,
    nvml_fault,
)
from llm_vitals.exporter.gpu_faults.nvml_pynvml import INSTALL_HINT, PynvmlBackend
from llm_vitals.exporter.gpu_faults.nvml_source import NvmlFailure, NvmlSource, Opened

GPU0 = GpuId(0, "GPU-00000000-1111-2222-3333-444444444444")
GPU1 = GpuId(1, "GPU-11111111-1111-2222-3333-444444444444")
# The real H200's answers (tests/fixtures/gpu/nvml-h200-healthy.json).
HEALTHY = {ECC_VOLATILE_UNCORRECTED: 0, REMAPPED_ROWS: (0, 0, 0, 0),
           RETIRED_PAGES_PENDING: NvmlError("NotSupported", "Not Supported")}  # fmt: skip
RULES = NvmlRules()
WITHIN_S = 5.0  # how long a test waits for a thread to get somewhere: generous for a loaded box


class Clock:
    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class Hang:
    """Block the calling thread, as a hung NVML call does, until `release` is set; then answer `then`."""

    release: threading.Event = field(default_factory=threading.Event)
    then: object = None
    entered: threading.Event = field(default_factory=threading.Event)


@dataclass
class Scripted:
    """The seam, scripted: each method takes its next answer from a queue (a value, an exception or a Hang)."""

    gpus: tuple[GpuId, ...] = (GPU0,)
    xid_events: bool = True
    opens: queue.Queue = field(default_factory=queue.Queue)
    reads: dict[int, queue.Queue] = field(default_factory=dict)
    events: queue.Queue = field(default_factory=queue.Queue)
    read_count: Counter = field(default_factory=Counter)
    closed: bool = False

    def _answer(self, item: object, default: Callable[[], object]) -> object:
        if isinstance(item, Hang):
            item.entered.set()
            item.release.wait(30)
            item = item.then
        if isinstance(item, BaseException):
            raise item
        return default() if item is None else item

    @staticmethod
    def _next(q: queue.Queue) -> object:
        try:
            return q.get_nowait()
        except queue.Empty:
            return None

    def open(self, step) -> Opened:
        step("nvmlInit")
        return self._answer(self._next(self.opens), lambda: Opened(self.gpus, self.xid_events))

    def read(self, gpu: GpuId, step):
        step("nvmlDeviceGetRemappedRows")
        item = self._next(self.reads.setdefault(gpu.index, queue.Queue()))
        answer = self._answer(item, lambda: dict(HEALTHY))
        self.read_count[gpu.index] += 1
        return answer

    def wait_xids(self, timeout: float, step):
        step("nvmlEventSetWait", expected=timeout)
        try:
            item = self.events.get(timeout=timeout)
        except queue.Empty:
            return []
        return self._answer(item, list)

    def close(self) -> None:
        self.closed = True


def wait_until(condition: Callable[[], object], what: str, within: float = WITHIN_S) -> object:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_source(clock):
    sources: list[NvmlSource] = []
    hangs: list[Hang] = []

    def make(backend: Scripted, **kwargs) -> NvmlSource:
        kwargs = {"interval": 0.01, "call_timeout": 1.0, "init_timeout": 10.0, "event_wait": 0.05, "retry": 0.01, **kwargs}
        source = NvmlSource(backend, clock=clock, **kwargs)
        sources.append(source)
        source.start()
        return source

    make.hangs = hangs  # type: ignore[attr-defined]
    yield make
    for hang in hangs:
        hang.release.set()
    for source in sources:
        source.stop()


def read_of(source: NvmlSource, index: int = 0):
    view = source.view()
    status = next((s for s in view.gpus if s.gpu.index == index), None)
    return status.read if status else None


def test_a_healthy_gpu_is_read_in_its_thread_and_is_no_fault(make_source):
    source = make_source(Scripted())
    wait_until(lambda: read_of(source), "the first read")
    view = source.view()
    assert view.opened and view.error is None
    assert [s.gpu for s in view.gpus] == [GPU0]
    assert view.gpus[0].read.fields == HEALTHY
    assert nvml_fault(view, [0], RULES) == (None, None)


def test_a_hung_read_is_nvml_timeout_past_its_bound_keeps_the_last_read_and_recovers(make_source, clock):
    backend = Scripted(xid_events=False)  # no watcher: its real-time waits would read as overdue on this clock
    faulty = {**HEALTHY, REMAPPED_ROWS: (0, 0, 1, 0)}
    hang = Hang(then=dict(HEALTHY))
    make_source.hangs.append(hang)
    backend.reads[0] = queue.Queue()
    backend.reads[0].put(faulty)
    backend.reads[0].put(hang)
    source = make_source(backend)
    assert hang.entered.wait(WITHIN_S), "the reader never reached the hung call"

    started = clock.t
    clock.t = started + 1.0  # exactly the bound: not yet
    fault, error = nvml_fault(source.view(), [0], RULES)
    assert error is None and fault is not None and fault.detail.startswith("row_remap_pending: ")

    clock.t = started + 1.5
    began = time.monotonic()
    view = source.view()  # answers while the reader is blocked in its call
    assert time.monotonic() - began < 0.5
    fault, error = nvml_fault(view, [0], RULES)
    assert error == "nvml_timeout: nvmlDeviceGetRemappedRows (GPU 0) has not returned for 1.5 s (bound 1 s)"
    # The last complete read still stands: a hung call flags nothing new and clears nothing.
    assert fault is not None and fault.detail.startswith("row_remap_pending: ")

    hang.release.set()
    wait_until(lambda: read_of(source).fields == HEALTHY, "the read after the call returned")
    assert nvml_fault(source.view(), [0], RULES) == (None, None)


def hung_from_the_first_read(make_source, backend: Scripted) -> NvmlSource:
    """A started source whose first read of GPU 0 hangs (released at the test's end), once that read has begun."""
    hang = Hang()
    make_source.hangs.append(hang)
    backend.reads[0] = queue.Queue()
    backend.reads[0].put(hang)
    source = make_source(backend)
    assert hang.entered.wait(WITHIN_S)
    return source


def test_a_hung_gpu_stalls_no_other_gpu(make_source, clock):
    backend = Scripted(gpus=(GPU0, GPU1), xid_events=False)
    source = hung_from_the_first_read(make_source, backend)
    before = backend.read_count[1]
    wait_until(lambda: backend.read_count[1] >= before + 5, "GPU 1 read on while GPU 0 hangs")
    clock.t += 2.0
    assert source.view().gpus[0].error.startswith("nvml_timeout: nvmlDeviceGetRemappedRows (GPU 0)")
    # GPU 1's reader may be caught inside a read when the clock jumps: the next view sees it done.
    view = wait_until(lambda: (v := source.view()).gpus[1].error is None and v, "GPU 1 between reads")
    assert view.gpus[1].read is not None
    assert nvml_fault(view, [1], RULES) == (None, None)


def test_a_read_that_raises_is_an_error_never_a_fault_and_clears_on_the_next_read(make_source):
    backend = Scripted()
    backend.reads[0] = queue.Queue()
    gate = Hang(then=RuntimeError("binding broke"))
    make_source.hangs.append(gate)
    backend.reads[0].put(gate)
    source = make_source(backend)
    assert gate.entered.wait(WITHIN_S)
    gate.release.set()
    error = wait_until(lambda: source.view().gpus[0].error, "the read error")
    assert error == f"nvml_read: {GPU0}: RuntimeError: binding broke"
    assert nvml_fault(source.view(), [0], RULES)[0] is None
    wait_until(lambda: source.view().gpus[0].error is None, "the error cleared by a good read")


def test_a_lost_gpu_read_in_its_thread_is_a_fault(make_source):
    backend = Scripted()
    backend.reads[0] = queue.Queue()
    for _ in range(3):
        backend.reads[0].put(dict.fromkeys(HEALTH_FIELDS, NvmlError("GpuIsLost", "GPU is lost")))
    source = make_source(backend)
    wait_until(lambda: read_of(source) and read_of(source).fields[REMAPPED_ROWS] != HEALTHY[REMAPPED_ROWS], "the lost read")
    fault, _ = nvml_fault(source.view(), [GPU0.uuid], RULES)
    assert fault is not None and fault.detail.startswith(f"gpu_lost: {GPU0}: NVML_ERROR_GPU_IS_LOST")


def test_nvml_that_cannot_be_opened_is_an_error_tried_again_until_it_opens(make_source):
    backend = Scripted()
    gate = Hang(then=NvmlFailure("nvml_init", "NVMLError_LibraryNotFound: NVML Shared Library Not Found"))
    make_source.hangs.append(gate)
    backend.opens.put(gate)
    backend.opens.put(NvmlFailure("nvml_init", "NVMLError_DriverNotLoaded: Driver Not Loaded"))
    hold = Hang()  # the third try waits here, so the test sees the second error
    make_source.hangs.append(hold)
    backend.opens.put(hold)
    source = make_source(backend)
    assert gate.entered.wait(WITHIN_S)
    assert source.view().error is None  # trying, within its bound
    gate.release.set()
    assert hold.entered.wait(WITHIN_S)
    view = source.view()
    assert not view.opened and view.gpus == ()
    assert view.error == "nvml_init: NVMLError_DriverNotLoaded: Driver Not Loaded"
    assert nvml_fault(view, [0], RULES) == (None, "nvml_init: NVMLError_DriverNotLoaded: Driver Not Loaded")
    hold.release.set()  # this try opens
    wait_until(lambda: read_of(source), "a read once NVML opened")
    assert source.view().error is None


def test_a_hung_open_is_nvml_timeout_on_the_init_bound(make_source, clock):
    backend = Scripted()
    hang = Hang()
    make_source.hangs.append(hang)
    backend.opens.put(hang)
    source = make_source(backend, init_timeout=10.0)
    assert hang.entered.wait(WITHIN_S)
    clock.t += 9.0
    assert source.view().error is None
    clock.t += 2.0
    assert source.view().error == "nvml_timeout: nvmlInit (starting NVML) has not returned for 11.0 s (bound 10 s)"
    assert nvml_fault(source.view(), [0], RULES)[0] is None


def test_a_critical_xid_event_from_the_watcher_thread_is_a_held_fault(make_source):
    backend = Scripted()
    source = make_source(backend)
    wait_until(lambda: read_of(source), "the first read")
    backend.events.put([(GPU0.uuid, 79)])
    wait_until(lambda: source.view().gpus[0].xids, "the Xid event")
    fault, error = nvml_fault(source.view(), [0], RULES)
    assert fault is not None and error is None
    assert fault.detail.startswith(f"Xid79: {GPU0}: NVML critical Xid (the node needs a reboot), an event at ")
    time.sleep(0.05)  # several more healthy reads (interval 0.01 s): the event stays held
    assert nvml_fault(source.view(), [0], RULES)[0] == fault


def test_an_xid_event_nvml_cannot_tie_to_a_gpu_counts_for_every_gpu(make_source):
    backend = Scripted(gpus=(GPU0, GPU1))
    source = make_source(backend)
    backend.events.put([(None, 48)])
    wait_until(lambda: all(s.xids for s in source.view().gpus), "the event on both GPUs")
    for index in (0, 1):
        fault, _ = nvml_fault(source.view(), [index], RULES)
        assert fault is not None and fault.detail.startswith(f"Xid48: GPU {index} ")


def test_a_failing_event_wait_is_an_error_never_a_fault_and_clears(make_source):
    backend = Scripted()
    source = make_source(backend)
    backend.events.put(NvmlFailure("nvml_events", "NVMLError_Unknown: Unknown Error"))
    assert wait_until(lambda: source.view().error, "the events error") == "nvml_events: NVMLError_Unknown: Unknown Error"
    assert nvml_fault(source.view(), [0], RULES)[0] is None
    wait_until(lambda: source.view().error is None, "the error cleared by a wait that timed out")


def test_a_hung_event_wait_is_nvml_timeout_after_its_wait_and_the_bound(make_source, clock):
    backend = Scripted()
    hang = Hang(then=[])
    make_source.hangs.append(hang)
    backend.events.put(hang)
    source = make_source(backend, event_wait=0.05)
    assert hang.entered.wait(WITHIN_S)
    clock.t += 1.0  # the wait's own 0.05 s plus the 1 s bound: not yet
    assert source.view().error is None
    clock.t += 0.1
    assert source.view().error.startswith("nvml_timeout: nvmlEventSetWait (Xid events) has not returned for 1.1 s (bound 1.05 s)")
    hang.release.set()
    wait_until(lambda: source.view().error is None, "the wait back")


def test_stop_closes_nvml_when_every_thread_ended(make_source):
    backend = Scripted()
    source = make_source(backend)
    wait_until(lambda: read_of(source), "the first read")
    assert source.stop() is True
    assert backend.closed


def test_stop_leaves_a_hung_thread_behind_without_waiting_on_it_or_closing_nvml(make_source):
    backend = Scripted()
    source = hung_from_the_first_read(make_source, backend)
    began = time.monotonic()
    assert source.stop(timeout=0.2) is False
    assert time.monotonic() - began < 2.0
    assert not backend.closed  # shutting NVML down under a call in flight could hang too


def test_without_nvidia_ml_py_open_says_how_to_install_it():
    backend = PynvmlBackend(module="llm_vitals_test_no_such_module")
    with pytest.raises(NvmlFailure) as caught:
        backend.open(lambda call, expected=0.0: None)
    assert caught.value.reason == "nvml_unavailable"
    assert caught.value.detail == INSTALL_HINT == "nvidia-ml-py is not installed: pip install 'llm-vitals[gpu]'"
