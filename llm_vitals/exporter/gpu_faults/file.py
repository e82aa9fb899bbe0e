"""The `file` source: the target's `gpu_fault_file`, which a node agent (DCGM health, an Xid log watcher) writes.

Present and non-empty means a fault, its first line the detail (`file_fault`). Read once per poll,
in a thread (a file on a hung mount must not stall the event loop); an unreadable file keeps the
fault it held and shows why.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from llm_vitals.exporter.gpu_faults import GpuTarget, SourceRead, file_fault

FAULT_FILE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class FileRead:
    """One read of a `gpu_fault_file`: its text ("" when empty or absent), or why it could not be read."""

    text: str = ""
    error: str | None = None


def read_fault_file(path: Path) -> FileRead:
    """Read a gpu_fault_file (blocking: the source runs it in a thread, never on the event loop)."""
    try:
        with open(path, "rb") as flag:
            return FileRead(flag.read(FAULT_FILE_BYTES).decode("utf-8", "replace"))
    except FileNotFoundError:
        return FileRead("")  # absent: the node agent cleared it
    except OSError as exc:
        return FileRead(error=f"cannot read {path}: {exc.strerror or type(exc).__name__}")


class FileSource:
    """The `file` source (FaultSource)."""

    name = "file"

    def wants(self, target: GpuTarget) -> bool:
        return target.gpu_fault_file is not None

    async def read(self, target: GpuTarget, before: SourceRead) -> SourceRead:
        read = await asyncio.to_thread(read_fault_file, target.gpu_fault_file)
        return SourceRead(*file_fault(before.fault, read.text, read.error))

    def release(self, target: GpuTarget) -> None:
        """Nothing held: the agent clears its file."""
