"""TGI `/metrics` pages built from TGI's own metric definitions, rendered by the simulator's TGI page.

No TGI runs on this machine kind, so these stand in for captured pages (tests/fixtures/tgi/ holds
the ones this module writes; `python tests/tgi_pages.py` rewrites them, a test checks they match).
What is followed (llm_vitals/sim/engines/tgi.py and llm_vitals/exporter/engines/tgi.py name TGI's files and commit):
the names, labels, HELP texts and types of TGI's router/src/server.rs, its generated-tokens buckets
(max_total_tokens / 100 * (i + 1)), and metrics-exporter-prometheus 0.15's layout.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llm_vitals.sim.engines.tgi import HistogramView, TgiState, render

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tgi"
MAX_TOTAL_TOKENS = 2048


def generated(values: list[int]) -> HistogramView:
    """TGI's generated-tokens histogram over the given requests, with TGI's own bucket bounds."""
    bounds = [MAX_TOTAL_TOKENS / 100 * (i + 1) for i in range(100)]
    return [(b, sum(1 for v in values if v <= b)) for b in bounds], float(sum(values)), len(values)


def state(**counted: Any) -> TgiState:
    return TgiState(max_total_tokens=MAX_TOTAL_TOKENS, **counted)


BUSY = dict(requests=4, success=1, prefills=2, queue=1.0, batch=2.0, batch_max_tokens=3800.0, generated_tokens=generated([64]))

# The story of one TGI lifetime and the next: the pages the tests read.
PAGES: dict[str, TgiState] = {
    # Warmed up, nothing served yet: only the gauge set at start-up exists.
    "idle": state(),
    "idle-after-one-request": state(requests=1, success=1, prefills=1, decodes=63, queue=0.0, batch=0.0,
                                    batch_max_tokens=0.0, generated_tokens=generated([64])),
    # 3 requests, 2 in the batch, 1 queued; 6 s apart the decode forwards moved.
    "busy-1": state(decodes=451, **BUSY),
    "busy-2": state(decodes=709, **BUSY),
    # The shard hung in a forward: the router keeps answering, every counter frozen at busy-2's.
    "frozen": state(decodes=709, **BUSY),
    # A new process after one canary: its counters start again (no start-time metric). Before its
    # first request a new process has no counter at all, and nothing can be compared yet.
    "restarted-idle": state(requests=1, success=1, prefills=1, decodes=0, queue=0.0, batch=0.0,
                            batch_max_tokens=0.0, generated_tokens=generated([1])),
}


def write_fixtures() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, page_state in PAGES.items():
        (FIXTURES / f"tgi-from-source-metrics-{name}.txt").write_text(render(page_state))


if __name__ == "__main__":
    write_fixtures()
