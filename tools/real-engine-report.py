#!/usr/bin/env python3
"""Print a real-engine tier's summary from its report JSON: the settings, the starts, a row per drill, the facts.

usage: python tools/real-engine-report.py REPORT_JSON      (e.g. .cache/real-vllm/report.json)
The one renderer is tests/real_engine/report.py (stdlib only), which the tiers' pytest summary uses too.
Exit status 0 even when drills failed (pytest's status is the verdict); 1 when the report is unreadable.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

RENDERER = Path(__file__).resolve().parent.parent / "tests" / "real_engine" / "report.py"


def _renderer():
    spec = importlib.util.spec_from_file_location("real_engine_report", RENDERER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    sys.exit(_renderer().main(sys.argv))
