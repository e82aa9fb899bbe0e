"""What a discovery source is to the manager: `Source`, and what it reports, `Report` and `SourceStatus`.

Each source (file_sd.py, kubernetes.py) runs as one task of its own, `Source.run(report)`, and calls
`report(targets, status)` with its whole current list each time something changed, with its health.
The manager (manager.py) keeps the latest of each; this module is the contract between them, so a
source needs nothing of the manager.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from llm_vitals.exporter.settings import TargetSettings


@dataclass
class SourceStatus:
    """What a source says of itself: the `/api/v1/discovery` entry and the `llm_vitals_discovery_*` series."""

    source: str  # `kubernetes[0]`, `file[1]`: the entry of `discovery:` it comes from
    kind: str
    up: bool = False  # its last list, watch or read worked
    error: str | None = None  # why not, in a sentence (a 403 names the missing right)
    targets: int = 0  # targets it gives now, before the shard
    # Things it saw and could not make a target of (a pod without the port, with no IP, Pending...),
    # each with the reason: name -> reason.
    skipped: dict[str, str] = field(default_factory=dict)
    last_update: float | None = None  # unix seconds of its last report
    relists: int = 0  # Kubernetes: lists after the first (after a 410 Gone, a watch older than compaction, or a failure)


Report = Callable[[list[TargetSettings], SourceStatus], None]


class Source(Protocol):
    id: str
    kind: str

    @property
    def config(self) -> object:
        """Its `discovery:` entry: a reload restarts the source only when this changed."""

    def run(self, report: Report) -> Awaitable[None]: ...
