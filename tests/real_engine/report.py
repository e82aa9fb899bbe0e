"""A real-engine tier's report, `.cache/real-<engine>/report.json`, rewritten after every drill, and its summary table.

Stdlib only: tools/real-engine-report.py loads this file by its path to print the table after a run.
Shape:
{"started_at", "finished_at", "total_seconds", "engine": "<key>", "name": "vLLM", "<key>": {"version", ..., "starts": [...]},
 "exporter": {"poll_interval", "stuck_after", "liveness_budget", "metrics_timeout", "canary_interval", ...},
 "drills": [{"name", "outcome", "seconds", "detection": {"what", "seconds"} | null,
             "canaries": {"sent", "by_result"}, "timeline": [[t, state, reason, running, waiting, ready, live]],
             "facts": {...}}]}
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Drill:
    name: str
    started: float = field(default_factory=time.time)
    seconds: float | None = None
    outcome: str = "running"
    detection: dict | None = None
    canaries: dict = field(default_factory=lambda: {"sent": None, "by_result": {}})
    timeline: list = field(default_factory=list)
    facts: dict = field(default_factory=dict)

    def detected(self, what: str, seconds: float) -> None:
        self.detection = {"what": what, "seconds": round(seconds, 2)}

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "outcome": self.outcome,
            "seconds": self.seconds,
            "detection": self.detection,
            "canaries": self.canaries,
            "timeline": self.timeline,
            "facts": self.facts,
        }


@dataclass
class Report:
    path: Path
    engine: str  # the key the engine's facts are written under ("vllm", "sglang", "triton", "llamacpp")
    name: str  # as the tier's lines print it ("vLLM", "llama.cpp")
    logs: Path | None = None
    started: float = field(default_factory=time.time)
    drills: dict[str, Drill] = field(default_factory=dict)
    server: dict = field(default_factory=dict)  # the engine's facts (version, settings, starts)
    exporter: dict = field(default_factory=dict)

    def drill(self, name: str) -> Drill:
        self.drills[name] = Drill(name)
        return self.drills[name]

    def as_dict(self) -> dict:
        now = time.time()
        return {
            "started_at": self.started,
            "finished_at": now,
            "total_seconds": round(now - self.started, 1),
            "engine": self.engine,
            "name": self.name,
            self.engine: self.server,
            "exporter": self.exporter,
            "drills": [d.as_dict() for d in self.drills.values()],
        }

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.as_dict(), indent=2) + "\n")
        tmp.replace(self.path)


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
    """The summary table: a row per drill (outcome, time, what was detected how fast, canaries, verdicts)."""
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


def starts_line(report: dict) -> str:
    """The engine's starts, each to ready."""
    key = report.get("engine", "vllm")
    starts = ", ".join(f"{s['seconds']:.1f} s (pid {s['pid']})" for s in report.get(key, {}).get("starts", [])) or "-"
    return f"{report.get('name', key)} starts (to ready): {starts}"


def summary(report: dict, path: Path) -> list[str]:
    """What the tier prints at the end: the settings, the starts, the table, each drill's facts."""
    key = report.get("engine", "vllm")
    engine = report.get(key, {})
    settings = ", ".join(f"{k}={v}" for k, v in engine.items() if k not in ("version", "starts", "leftover_pids_after_stop"))
    exporter = ", ".join(f"{k}={v}" for k, v in report.get("exporter", {}).items())
    lines = [f"== real-{report.get('name', key)} drills ({engine.get('version', '?')}; {settings}; exporter {exporter})",
             starts_line(report), *table(report)]
    for d in report.get("drills", []):
        if d.get("facts"):
            lines.append(f"  {d['name']}: " + ", ".join(f"{k}={v}" for k, v in d["facts"].items()))
    lines.append(f"total {fmt_seconds(report.get('total_seconds'))} s; full timelines in {path}")
    return lines


def main(argv: list[str]) -> int:
    """tools/real-engine-report.py REPORT_JSON: print the summary; 1 when the report is unreadable."""
    if len(argv) != 2:
        print("usage: tools/real-engine-report.py REPORT_JSON", file=sys.stderr)
        return 2
    path = Path(argv[1])
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"real-engine report: cannot read {path}: {exc}", file=sys.stderr)
        return 1
    for line in summary(report, path):
        print(line)
    return 0
