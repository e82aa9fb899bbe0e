"""How a benchmark runs the exporter of a given checkout: this one, or another commit's (a detached
`git worktree add --detach DIR COMMIT` with its own `.venv`), so that two commits are measured side
by side, in one run, on the same box.

Commits before the single `llm_vitals` package had a top-level `exporter` package: the module to
run is found by what the checkout holds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

THIS = Path(__file__).resolve().parent.parent


def exporter_command(checkout: Path) -> list[str]:
    """The argv that starts `checkout`'s exporter CLI (append `--config FILE`), with its own venv's Python when it has one."""
    python = checkout / ".venv" / "bin" / "python"
    if checkout.resolve() == THIS or not python.exists():
        python = Path(sys.executable)
    module = "llm_vitals.exporter.cli" if (checkout / "llm_vitals" / "exporter" / "cli.py").exists() else "exporter.cli"
    return [str(python), "-m", module]


def exporter_env(checkout: Path) -> dict[str, str]:
    """The environment to run it in: `checkout` first on the path, whatever is installed."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))}


def label(checkout: Path) -> str:
    """`this` for this checkout, else the other checkout's folder name."""
    return "this" if checkout.resolve() == THIS else checkout.name
