#!/usr/bin/env python3
"""Print the real-llama.cpp tier's summary table from .cache/real-llamacpp/report.json (stdlib only).

usage: python tools/real-llamacpp-report.py [REPORT_JSON]
The table is the vLLM tier's (tools/real-vllm-report.py); the header says which server it was.
Exit status 0 even when drills failed (pytest's status is the verdict); 1 when the report is unreadable.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT = REPO / ".cache" / "real-llamacpp" / "report.json"


def _vllm_report():
    spec = importlib.util.spec_from_file_location("real_vllm_report", REPO / "tools" / "real-vllm-report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else DEFAULT
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"real-llama.cpp report: cannot read {path}: {exc}", file=sys.stderr)
        return 1
    shared = _vllm_report()
    server, exp = report.get("vllm", {}), report.get("exporter", {})
    starts = ", ".join(f"{s['seconds']:.1f} s" for s in server.get("starts", [])) or "-"
    print(f"== real-llama.cpp drills ({server.get('version', '?')}; -np {server.get('slots')} -b {server.get('batch')}; "
          f"exporter poll {exp.get('poll_interval')} s, stuck_after {exp.get('stuck_after')} s, "
          f"metrics_timeout {exp.get('metrics_timeout')} s, canary every {exp.get('canary_interval')} s)")  # fmt: skip
    print(f"llama-server starts (to /health 200): {starts}")
    for line in shared.table(report):
        print(line)
    for d in report.get("drills", []):
        if d.get("facts"):
            print(f"  {d['name']}: " + ", ".join(f"{k}={v}" for k, v in d["facts"].items()))
    print(f"total {shared.fmt_seconds(report.get('total_seconds'))} s; full timelines in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
