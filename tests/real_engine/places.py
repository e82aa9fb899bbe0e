"""Where a real-engine tier's files live: built parts outside the clone, each run's report and logs inside it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Reports and logs stay with the clone (small, read after a run); LLM_VITALS_CACHE moves them.
CACHE = Path(os.environ.get("LLM_VITALS_CACHE", REPO / ".cache"))
if not CACHE.is_absolute():
    CACHE = REPO / CACHE


def run_dir(key: str) -> Path:
    """One tier's output, rewritten by each run: `report.json` and `logs/` (tools/real-tier-lib.sh empties it)."""
    return CACHE / f"real-{key}"


def cache_path(name: str, version: str) -> Path:
    """Where tools/cache-path.sh says a built part lives (outside the clone: CI clones afresh)."""
    out = subprocess.run(["bash", str(REPO / "tools" / "cache-path.sh"), name, version],
                         check=True, capture_output=True, text=True, timeout=30)
    return Path(out.stdout.strip())


def missing(parts: list[tuple[str, Path, tuple[str, ...]]], fix: str) -> str | None:
    """Why a tier cannot run here: the first of its built parts (what, folder, files in it) not all there."""
    for what, folder, files in parts:
        if not all((folder / name).exists() for name in files):
            return f"no {what} at {folder}; run {fix}"
    return None


def venv_and_model_missing(engine: str, venv: Path, model: Path, key: str) -> str | None:
    """Why an engine tier that runs a tiny model from its own venv cannot run here (None when both are built)."""
    parts = [(f"{engine} venv", venv, (".llm-vitals-installed", "bin/python")), ("tiny model", model, (".llm-vitals-built",))]
    return missing(parts, f"`bash tools/real-{key}-setup.sh` (or `make test-{key}`)")
