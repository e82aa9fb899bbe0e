"""The NVML source: reads each GPU's health in threads of its own, every call under a bound; polls read its cache.

An NVML call blocks its caller, and on a faulty GPU one can block for seconds or never return, while
the poller and the probes run on the event loop. So no NVML call is made there: threads make them,
and `view(now)` (what a poll reads) only copies what they left, under a lock no thread holds across
a call. The threads:

- the opener: the backend's `open` (NVML init, the GPUs, Xid event registration), tried again every
  RETRY_S until it succeeds; then it starts the others and ends;
- a reader per GPU: its health fields every `interval` (one GPU's hung call stalls no other GPU);
- the Xid watcher: waits on NVML's event set, EVENT_WAIT_S at a time, so it notices `stop` within that.
  Every event is counted, one tally per GPU and Xid number (first time, count, last time): bounded
  by the Xid numbers there are, so no flood of application Xids can crowd out a critical one.

A reader that sees its GPU come back from a recovery (gpu_faults.nvml.came_back) stamps the GPU's
`reset_at`: Xid events up to then are over.

Before each NVML call a thread names it (`Lane.step`), with the time. `view(now)` reports a call that
has not returned within its bound as `nvml_timeout` (gpu_faults.nvml.overdue): an error, never a fault.
A call cannot be interrupted, so a hung thread stays hung and makes no more calls; when the call
returns, the thread goes on and the error clears. The GPU keeps its last read meanwhile: a hung call
flags nothing new and clears nothing.

The backend is the seam (NvmlBackend): llm_vitals/exporter/gpu_faults/nvml_pynvml.py calls NVML through
nvidia-ml-py; the tests give functions that hang, fail or answer (tests/test_gpu_fault_nvml_source.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, InitVar, dataclass, replace
from typing import Protocol

from llm_vitals.exporter.gpu_faults import GpuTarget, SourceRead
from llm_vitals.exporter.gpu_faults.nvml import (
    FieldValue,
    GpuId,
    GpuRead,
    GpuStatus,
    NvmlRules,
    NvmlView,
    XidEvent,
    came_back,
    nvml_fault,
    overdue,
    select,
)
from llm_vitals.logs import log_event

log = logging.getLogger("llm_vitals.exporter")

# NVML's own event wait is bounded by its timeout: 1 s keeps `stop` prompt and costs one wake-up a
# second (NVIDIA's device plugin waits 5 s at a time).
EVENT_WAIT_S = 1.0
# How long after a failed open (no nvidia-ml-py, no driver, no permission) the opener tries again:
# a driver loaded later is found without a restart, and a host without one pays one try per RETRY_S.
RETRY_S = 30.0


class Step(Protocol):
    """Called by the backend right before each NVML call: the call's name, and how long it may legitimately take."""

    def __call__(self, call: str, expected: float = 0.0) -> None: ...


class NvmlFailure(Exception):
    """NVML cannot be used (no nvidia-ml-py, no driver, init refused) or an event wait failed: a reason word and a detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Opened:
    """What `open` found: the GPUs, whether any is registered for critical Xid events, and notes for the log."""

    gpus: tuple[GpuId, ...]
    xid_events: bool
    notes: tuple[str, ...] = ()


class NvmlBackend(Protocol):
    """The seam between the source's threads and NVML. Each method is called from one thread at a time."""

    def open(self, step: Step) -> Opened:
        """Initialise NVML, enumerate the GPUs, register them for critical Xid events; NvmlFailure if NVML cannot be used."""
        ...

    def read(self, gpu: GpuId, step: Step) -> Mapping[str, FieldValue]:
        """The GPU's health fields (gpu_faults.nvml.HEALTH_FIELDS), each a value or the NvmlError its call answered."""
        ...

    def wait_xids(self, timeout: float, step: Step) -> list[tuple[str | None, int]]:
        """Wait up to `timeout` s for critical Xid events: (GPU UUID or None, Xid) each; NvmlFailure if the wait fails."""
        ...

    def close(self) -> None:
        """Free what `open` made (the event set) and shut NVML down."""
        ...


