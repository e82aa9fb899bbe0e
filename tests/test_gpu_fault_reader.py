"""The one aggregate of the GPU-fault sources (gpu_faults/reader.py): each wanted source read once, given
what it left last time; a source no longer wanted leaves nothing; an error logged once per change."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from conftest import REPO

from llm_vitals.exporter.gpu_faults import SOURCES, GpuFault, GpuFaultState, GpuTarget, SourceRead
from llm_vitals.exporter.gpu_faults.reader import GpuFaultReader
from llm_vitals.exporter.settings import parse_settings


@dataclass
class Scripted:
    """A source whose answers a test sets; it records what it was given."""

    name: str
    answers: list[SourceRead]
    wanted: bool = True
    given: list[SourceRead] = field(default_factory=list)

    def wants(self, target: GpuTarget) -> bool:
        return self.wanted

    async def read(self, target: GpuTarget, before: SourceRead) -> SourceRead:
        self.given.append(before)
        return self.answers.pop(0)


TARGET = parse_settings({"targets": [{"name": "gpu-a", "url": "http://127.0.0.1:9"}]}, "test").targets[0]


async def test_each_wanted_source_is_read_once_with_its_own_last_read() -> None:
    node = Scripted("node", [SourceRead(GpuFault("node", "GpuMemWatchIsNotHealthy: n1")), SourceRead()])
    dcgm = Scripted("dcgm", [SourceRead(None, None, "memory-1"), SourceRead(None, "timeout: no answer", "memory-1")])
    nvml = Scripted("nvml", [], wanted=False)
    reader = GpuFaultReader([node, dcgm, nvml])
    assert reader.wants(TARGET)
    first = await reader.read(TARGET, GpuFaultState())
    assert first.fault == GpuFault("node", "GpuMemWatchIsNotHealthy: n1") and first.errors == {}
    second = await reader.read(TARGET, first)
    assert dcgm.given == [SourceRead(), SourceRead(None, None, "memory-1")]  # its memory came back to it
    assert node.given[1] == first.of("node")
    assert second.fault is None and second.errors == {"dcgm": "timeout: no answer"}
    assert nvml.given == [] and set(second.reads) == {"node", "dcgm"}


async def test_a_source_no_longer_wanted_leaves_nothing_and_the_detail_follows_the_source_order() -> None:
    file = Scripted("file", [SourceRead(GpuFault("file", "Xid 79 from dmesg"))])
    node = Scripted("node", [SourceRead(GpuFault("node", "GpuXid")), SourceRead(GpuFault("node", "GpuXid"))])
    reader = GpuFaultReader([file, node])
    both = await reader.read(TARGET, GpuFaultState())
    assert both.fault == GpuFault("file", "Xid 79 from dmesg") and SOURCES.index("file") < SOURCES.index("node")
    file.wanted = False
    after = await reader.read(TARGET, both)
    assert set(after.reads) == {"node"} and after.fault == GpuFault("node", "GpuXid")
    assert not GpuFaultReader([file]).wants(TARGET)


async def test_a_source_error_is_logged_once_per_change_not_per_poll(caplog) -> None:
    errors = [f"nvml_timeout: nvmlDeviceGetRemappedRows (GPU 0) has not returned for {s}.0 s" for s in (2, 7, 12)]
    nvml = Scripted("nvml", [SourceRead(None, error) for error in errors] + [SourceRead(None, "nvml_init: no driver")])
    reader = GpuFaultReader([nvml])
    caplog.set_level(logging.WARNING, logger="llm_vitals.exporter")
    state = GpuFaultState()
    for _ in range(4):
        state = await reader.read(TARGET, state)
    logged = [r for r in caplog.records if r.getMessage().startswith("cannot read a GPU-fault source")]
    assert len(logged) == 2  # the growing timeout once, then the other error


def test_one_home_one_writer_one_setter() -> None:
    """Every GPU-fault module is under gpu_faults/; only the poller writes a target's GPU faults, through one setter."""
    package = REPO / "llm_vitals"
    exporter = package / "exporter"
    assert not [p.name for p in exporter.glob("*.py") if p.stem in ("dcgm", "nvml_source", "nvml_pynvml")]
    writers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py") if "set_gpu_faults(" in p.read_text())
    assert writers == ["exporter/poller.py", "exporter/state.py"]  # the call, and its definition
    state = (exporter / "state.py").read_text()
    assert [line.strip() for line in state.splitlines() if "fault(self" in line and line.strip().startswith("def set_")] == []
    assert "set_gpu_faults" not in (exporter / "gpu_faults" / "node_watch.py").read_text()
