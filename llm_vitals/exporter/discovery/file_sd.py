"""File discovery in Prometheus's file_sd format (JSON or YAML), re-read when a file changes.

A file holds a list of groups, `[{targets: ["host:port", ...], labels: {...}}]`. Labels named
`__llm_vitals_<key>` set that target key (`name`, `engine`, `role`, `model`, `stuck_after`, ...) on
top of the entry's `template`; `__scheme__` sets the scheme as in Prometheus. Other labels are
ignored: a target's series carry only the exporter's own labels. A target without a name label is
named `host:port`.

Change detection looks at each matching file's size and modification time every
`refresh_interval` (a stat per file, no inotify dependency; Prometheus also re-reads on a timer as a
backstop). A file that cannot be read or parsed keeps its last good targets, and the error is shown
in `/api/v1/discovery`; one bad group or target is skipped with its reason, the rest are kept. The
files are stat'ed, read and parsed in a thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from llm_vitals.exporter.discovery.source import Report, SourceStatus
from llm_vitals.exporter.discovery.targetset import build_target
from llm_vitals.exporter.settings import ConfigError, FileDiscovery, TargetSettings

log = logging.getLogger("llm_vitals.exporter")

LABEL_PREFIX = "__llm_vitals_"
MAX_FILE_BYTES = 16 * 1024 * 1024


class FileSdError(ValueError):
    """A file_sd file that is not a list of target groups."""


@dataclass(frozen=True)
class FileTargets:
    """What one file gave: its targets, and what was skipped (`<path>#<group>[/<target>]` -> reason)."""

    targets: tuple[TargetSettings, ...]
    skipped: Mapping[str, str]


def _error_text(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{where}: {first['msg']}" if where else str(first["msg"])
    return str(exc)


def parse_file_sd(text: str, path: str, template: Mapping[str, Any], source: str,
                  environ: Mapping[str, str]) -> FileTargets:
    """The targets of one file_sd document; FileSdError when the document as a whole is unusable."""
    try:
        # YAML is a superset of JSON: one parser reads both (Prometheus picks by extension).
        document = yaml.safe_load(text) if text.strip() else []
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise FileSdError(f"not valid JSON or YAML{where}") from None
    if not isinstance(document, list):
        raise FileSdError("must be a list of target groups ({targets: [...], labels: {...}})")
    targets: list[TargetSettings] = []
    skipped: dict[str, str] = {}
    for index, group in enumerate(document):
        where = f"{path}#{index}"
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            skipped[where] = "bad_group: a group needs a `targets` list"
            continue
        labels = group.get("labels") or {}
        if not isinstance(labels, dict):
            skipped[where] = "bad_group: `labels` must be a mapping"
            continue
        keys = {str(k)[len(LABEL_PREFIX):]: v for k, v in labels.items() if str(k).startswith(LABEL_PREFIX)}
        scheme = str(labels.get("__scheme__", "http"))
        if "name" in keys and len(group["targets"]) > 1:
            skipped[where] = "bad_group: a __llm_vitals_name label names one target, and this group has several"
            continue
        for address in group["targets"]:
            if not isinstance(address, str) or not address or "/" in address:
                skipped[f"{where}/{address}"] = "bad_target: a target is host:port"
                continue
            found = {**keys, "name": str(keys.get("name", address)), "url": f"{scheme}://{address}", "source": source}
            try:
                targets.append(build_target(template, environ, **found))
            except (ValidationError, ConfigError) as exc:
                skipped[f"{where}/{address}"] = f"bad_target: {_error_text(exc)}"
    return FileTargets(tuple(targets), skipped)


def matching_files(patterns: list[str]) -> list[str]:
    """The files the configured paths and globs match now, sorted, each once."""
    found: set[str] = set()
    for pattern in patterns:
        found.update(path for path in glob.glob(pattern) if os.path.isfile(path))
    return sorted(found)


class FileSource:
    """One `discovery: - file:` entry: polls its files' stat, re-reads the ones that changed, reports all."""

    kind = "file"

    def __init__(self, source_id: str, config: FileDiscovery, environ: Mapping[str, str]) -> None:
        self.id = source_id
        self.config = config
        self.environ = environ
        self.seen: dict[str, tuple[int, int]] = {}  # path -> (mtime_ns, size) as last read
        self.by_file: dict[str, FileTargets] = {}  # the last good read of each file
        self.errors: dict[str, str] = {}  # path -> why its last read failed

    def refresh(self) -> bool:
        """Re-read what changed since the last call; whether anything did."""
        changed = False
        paths = matching_files(self.config.paths)
        for gone in set(self.seen) - set(paths):
            del self.seen[gone]
            self.by_file.pop(gone, None)
            self.errors.pop(gone, None)
            changed = True
        for path in paths:
            try:
                stat = os.stat(path)
            except OSError:
                continue  # removed between the glob and the stat: the next refresh sees it gone
            mark = (stat.st_mtime_ns, stat.st_size)
            if self.seen.get(path) == mark:
                continue
            self.seen[path] = mark
            changed = True
            self._read(path, stat.st_size)
        return changed

    def _read(self, path: str, size: int) -> None:
        try:
            if size > MAX_FILE_BYTES:
                raise FileSdError(f"larger than {MAX_FILE_BYTES} bytes")
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            self.by_file[path] = parse_file_sd(text, path, self.config.template, self.id, self.environ)
            if self.errors.pop(path, None) is not None:
                log.info("file_sd file read again", extra={"fields": {"source": self.id, "path": path}})
        except (OSError, UnicodeDecodeError, FileSdError) as exc:
            error = exc.strerror if isinstance(exc, OSError) and exc.strerror else (
                "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc))
            if self.errors.get(path) != error:
                log.warning("cannot use a file_sd file; its last good targets are kept",
                            extra={"fields": {"source": self.id, "path": path, "error": error}})
            self.errors[path] = error

    def current(self) -> tuple[list[TargetSettings], SourceStatus]:
        """Every file's targets (files in name order) and the source's status."""
        targets = [target for path in sorted(self.by_file) for target in self.by_file[path].targets]
        skipped = {key: why for read in self.by_file.values() for key, why in read.skipped.items()}
        error = "; ".join(f"{path}: {why}" for path, why in sorted(self.errors.items())) or None
        return targets, SourceStatus(self.id, self.kind, up=not self.errors, error=error, skipped=skipped)

    async def run(self, report: Report) -> None:
        first = True
        while True:
            # The stats, reads and parses in a thread: a file of up to 16 MB parsed on the event loop
            # held every poll and probe behind it. Only this task touches the source's state.
            if await asyncio.to_thread(self.refresh) or first:
                report(*self.current())
                first = False
            await asyncio.sleep(self.config.refresh_interval)
