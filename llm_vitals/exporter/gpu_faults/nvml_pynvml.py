"""The NVML backend of the NVML source: nvidia-ml-py (`pynvml`), the optional extra `llm-vitals[gpu]`.

Imported only when a target names `gpus:`, and `pynvml` itself only inside `open`: without the package
the exporter runs, and the source shows `nvml_unavailable` in `gpu_fault_errors`. Every NVML call is
named to the source's Step first (its bound: llm_vitals/exporter/gpu_faults/nvml_source.py). An NVMLError from a
health read becomes that field's value (gpu_faults.nvml decides what it means); one from `open` or
from the event wait is an NvmlFailure.

The calls are the ones measured on a real H200 (tests/fixtures/gpu/nvml-h200-healthy.json): 1-2 µs
each once warm, 1-3 ms for some first calls, ~10-13 ms for nvmlInit. Xid events are waited for as
NVIDIA's device plugin does (nvmlDeviceRegisterEvents with nvmlEventTypeXidCriticalError, then
nvmlEventSetWait); a field a GPU answers NOT_SUPPORTED to once is not asked again.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from llm_vitals.exporter.gpu_faults.nvml import (
    ECC_VOLATILE_UNCORRECTED,
    HEALTH_FIELDS,
    NOT_SUPPORTED,
    RECOVERY_ACTION,
    REMAPPED_ROWS,
    RETIRED_PAGES_PENDING,
    FieldValue,
    GpuId,
    NvmlError,
)
from llm_vitals.exporter.gpu_faults.nvml_source import NvmlFailure, Opened, Step

INSTALL_HINT = "nvidia-ml-py is not installed: pip install 'llm-vitals[gpu]'"


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class PynvmlBackend:
    """NVML through nvidia-ml-py. One instance per source; `open` again after `close` starts afresh."""

    def __init__(self, module: str = "pynvml") -> None:
        self.module = module
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._lost: dict[int, NvmlError] = {}  # GPUs whose handle or UUID NVML refused at open, and why
        self._unsupported: set[tuple[int, str]] = set()
        self._event_set: Any = None

    def _error(self, exc: BaseException) -> NvmlError:
        name = type(exc).__name__
        code = name.removeprefix("NVMLError_") if name.startswith("NVMLError_") else f"code{getattr(exc, 'value', '?')}"
        return NvmlError(code, _text(exc))

    def open(self, step: Step) -> Opened:
        try:
            nvml = importlib.import_module(self.module)
        except ImportError:
            raise NvmlFailure("nvml_unavailable", INSTALL_HINT) from None
        self._nvml = nvml
        step("nvmlInit")
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:  # no driver (LibraryNotFound, DriverNotLoaded), no permission
            raise NvmlFailure("nvml_init", str(self._error(exc))) from None
        try:
            return self._enumerate(nvml, step)
        except nvml.NVMLError as exc:
            self._shutdown()
            raise NvmlFailure("nvml_init", str(self._error(exc))) from None

    def _enumerate(self, nvml: Any, step: Step) -> Opened:
        self._handles, self._lost, self._unsupported = {}, {}, set()
        step("nvmlDeviceGetCount")
        gpus: list[GpuId] = []
        notes: list[str] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                step("nvmlDeviceGetHandleByIndex")
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                step("nvmlDeviceGetUUID")
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except nvml.NVMLError as exc:  # a GPU lost already: kept by index, every read answers why
                self._lost[index] = self._error(exc)
                gpus.append(GpuId(index, None))
                notes.append(f"GPU {index}: {self._lost[index]}")
                continue
            self._handles[index] = handle
            gpus.append(GpuId(index, uuid))
        watched = self._register_xids(nvml, step, notes)
        return Opened(tuple(gpus), watched, tuple(notes))

    def _register_xids(self, nvml: Any, step: Step, notes: list[str]) -> bool:
        if not self._handles:
            return False
        step("nvmlEventSetCreate")
        self._event_set = nvml.nvmlEventSetCreate()
        watched = False
        for index, handle in self._handles.items():
            try:
                step("nvmlDeviceGetSupportedEventTypes")
                if not nvml.nvmlDeviceGetSupportedEventTypes(handle) & nvml.nvmlEventTypeXidCriticalError:
                    notes.append(f"GPU {index}: no critical Xid events on this GPU")
                    continue
                step("nvmlDeviceRegisterEvents")
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._event_set)
                watched = True
            except nvml.NVMLError as exc:  # unsupported (a VM, an old GPU): the health reads still run
                notes.append(f"GPU {index}: Xid events not registered: {self._error(exc)}")
        return watched

    def read(self, gpu: GpuId, step: Step) -> Mapping[str, FieldValue]:
        nvml = self._nvml
        handle = self._handles.get(gpu.index)
        if handle is None:
            error = self._lost.get(gpu.index, NvmlError("NotFound", "no handle for this GPU"))
            return dict.fromkeys(HEALTH_FIELDS, error)
        calls: dict[str, tuple[str, Callable[[], FieldValue]]] = {
            ECC_VOLATILE_UNCORRECTED: ("nvmlDeviceGetTotalEccErrors", lambda: int(nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC))),
            REMAPPED_ROWS: ("nvmlDeviceGetRemappedRows", lambda: tuple(int(v) for v in nvml.nvmlDeviceGetRemappedRows(handle))),
            RETIRED_PAGES_PENDING: ("nvmlDeviceGetRetiredPagesPendingStatus",
                                    lambda: int(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))),
            RECOVERY_ACTION: ("nvmlDeviceGetFieldValues", lambda: self._recovery_action(nvml, handle)),
        }
        fields: dict[str, FieldValue] = {}
        for name, (call, fn) in calls.items():
            if (gpu.index, name) in self._unsupported:
                fields[name] = NvmlError(NOT_SUPPORTED, "Not Supported")
                continue
            step(call)
            try:
                fields[name] = fn()
            except nvml.NVMLError as exc:
                fields[name] = error = self._error(exc)
                if error.code == NOT_SUPPORTED:
                    self._unsupported.add((gpu.index, name))
        return fields

    @staticmethod
    def _recovery_action(nvml: Any, handle: Any) -> FieldValue:
        # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: answered on the H200 of tests/fixtures/gpu (driver 580);
        # a binding or driver without it is NOT_SUPPORTED, skipped like any field the GPU lacks.
        field_id = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field_id is None:
            return NvmlError(NOT_SUPPORTED, "this nvidia-ml-py has no NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
        (value,) = nvml.nvmlDeviceGetFieldValues(handle, [field_id])
        if value.nvmlReturn != nvml.NVML_SUCCESS:
            raise nvml.NVMLError(value.nvmlReturn)
        return int(value.value.uiVal)

    def wait_xids(self, timeout: float, step: Step) -> list[tuple[str | None, int]]:
        nvml = self._nvml
        step("nvmlEventSetWait", expected=timeout)
        try:
            data = nvml.nvmlEventSetWait_v2(self._event_set, int(timeout * 1000))
        except nvml.NVMLError as exc:
            if self._error(exc).code == "Timeout":  # nothing happened: the usual answer
                return []
            raise NvmlFailure("nvml_events", str(self._error(exc))) from None
        if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
            return []
        uuid: str | None
        try:
            step("nvmlDeviceGetUUID")
            uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
        except nvml.NVMLError:
            uuid = None  # counted for every GPU, as NVIDIA's device plugin does
        return [(uuid, int(data.eventData))]

    def close(self) -> None:
        nvml = self._nvml
        if nvml is None:
            return
        if self._event_set is not None:
            try:
                nvml.nvmlEventSetFree(self._event_set)
            except nvml.NVMLError:
                pass
            self._event_set = None
        self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass
