#!/usr/bin/env python3
"""Print a real-engine tier's summary table from its report JSON (stdlib only).

usage: python tools/real-vllm-report.py [REPORT_JSON]     (default: .cache/real-vllm-report.json)
Other engines' tiers (SGLang, Triton) write the same shape, their engine facts under their "engine" key (drill_report.Report).
Exit status 0 even when drills failed (pytest's status is the verdict); 1 when the report is unreadable.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT = REPO / os.environ.get("LLM_VITALS_CACHE", ".cache") / "real-vllm-report.json"


def fmt_seconds(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def states_of(timeline: list) -> str:
    """The sequence of states the drill went through, repeats collapsed: idle > busy > stuck > busy."""
    seq: list[str] = []
    for row in timeline:
        state = str(row[1])
        if not seq or seq[-1] != state:
            seq.append(state)
    return " > ".join(seq) or "-"


def table(report: dict) -> list[str]:
    rows = [("drill", "outcome", "took s", "detected", "latency s", "canaries", "verdicts")]
    for d in report.get("drills", []):
        det = d.get("detection") or {}
        canaries = d.get("canaries") or {}
        sent = canaries.get("sent")
        by = ",".join(f"{k}={v:g}" for k, v in sorted((canaries.get("by_result") or {}).items()) if v)
        rows.append((
            d["name"], d.get("outcome", "?"), fmt_seconds(d.get("seconds")), det.get("what", "-"),
            fmt_seconds(det.get("seconds")), "-" if sent is None else f"{sent:g}" + (f" ({by})" if by else ""),
            states_of(d.get("timeline") or []),
        ))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


# The engine's name as the tier's lines print it, by the report's "engine" key.
DISPLAY = {"vllm": "vLLM", "sglang": "SGLang", "triton": "Triton", "llamacpp": "llama.cpp"}


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else DEFAULT
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"real-engine report: cannot read {path}: {exc}", file=sys.stderr)
        return 1
    key = report.get("engine", "vllm")
    name = DISPLAY.get(key, key)
    engine = report.get(key, {})
    starts = ", ".join(f"{s['seconds']:.1f} s" for s in engine.get("starts", [])) or "-"
    exp = report.get("exporter", {})
    settings = ", ".join(f"{k}={v}" for k, v in engine.items() if k not in ("version", "starts", "leftover_pids_after_stop"))
    print(f"== real-{name} drills ({engine.get('version', '?')}, {settings}; "
          f"exporter poll {exp.get('poll_interval')} s, stuck_after {exp.get('stuck_after')} s, "
          f"canary every {exp.get('canary_interval')} s)")
    print(f"{name} starts (to ready): {starts}")
    for line in table(report):
        print(line)
    for d in report.get("drills", []):
        if d.get("facts"):
            print(f"  {d['name']}: " + ", ".join(f"{k}={v}" for k, v in d["facts"].items()))
    print(f"total {fmt_seconds(report.get('total_seconds'))} s; full timelines in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
