"""The edge that joins discovery to the poller: each source reports its current list here, and the
poller is told what to add and drop (the pure rules are in `targetset`).

Each source runs as one task of its own (`Source.run(report)`), and reports its *whole* current
list each time something changed, with its health. A source that fails keeps its last good list: an
API server that restarts, or a file_sd file caught half-written, never drops a target.

How another source plugs in: a class with `kind`, `id` and `async run(report)` that calls
`report(targets, status)` with the list of `DiscoveredTarget`s it sees now (the contract is in
`source.py`, which the sources import instead of this module); `sources_for` builds it from its
`discovery:` entry. A GPU-fault input plugs in elsewhere: per target, in the poller's poll
(`TargetRecord.fault` combines one GpuFault per source), keyed by what a discovered target
carries (`node`, `namespace`, `pod`, `pod_uid`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping

from llm_vitals.exporter.discovery.file_sd import FileSource
from llm_vitals.exporter.discovery.kubernetes import PodSource
from llm_vitals.exporter.discovery.source import Source, SourceStatus
from llm_vitals.exporter.discovery.targetset import Changes, desired, reconcile
from llm_vitals.exporter.settings import ExporterSettings, TargetSettings
from llm_vitals.exporter.state import StateStore
from llm_vitals.logs import log_event

log = logging.getLogger("llm_vitals.exporter")


class Discovery:
    """Keeps each source's latest list and status, and turns every report into the poller's Changes."""

    def __init__(self, settings: ExporterSettings, store: StateStore, apply: Callable[[Changes], None],
                 clock: Callable[[], float]) -> None:
        self.store = store
        self.apply = apply
        self.clock = clock
        self.settings = settings
        self.lists: dict[str, list[TargetSettings]] = {}
        self.status: dict[str, SourceStatus] = {}
        self.running: dict[str, tuple[Source, asyncio.Task[None]]] = {}
        self.conflicts: list[str] = []

    def report(self, targets: list[TargetSettings], status: SourceStatus) -> None:
        """A source's whole current list and health; the poller follows at once (no await in between).

        A report from a source no longer running (a batch flushed just after a reload stopped it) is
        dropped: it must not bring back the targets of a source the new config removed.
        """
        if status.source not in self.running:
            return
        status.targets = len(targets)
        status.last_update = self.clock()
        before = self.status.get(status.source)
        if before is not None and (before.up, before.error) != (status.up, status.error):
            log_event(log, "discovery source healthy" if status.up else "discovery source failing",
                      logging.INFO if status.up else logging.WARNING, source=status.source, error=status.error)
        self.status[status.source] = status
        self.lists[status.source] = targets
        self.sync()

    def sync(self) -> Changes:
        """Reconcile the store with static + every source's list, within this shard."""
        wanted, conflicts = desired(self.settings.targets, self.lists.values(), self.settings.shard)
        for conflict in conflicts:
            text = f"{conflict.name}: {conflict.dropped} dropped, {conflict.kept} kept"
            if text not in self.conflicts:
                log_event(log, "target name given twice", logging.WARNING, target=conflict.name,
                          kept=conflict.kept, dropped=conflict.dropped)
        self.conflicts = [f"{c.name}: {c.dropped} dropped, {c.kept} kept" for c in conflicts]
        changes = reconcile(self.store.settings(), wanted)
        if changes:
            self.apply(changes)
            log_event(log, "targets changed", added=[t.name for t in changes.added], removed=list(changes.removed),
                      changed=[t.name for t in changes.changed], targets=len(self.store.records))
        return changes

    def start(self, sources: list[Source]) -> None:
        for source in sources:
            self.status[source.id] = SourceStatus(source.id, source.kind, error="not listed yet")
            self.lists[source.id] = []
            task = asyncio.create_task(self._run(source), name=f"discovery:{source.id}")
            self.running[source.id] = (source, task)

    async def _run(self, source: Source) -> None:
        try:
            await source.run(self.report)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in a source: shown, its last list kept, never the process
            log.exception("discovery source failed unexpectedly", extra={"fields": {"source": source.id}})
            status = self.status[source.id]
            status.up, status.error = False, f"stopped by a bug: {type(exc).__name__}: {exc}"

    async def stop(self, ids: list[str] | None = None) -> None:
        """Stop the sources `ids` (default: all) and forget their lists and status."""
        stopping = [self.running.pop(i) for i in (list(self.running) if ids is None else ids)]
        for _, task in stopping:
            task.cancel()
        await asyncio.gather(*(task for _, task in stopping), return_exceptions=True)
        for source, _ in stopping:
            self.lists.pop(source.id, None)
            self.status.pop(source.id, None)

    async def reconfigure(self, settings: ExporterSettings, sources: list[Source]) -> Changes:
        """A reloaded config. A source whose entry is unchanged keeps running with its list (its
        targets keep their state); any other is stopped and its targets dropped, and the new ones
        start. The static targets and the shard apply at once."""
        new = {source.id: source for source in sources}
        unchanged = {i for i, (old, _) in self.running.items() if i in new and new[i].config == old.config}
        await self.stop([i for i in self.running if i not in unchanged])
        self.settings = settings
        changes = self.sync()
        self.start([source for i, source in new.items() if i not in unchanged])
        return changes


def apply_to_store(store: StateStore, clock: Callable[[], float]) -> Callable[[Changes], None]:
    """Changes applied to the store alone: before the poller starts, and in apps that do not poll."""

    def apply(changes: Changes) -> None:
        for name in (*changes.removed, *(target.name for target in changes.changed)):
            store.remove(name)
        for target in (*changes.added, *changes.changed):
            store.add(target, clock())

    return apply


def sources_for(settings: ExporterSettings, environ: Mapping[str, str] | None = None) -> list[Source]:
    """One Source per `discovery:` entry, named `<kind>[<index>]`."""
    env = os.environ if environ is None else environ
    sources: list[Source] = []
    for index, entry in enumerate(settings.discovery):
        if entry.file is not None:
            sources.append(FileSource(f"file[{index}]", entry.file, env))
        elif entry.kubernetes is not None:
            sources.append(PodSource(f"kubernetes[{index}]", entry.kubernetes, env))
    return sources
