"""The one aggregate of the GPU-fault sources: the poller calls `read` once per poll, and writes what it gives.

Each source a target wants is read in SOURCES order; a source the target no longer wants leaves
nothing behind. A source that cannot be read keeps the fault it last flagged (each source's rule
sees its last read) and shows why in `gpu_fault_errors`; a change of that error is logged once,
not once per poll as a timeout's seconds grow.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from llm_vitals.exporter.gpu_faults import FaultSource, GpuFaultState, GpuTarget
from llm_vitals.logs import log_event

log = logging.getLogger("llm_vitals.exporter")
_NUMBERS = re.compile(r"\d+(\.\d+)?")


class GpuFaultReader:
    """The GPU-fault sources, asked together (file, node, dcgm, nvml)."""

    def __init__(self, sources: Sequence[FaultSource]) -> None:
        self.sources = tuple(sources)

    def wants(self, target: GpuTarget) -> bool:
        """Whether any source reads this target (no coroutine per poll for the targets none does)."""
        return any(source.wants(target) for source in self.sources)

    def source(self, name: str) -> FaultSource | None:
        return next((source for source in self.sources if source.name == name), None)

    async def read(self, target: GpuTarget, before: GpuFaultState) -> GpuFaultState:
        """Every wanted source's read of `target`, given what each left last time."""
        after = GpuFaultState()
        for source in self.sources:
            if source.wants(target):
                after = after.with_read(source.name, await source.read(target, before.of(source.name)))
        _log_errors(target.name, before, after)
        return after


    def release(self, target: GpuTarget) -> list[str]:
        """A human's release of the target's held Xid faults, taken by each source it has (from their next read)."""
        released = [source.name for source in self.sources if source.wants(target)]
        for source in self.sources:
            if source.name in released:
                source.release(target)
        return released


def _log_errors(name: str, before: GpuFaultState, after: GpuFaultState) -> None:
    for source, error in after.errors.items():
        was = before.errors.get(source)
        if was is None or _NUMBERS.sub("", was) != _NUMBERS.sub("", error):
            kept = after.of(source).fault
            log_event(log, "cannot read a GPU-fault source; its last fault is kept", logging.WARNING, target=name,
                      source=source, error=error, kept=kept.detail if kept else None)
