"""Every PromQL query of the shipped dashboard, with Grafana's variables filled in.

The offline tests check these against the metric contract and promtool's parser; the end-to-end
test runs them against a real Prometheus and expects data from each. Standard library only, so it
can be loaded by path (`importlib`) from any test without installing anything.

    from dashboards.queries import dashboard_queries
    for q in dashboard_queries(target="gpu-a|gpu-b", rate_interval="30s"):
        print(q.panel, q.ref_id, q.expr)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import NamedTuple

DASHBOARD = Path(__file__).resolve().parent / "llm-vitals.json"

# The metric names the dashboard may use: the exporter's contract (docs/metrics.md) plus the
# remediator's decision counter. A query naming anything else is a bug in the dashboard or a
# contract change that must be made in docs/metrics.md (and the collector) first.
CONTRACT_METRICS = frozenset({
    "llm_vitals_target_info",
    "llm_vitals_up",
    "llm_vitals_state",
    "llm_vitals_requests_running",
    "llm_vitals_requests_waiting",
    "llm_vitals_engine_steps_per_second",
    "llm_vitals_generation_tokens_per_second",
    "llm_vitals_stuck_seconds",
    "llm_vitals_restarts_total",
    "llm_vitals_process_start_time_seconds",
    "llm_vitals_canary_requests_total",
    "llm_vitals_canary_last_success_timestamp_seconds",
    "llm_vitals_ready",
    "llm_vitals_live",
    "llm_vitals_draining",
    "llm_vitals_gpu_fault",
    "llm_vitals_pace_ratio",
    "llm_vitals_degraded",
    "llm_vitals_last_poll_timestamp_seconds",
    "llm_vitals_poll_duration_seconds",
    "llm_vitals_poll_errors_total",
    "llm_vitals_remediator_decisions_total",
})


class PanelQuery(NamedTuple):
    panel: str
    ref_id: str
    expr: str


def load_dashboard(path: Path = DASHBOARD) -> dict:
    """The dashboard JSON as shipped."""
    return json.loads(Path(path).read_text())


def substitute(expr: str, target: str = ".+", rate_interval: str = "1m", range_: str = "1h",
               interval: str = "15s", engine: str = ".+") -> str:
    """Fill in `$target` and `$engine` (regexes, as Grafana renders a multi-value variable) and the built-ins."""
    values = {
        "target": target,
        "engine": engine,
        "__rate_interval": rate_interval,
        "__range": range_,
        "__interval": interval,
    }

    def repl(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise ValueError(f"dashboard query uses unknown variable ${name}: {expr}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, expr)


def dashboard_queries(target: str = ".+", rate_interval: str = "1m", range_: str = "1h",
                      dashboard: dict | None = None, engine: str = ".+") -> list[PanelQuery]:
    """One entry per query of every panel, variables substituted (see `substitute`)."""
    board = load_dashboard() if dashboard is None else dashboard
    out = []
    for panel in board["panels"]:
        for tgt in panel.get("targets", []):
            out.append(PanelQuery(panel["title"], tgt["refId"],
                                  substitute(tgt["expr"], target, rate_interval, range_, engine=engine)))
    return out


def variable_query(dashboard: dict | None = None, name: str = "target") -> str:
    """A variable's query as written, e.g. `label_values(llm_vitals_target_info{engine=~"$engine"}, target)`."""
    board = load_dashboard() if dashboard is None else dashboard
    for var in board["templating"]["list"]:
        if var["name"] == name:
            query = var["query"]
            return query["query"] if isinstance(query, dict) else query
    raise KeyError(f"dashboard has no `{name}` variable")


def metric_names(expr: str) -> set[str]:
    """Metric names in a query: every `name{` selector, and any `llm_vitals_` identifier."""
    selectors = set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{", expr))
    ours = set(re.findall(r"\bllm_vitals_[a-zA-Z0-9_:]*", expr))
    return selectors | ours


if __name__ == "__main__":
    for q in dashboard_queries():
        print(f"# {q.panel} [{q.ref_id}]\n{q.expr}\n")
