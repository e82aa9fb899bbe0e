"""`make bench` entry for the incident replay (bench/incident_replay.py): a compressed day, baseline
watchdogs against llm-vitals, printed as a table. Exits 1 when the replay does not show what it
must: the baseline restarts a healthy server several times, llm-vitals 0 times, then exactly once
for the true hang, with no canary ever sent to a busy server.

    .venv/bin/python bench/bench_incident_replay.py [--hours 24] [--seed 7]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from incident_replay import main

if __name__ == "__main__":
    sys.exit(main())
