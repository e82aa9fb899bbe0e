"""The GPU tier's NVML step: the exporter's NVML source against the real GPU, healthy, and what it costs.

usage: python tests/real_gpu/nvml_check.py OUTDIR [--no-gpu]

Through the project's own backend (llm_vitals/exporter/gpu_faults/nvml_pynvml.py), not a capture script:
- `open` (nvmlInit, the GPUs, Xid registration) timed once, each NVML call in it timed by its Step;
- one GPU's read (the 3 health calls) timed 1,000 times after the first;
- one Xid wait of 200 ms (a healthy GPU: no event);
- the source itself (its threads, interval 0.1 s, 50 x the default rate) for 5 s: the process's CPU time
  over that window against 5 s without it, and every view healthy: no fault, no error, on every GPU.
Writes OUTDIR/nvml.json: the figures, and each GPU's read in tests/fixtures/gpu/'s capture shape.
`--no-gpu` (the flow check on a machine without one): the source must say why it cannot read
(`nvml_unavailable`: no nvidia-ml-py; `nvml_init`: no driver), and flag nothing. Exit status 1 on a failed check.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from llm_vitals.exporter.gpu_faults.nvml import GpuRead, NvmlRules, nvml_fault, read_to_capture
from llm_vitals.exporter.gpu_faults.nvml_pynvml import PynvmlBackend
from llm_vitals.exporter.gpu_faults.nvml_source import NvmlFailure, NvmlSource

READS = 1000
SOURCE_WINDOW_S = 5.0


class TimedSteps:
    """A Step that times each NVML call: from one step to the next (or to `end`)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self._open: tuple[str, float] | None = None

    def __call__(self, call: str, expected: float = 0.0) -> None:
        self.end()
        self._open = (call, time.perf_counter())

    def end(self) -> None:
        if self._open is not None:
            self.calls.append((self._open[0], round((time.perf_counter() - self._open[1]) * 1e6, 1)))
            self._open = None


def check_gpu(out: dict) -> list[str]:
    failures: list[str] = []
    backend = PynvmlBackend()
    steps = TimedSteps()
    began = time.perf_counter()
    opened = backend.open(steps)
    steps.end()
    out["open_ms"] = round((time.perf_counter() - began) * 1e3, 2)
    out["open_calls_us"] = steps.calls
    out["gpus"] = [str(gpu) for gpu in opened.gpus]
    out["xid_events_registered"] = opened.xid_events
    out["notes"] = list(opened.notes)
    reads = []
    for gpu in opened.gpus:
        first = TimedSteps()
        fields = backend.read(gpu, first)
        first.end()
        began = time.perf_counter()
        for _ in range(READS):
            backend.read(gpu, lambda call, expected=0.0: None)
        per_read = (time.perf_counter() - began) / READS * 1e6
        reads.append({**read_to_capture(GpuRead(gpu, fields)), "first_read_calls_us": first.calls,
                      "read_us_steady": round(per_read, 2)})  # fmt: skip
    out["reads"] = reads
    began = time.perf_counter()
    events = backend.wait_xids(0.2, lambda call, expected=0.0: None) if opened.xid_events else []
    out["xid_wait_200ms"] = {"events": events, "ms": round((time.perf_counter() - began) * 1e3, 1)}
    backend.close()
    if not opened.gpus:
        failures.append("NVML opened but sees no GPU")
    if not opened.xid_events:
        failures.append("no GPU registered for critical Xid events")
    if events:
        failures.append(f"Xid events on a GPU that should be healthy: {events}")

    # The source as the exporter runs it, at 50 x the default rate, against the process's idle CPU.
    idle_cpu = _cpu_over(SOURCE_WINDOW_S)
    source = NvmlSource(PynvmlBackend(), interval=0.1)
    source.start()
    views = []
    began_cpu, began = time.process_time(), time.monotonic()
    while time.monotonic() - began < SOURCE_WINDOW_S:
        views.append(source.view())
        time.sleep(0.5)
    busy_cpu = time.process_time() - began_cpu
    stopped = source.stop()
    wanted = list(range(len(opened.gpus)))
    verdicts = {str(nvml_fault(view, wanted, NvmlRules())) for view in views}
    out["source"] = {"interval_s": 0.1, "window_s": SOURCE_WINDOW_S, "views": len(views), "verdicts": sorted(verdicts),
                     "cpu_s_with_source": round(busy_cpu, 4), "cpu_s_idle": round(idle_cpu, 4),
                     "cpu_percent_of_a_core_at_0.1s": round(100 * (busy_cpu - idle_cpu) / SOURCE_WINDOW_S, 3),
                     "stopped_cleanly": stopped}  # fmt: skip
    if verdicts != {"(None, None)"}:
        failures.append(f"the source's verdicts on a healthy GPU: {sorted(verdicts)}")
    if not stopped:
        failures.append("the source did not stop")
    return failures


def _cpu_over(seconds: float) -> float:
    began = time.process_time()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.5)
    return time.process_time() - began


def check_no_gpu(out: dict) -> list[str]:
    try:
        PynvmlBackend().open(lambda call, expected=0.0: None)
    except NvmlFailure as exc:
        out["open"] = f"{exc.reason}: {exc.detail}"
    else:
        return ["NVML opened on a machine said to have no GPU"]
    source = NvmlSource(PynvmlBackend(), interval=0.1)
    source.start()
    time.sleep(1.0)
    fault, error = nvml_fault(source.view(), [0], NvmlRules())
    source.stop()
    out["source"] = {"fault": fault, "error": error}
    if fault is not None or not (error or "").startswith(("nvml_unavailable", "nvml_init")):
        return [f"without a GPU the source said fault={fault} error={error}"]
    return []


def main() -> int:
    if len(sys.argv) < 2:
        sys.exit(__doc__.splitlines()[2])
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    out: dict = {}
    try:
        failures = check_no_gpu(out) if "--no-gpu" in sys.argv[2:] else check_gpu(out)
    except Exception as exc:  # reported, with what was measured so far
        failures = [f"{type(exc).__name__}: {exc}"]
    out["failures"] = failures
    (out_dir / "nvml.json").write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps(out, default=str)[:1500])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
