"""The dynamic target set as pure rules: what the poller should watch, given the static targets, each
discovery source's current list and this replica's shard; and what changed since the last time.

Nothing here does I/O or reads a clock. `llm_vitals/exporter/discovery/manager.py` calls `desired` and
`reconcile` whenever a source reports, and the poller applies the `Changes`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator

from llm_vitals.exporter.settings import ShardSettings, TargetSettings

# A discovered name: `<namespace>/<pod>` (a pod name may have 253 characters) or a file_sd name.
# Still a safe label value and URL path part: no spaces, quotes, `?`, `#` or `%`.
DISCOVERED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/\[\]-]{0,318}$")


def discovered_name(name: str) -> str:
    """A discovered target's name, or ValueError: 1-319 of [A-Za-z0-9_.:/[]-], at most one `/`."""
    if not DISCOVERED_NAME.match(name) or name.count("/") > 1:
        raise ValueError(f"discovered target name {name!r} must match {DISCOVERED_NAME.pattern} with at most one '/'")
    return name


def pod_target_name(namespace: str, pod: str) -> str:
    """A Kubernetes pod's target name: `<namespace>/<pod>` (the `/` that `discovered_name` allows once)."""
    return f"{namespace}/{pod}"


class DiscoveredTarget(TargetSettings):
    """A target a discovery source found: a TargetSettings whose name may be longer and carry one `/`,
    plus the pod it is (for Kubernetes) and the source that found it."""

    name: Annotated[str, AfterValidator(discovered_name)]  # wider than a static target's name
    source: str  # `kubernetes[0]`, `file[1]`: the discovery entry that found it
    namespace: str | None = None
    pod: str | None = None
    # The pod's UID: part of the target's identity, so a pod recreated under the same name is a new
    # target, and the remediator deletes only the pod the exporter saw (a UID precondition).
    pod_uid: str | None = None


def build_target(template: Mapping[str, Any], environ: Mapping[str, str], **found: Any) -> DiscoveredTarget:
    """The template's keys with what was found (name, url, source, node, namespace, ...) on top;
    ValueError (pydantic's) or ConfigError when they do not make a target."""
    target = DiscoveredTarget.model_validate({**template, **found})
    target.read_secrets(environ, f"{found['source']}.template.")
    return target


def shard_of(name: str, count: int) -> int:
    """The shard a target name belongs to: the same on every replica, every run and every Python (sha256, not hash())."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


def in_shard(name: str, shard: ShardSettings | None) -> bool:
    """Whether this replica keeps the target `name`; every target without a shard."""
    return shard is None or shard_of(name, shard.count) == shard.index


@dataclass(frozen=True)
class Conflict:
    """A name given twice; the first one (static first, then sources in config order) is kept."""

    name: str
    kept: str  # `static` or the source of the target kept
    dropped: str


def desired(
    static: Iterable[TargetSettings],
    discovered: Iterable[Iterable[TargetSettings]],
    shard: ShardSettings | None,
) -> tuple[dict[str, TargetSettings], list[Conflict]]:
    """The targets to watch, by name, in order: static, then each source's; only this shard's.

    A name given twice keeps its first target and reports a Conflict (never two polls of one name,
    never a crash). The shard applies to static targets too, so n replicas with one config split it.
    """
    wanted: dict[str, TargetSettings] = {}
    conflicts = []
    for group in (static, *discovered):
        for target in group:
            if not in_shard(target.name, shard):
                continue
            kept = wanted.get(target.name)
            if kept is not None:
                conflicts.append(Conflict(target.name, _source(kept), _source(target)))
                continue
            wanted[target.name] = target
    return wanted, conflicts


def _source(target: TargetSettings) -> str:
    return target.source if isinstance(target, DiscoveredTarget) else "static"


@dataclass(frozen=True)
class Changes:
    """What the poller must do to go from its current targets to the desired ones."""

    added: tuple[TargetSettings, ...] = ()
    removed: tuple[str, ...] = ()
    # Same name, other settings (a pod recreated with a new UID, a moved pod, an edited template):
    # the old target is dropped and the new one starts afresh, `starting` until its first good read.
    changed: tuple[TargetSettings, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def reconcile(current: Mapping[str, TargetSettings], wanted: Mapping[str, TargetSettings]) -> Changes:
    """Added, removed and changed targets between `current` and `wanted` (equal settings: untouched)."""
    added = tuple(target for name, target in wanted.items() if name not in current)
    removed = tuple(name for name in current if name not in wanted)
    changed = tuple(target for name, target in wanted.items()
                    if name in current and current[name] is not target and current[name] != target)
    return Changes(added, removed, changed)
