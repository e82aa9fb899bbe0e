"""The drills' figures files (.cache/drill-*.json): one key per drill, added as each drill ends."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any


def add_figures(report: Path, key: str, figures: dict[str, Any]) -> None:
    """Set `key` in the JSON object at `report` to `figures`, keeping the other keys.

    The xdist workers run drills of one file at once: each read-modify-write holds a lock, and the new
    text replaces the file whole, so no reader sees it empty (one did, between another worker's
    truncate and its write, and the drill failed after passing every check).
    """
    report.parent.mkdir(exist_ok=True)
    with open(report.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        kept = json.loads(report.read_text()) if report.exists() else {}
        kept[key] = figures
        written = report.with_suffix(f".{os.getpid()}.tmp")
        written.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
        os.replace(written, report)