class Lane:
    """One thread's NVML call in flight: which, since when, and its bound. Written by its thread, read by `view`."""

    def __init__(self, where: str, bound: float, clock: Callable[[], float]) -> None:
        self.where = where
        self.bound = bound
        self.clock = clock
        # (call, since, bound) replaced whole: a reader in another thread never sees half of it.
        self.current: tuple[str, float, float] | None = None

    def step(self, call: str, expected: float = 0.0) -> None:
        self.current = (call, self.clock(), self.bound + expected)

    def done(self) -> None:
        self.current = None

    def overdue(self, now: float) -> str | None:
        current = self.current
        return overdue(current[0], current[1], now, current[2], self.where) if current else None


@dataclass(eq=False)
class NvmlSource:
    """NVML read in threads (opener, a reader per GPU, the Xid watcher); `view(now)` is what a poll reads.

    `clock` (monotonic) times the bounds and reads; `wall` dates the Xid events a detail shows.
    """

    backend: NvmlBackend
    _: KW_ONLY
    interval: float = 5.0
    call_timeout: float = 1.0
    init_timeout: InitVar[float] = 10.0
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    event_wait: float = EVENT_WAIT_S
    retry: float = RETRY_S

    def __post_init__(self, init_timeout: float) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._opener = Lane("starting NVML", init_timeout, self.clock)
        self._watcher = Lane("Xid events", self.call_timeout, self.clock)
        self._readers: dict[int, Lane] = {}
        # Written by the threads under _lock, copied by view().
        self._opened: Opened | None = None
        self._open_error: str | None = None
        self._events_error: str | None = None
        self._reads: dict[int, GpuRead] = {}
        self._read_errors: dict[int, str] = {}
        self._xids: dict[str | None, dict[int, XidEvent]] = {}
        self._reset_at: dict[int, float] = {}

    @property
    def started(self) -> bool:
        return bool(self._threads)

    def start(self) -> None:
        """Start the opener (it starts the rest). Idempotent; returns at once."""
        if not self._threads:
            self._spawn("nvml-open", self._open_loop)

    def stop(self, timeout: float = 3.0) -> bool:
        """Stop the threads; close NVML when all ended within `timeout`. False when a hung call kept one (it is left, a daemon)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        hung = [t.name for t in self._threads if t.is_alive()]
        if hung:
            log_event(log, "NVML threads still in a call at stop; left behind", logging.WARNING, threads=hung)
            return False
        if self._opened is not None:
            closer = threading.Thread(target=self._close, name="nvml-close", daemon=True)
            closer.start()
            closer.join(max(0.1, deadline - time.monotonic()))
        return True

    def release(self, indexes: list[int]) -> None:
        """A human says these GPUs were reset or replaced: their Xid events so far are over (as `came_back`)."""
        now = self.wall()
        with self._lock:
            for index in indexes:
                self._reset_at[index] = now

    def view(self, now: float | None = None) -> NvmlView:
        """What the threads know now, with any call past its bound as `nvml_timeout`. Never waits on NVML."""
        now = self.clock() if now is None else now
        with self._lock:
            opened, open_error, events_error = self._opened, self._open_error, self._events_error
            reads, read_errors, reset_at = dict(self._reads), dict(self._read_errors), dict(self._reset_at)
            xids = {uuid: tuple(events.values()) for uuid, events in self._xids.items()}
        if opened is None:
            return NvmlView(error=self._opener.overdue(now) or open_error)
        anyone = xids.get(None, ())  # an event NVML could not tie to a GPU counts for every GPU
        gpus = tuple(
            GpuStatus(gpu, reads.get(gpu.index), (*xids.get(gpu.uuid, ()), *anyone) if gpu.uuid else anyone,
                      (lane.overdue(now) if (lane := self._readers.get(gpu.index)) else None) or read_errors.get(gpu.index),
                      reset_at.get(gpu.index))
            for gpu in opened.gpus)  # fmt: skip
        return NvmlView(gpus, error=self._watcher.overdue(now) or events_error, opened=True)

    # -- the threads ---------------------------------------------------------------------------

    def _spawn(self, name: str, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)  # a hung call must not hold exit
        self._threads.append(thread)
        thread.start()

    def _open_loop(self) -> None:
        while not self._stop.is_set():
            try:
                opened = self.backend.open(self._opener.step)
            except NvmlFailure as exc:
                self._set_open_error(f"{exc.reason}: {exc.detail}")
            except Exception as exc:  # a bug or an unforeseen binding error: shown, tried again
                self._set_open_error(f"nvml_init: {type(exc).__name__}: {exc}")
            else:
                with self._lock:
                    self._opened, self._open_error = opened, None
                log_event(log, "NVML opened", logging.INFO, gpus=[str(gpu) for gpu in opened.gpus],
                          xid_events=opened.xid_events, notes=list(opened.notes))
                for gpu in opened.gpus:
                    self._readers[gpu.index] = Lane(f"GPU {gpu.index}", self.call_timeout, self.clock)
                    self._spawn(f"nvml-gpu{gpu.index}", self._read_loop, gpu)
                if opened.xid_events:
                    self._spawn("nvml-xid", self._watch_loop)
                return
            finally:
                self._opener.done()
            self._stop.wait(self.retry)

    def _set_open_error(self, error: str) -> None:
        with self._lock:
            changed, self._open_error = self._open_error != error, error
        if changed:
            log_event(log, "cannot use NVML", logging.WARNING, error=error, retry_in=self.retry)

    def _read_loop(self, gpu: GpuId) -> None:
        lane = self._readers[gpu.index]
        while not self._stop.is_set():
            error: str | None = None
            try:
                fields = dict(self.backend.read(gpu, lane.step))
            except Exception as exc:  # the backend turns NVML's answers into fields: anything else is shown, never a fault
                error = f"nvml_read: {gpu}: {type(exc).__name__}: {exc}"
            finally:
                lane.done()
            with self._lock:
                before = self._read_errors.get(gpu.index)
                if error is None:
                    read = GpuRead(gpu, fields, self.clock())
                    if came_back(self._reads.get(gpu.index), read):
                        self._reset_at[gpu.index] = self.wall()
                    self._reads[gpu.index] = read
                    self._read_errors.pop(gpu.index, None)
                else:
                    self._read_errors[gpu.index] = error
            if error != before and error:
                log_event(log, "cannot read the GPU through NVML", logging.WARNING, gpu=str(gpu), error=error)
            self._stop.wait(self.interval)

    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            try:
                events = self.backend.wait_xids(self.event_wait, self._watcher.step)
            except Exception as exc:
                error = f"{exc.reason}: {exc.detail}" if isinstance(exc, NvmlFailure) else f"nvml_events: {type(exc).__name__}: {exc}"
                with self._lock:
                    changed, self._events_error = self._events_error != error, error
                if changed:
                    log_event(log, "cannot wait for Xid events", logging.WARNING, error=error)
                self._stop.wait(self.event_wait)  # a wait that fails at once must not spin
                continue
            finally:
                self._watcher.done()
            now = self.wall()
            with self._lock:
                self._events_error = None
                for uuid, xid in events:
                    kept = self._xids.setdefault(uuid, {})
                    seen = kept.get(xid)
                    kept[xid] = XidEvent(uuid, xid, now) if seen is None else replace(
                        seen, count=seen.count + 1, last_at=now)
            for uuid, xid in events:
                log_event(log, "NVML critical Xid event", logging.WARNING, gpu=uuid, xid=xid)

    def _close(self) -> None:
        try:
            self.backend.close()
        except Exception as exc:
            log_event(log, "NVML shutdown failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")


class NvmlFaultSource:
    """The `nvml` source (FaultSource): the target's `gpus` as the NVML threads last read them.

    The NvmlSource is made (by `make`) and started when a target first names `gpus` (a reload or
    discovery may add one); a poll only copies what its threads left, never waits on NVML.
    """

    name = "nvml"

    def __init__(self, make: Callable[[], NvmlSource], rules: NvmlRules, clock: Callable[[], float]) -> None:
        self.make = make
        self.rules = rules
        self.clock = clock
        self.source: NvmlSource | None = None

    def wants(self, target: GpuTarget) -> bool:
        return target.gpus is not None

    async def read(self, target: GpuTarget, before: SourceRead) -> SourceRead:
        if self.source is None:
            self.source = self.make()
        self.source.start()
        return SourceRead(*nvml_fault(self.source.view(self.clock()), target.gpus or [], self.rules))

    def stop(self) -> None:
        """Stop the threads (blocking: joins them for up to 3 s; call it off the event loop)."""
        if self.source is not None:
            self.source.stop()

    def release(self, target: GpuTarget) -> None:
        """The target's GPUs count as reset now: their Xid events so far are over."""
        if self.source is not None and target.gpus is not None:
            gpus, _ = select(self.source.view(self.clock()), target.gpus)
            self.source.release([status.gpu.index for status in gpus])
