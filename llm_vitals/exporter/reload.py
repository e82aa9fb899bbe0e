"""Reload: `SIGHUP` or `POST /-/reload` re-reads the config file (Prometheus's conventions).

A file that does not load is refused: the error is logged and kept, `llm_vitals_config_last_reload_successful`
drops to 0, and the running config goes on untouched. A file that loads replaces the static
targets, the discovery sources (an unchanged source keeps running, with its targets' state), the
shard and the poll settings. Keys read once at start (`listen`, `connect_timeout`, the drain token,
`remediator_url`, `log_level`) need a restart; a reload that changes one says so in its answer and log.
The node watch (GPU faults) is also started once: a reload that adds the first Kubernetes source or
the first target with a `node` gets it only after a restart.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

from llm_vitals.exporter.settings import ConfigError, ExporterSettings, load_settings
from llm_vitals.logs import log_event

log = logging.getLogger("llm_vitals.exporter")

# Read once when the app starts: a reload that changes them is applied only after a restart.
RESTART_KEYS = ("listen", "connect_timeout", "drain_token_env", "drain_token_file", "remediator_url", "remediator_token_env",
                "remediator_token_file", "log_level", "backstop")


@dataclass
class ReloadState:
    """The outcome of the last reload, as `llm_vitals_config_last_reload_*` and the reload answer show it."""

    path: Path | None
    successful: bool = True
    last_success: float = 0.0  # unix seconds of the last config loaded (start counts, as in Prometheus)
    error: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def needs_restart(old: ExporterSettings, new: ExporterSettings) -> list[str]:
    """The keys changed between `old` and `new` that a reload cannot apply."""
    return [key for key in RESTART_KEYS if getattr(old, key) != getattr(new, key)]


def load_for_reload(state: ReloadState) -> ExporterSettings:
    """The config file read anew; ConfigError (recorded on `state` and logged) when it cannot be used."""
    if state.path is None:
        raise ConfigError("no config file to reload: the exporter was started without --config")
    try:
        return load_settings(state.path)
    except ConfigError as exc:
        state.successful, state.error = False, str(exc)
        log_event(log, "config reload refused; the running config is kept", logging.ERROR, error=str(exc))
        raise


def record_success(state: ReloadState, now: float, old: ExporterSettings, new: ExporterSettings) -> list[str]:
    """Mark the reload good at `now`; the restart-only keys it changed (logged)."""
    state.successful, state.error, state.last_success = True, None, now
    pending = needs_restart(old, new)
    log_event(log, "config reloaded", logging.WARNING if pending else logging.INFO,
              targets=len(new.targets), discovery=len(new.discovery), needs_restart=pending)
    return pending
