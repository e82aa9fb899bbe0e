"""The tier's JSON summary, `.cache/real-vllm-report.json`, rewritten after every drill.

Shape (read by tools/real-vllm-report.py):
{"started_at", "finished_at", "total_seconds", "vllm": {"version", "enforce_eager", "starts": [...]},
 "exporter": {"poll_interval", "stuck_after", "canary_interval"},
 "drills": [{"name", "outcome", "seconds", "detection": {"what", "seconds"} | null,
             "canaries": {"sent", "by_result"}, "timeline": [[t, state, reason, running, waiting, ready, live]],
             "facts": {...}}]}
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from .vllm_server import CACHE

REPORT_PATH = CACHE / "real-vllm-report.json"


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

    def line(self) -> str:
        det = f"{self.detection['what']}: {self.detection['seconds']:.1f} s" if self.detection else "-"
        seq: list[str] = []
        for row in self.timeline:
            if not seq or seq[-1] != str(row[1]):
                seq.append(str(row[1]))
        states = " > ".join(seq) or "-"
        return (
            f"{self.name:<13} {self.outcome:<7} {self.seconds or 0:>6.1f} s  {det}; "
            f"canaries sent: {self.canaries.get('sent')}; states: {states}"
        )


@dataclass
class Report:
    path: Path = REPORT_PATH
    started: float = field(default_factory=time.time)
    drills: dict[str, Drill] = field(default_factory=dict)
    vllm: dict = field(default_factory=dict)  # the engine's facts (version, starts), whichever engine
    exporter: dict = field(default_factory=dict)
    engine: str = "vllm"  # the key the engine's facts are written under (the SGLang tier: "sglang", Triton: "triton")

    def drill(self, name: str) -> Drill:
        self.drills[name] = Drill(name)
        return self.drills[name]

    def write(self) -> None:
        now = time.time()
        data = {
            "started_at": self.started,
            "finished_at": now,
            "total_seconds": round(now - self.started, 1),
            "engine": self.engine,
            self.engine: self.vllm,
            "exporter": self.exporter,
            "drills": [d.as_dict() for d in self.drills.values()],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(self.path)
