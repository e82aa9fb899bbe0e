"""Print the GPU tier's results: one line per drill (tests/real_gpu/gpu_drills.py) and the NVML figures (nvml_check.py).

usage: python tests/real_gpu/report.py OUTDIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The facts worth a column, per drill, in the order shown.
SHOWN = ("ready_s", "canaries", "busy_s", "not_busy", "watchdog_1token_s", "exporter_answer_s_max", "ready_probe_s_max",
         "poll_s_max", "states", "stuck_after_s", "reason", "ready", "live", "back_s", "down_s", "restarts_added",
         "faults", "errors", "failure")  # fmt: skip


def lines(out: Path) -> list[str]:
    """The report as text lines; a missing file is a line saying so."""
    shown: list[str] = []
    drills = out / "report.json"
    if drills.is_file():
        report = json.loads(drills.read_text())
        shown.append(f"drills ({'GPU' if report['mode']['gpu'] else 'CPU flow check'}):")
        for name, facts in report["steps"].items():
            detail = ", ".join(f"{key} {facts[key]}" for key in SHOWN if key in facts and facts[key] not in ([], None))
            shown.append(f"  {facts['outcome']:<7} {name:<20} {facts['seconds']:>6.1f} s  {detail}")
    else:
        shown.append(f"drills: no report ({drills})")
    nvml = out / "nvml.json"
    if nvml.is_file():
        facts = json.loads(nvml.read_text())
        if "open_ms" in facts:
            reads = ", ".join(f"{r['read_us_steady']} µs" for r in facts.get("reads", []))
            source = facts.get("source", {})
            shown.append(f"NVML: {', '.join(facts['gpus'])}; open {facts['open_ms']} ms; a GPU's read (3 calls) {reads}; "
                         f"Xid wait {facts['xid_wait_200ms']['ms']} ms, events {facts['xid_wait_200ms']['events']}; "
                         f"the source at 0.1 s: {source.get('cpu_percent_of_a_core_at_0.1s')} % of a core, "
                         f"verdicts {source.get('verdicts')}")  # fmt: skip
        else:
            shown.append(f"NVML (no GPU): {facts.get('open')}; the source: {facts.get('source')}")
        shown.extend(f"  NVML check failed: {failure}" for failure in facts.get("failures", []))
    else:
        shown.append(f"NVML: no report ({nvml})")
    return shown


if __name__ == "__main__":
    print("\n".join(lines(Path(sys.argv[1]))))
