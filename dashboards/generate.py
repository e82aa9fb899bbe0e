"""Writes `dashboards/llm-vitals.json`, the Grafana dashboard, from the panel list below.

Run `python dashboards/generate.py` after changing a panel; `tests/test_dashboard.py` fails while
the committed JSON and this script disagree.

Why a plain script and not grafana-foundation-sdk: the SDK's PyPI releases carry a build-time
epoch (`1769699998!10.1.0`), so a plain `pip install grafana-foundation-sdk` resolves to its
Grafana 10.1 build, and targeting Grafana 11 means pinning an opaque epoch string. For ten panels
that is more dependency than help. What the SDK would guarantee (every panel has a data source, a
query and a layout slot) this script guarantees by construction, and the tests check it on the JSON
that ships, including that every query parses (promtool) and names only contract metrics.

Queries use only the metric contract (docs/metrics.md, listed in `dashboards/queries.py`) and two
variables, both multi-select with "All" = `.+`: `$engine` (`label_values(llm_vitals_target_info,
engine)`) and `$target` (the targets of the chosen engines). Every panel keeps only the targets
whose `llm_vitals_target_info` has a chosen engine (`and on (target)`), so picking `triton` shows
the Triton targets even when `$target` is "All".
"""

from __future__ import annotations

import json
from pathlib import Path

OUTPUT = Path(__file__).resolve().parent / "llm-vitals.json"

# Every panel and the target variable read from the data source chosen in the `datasource`
# variable, so the dashboard imports into any Grafana; provisioning (deploy/compose) points it at
# the Prometheus whose uid is `prometheus`.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'target=~"$target"'
# The targets of the chosen engines: llm_vitals_target_info carries each target's `engine`.
ENGINE_INFO = 'llm_vitals_target_info{engine=~"$engine"}'


def of_engine(expr: str) -> str:
    """`expr`, one series per target, kept only for targets of the chosen engines.

    `and on (target)` filters without touching values or labels; for a query that aggregates the
    target away (decisions by reason), filter inside the aggregation instead.
    """
    return f"({expr})\nand on (target) {ENGINE_INFO}"

# The exporter's states, in the order the state timeline numbers them (1..9) and with the colour
# each gets. `idle` and `busy` are both healthy; only stuck/unresponsive lead to a restart; `asleep`
# (vLLM's sleep mode, on purpose) and `paused` (a pause on purpose) are neither.
STATES = [
    ("starting", "blue"),
    ("idle", "green"),
    ("busy", "dark-green"),
    ("stuck", "red"),
    ("unresponsive", "orange"),
    ("down", "purple"),
    ("asleep", "text"),
    ("waiting_on_peer", "light-blue"),
    ("paused", "semi-dark-purple"),
]


def state_number_expr() -> str:
    """One number per target naming its current state (1..9), from the one-hot `llm_vitals_state`.

    Each state's series is kept only where it is 1 and multiplied by its number; `or` keeps them
    apart (their `state` labels differ) and `max by (target)` leaves the one current number. Unlike
    `a + ignoring(state) b`, this still works when a target lacks a series for some state.
    """
    parts = [
        f'(llm_vitals_state{{{SEL},state="{name}"}} == 1) * {number}'
        for number, (name, _) in enumerate(STATES, start=1)
    ]
    return of_engine("max by (target) (\n  " + "\n  or ".join(parts) + "\n)")


def target(expr: str, legend: str, ref_id: str = "A") -> dict:
    return {
        "datasource": DATASOURCE,
        "refId": ref_id,
        "expr": expr,
        "legendFormat": legend,
        "range": True,
        "editorMode": "code",
    }


def timeseries(title: str, description: str, targets: list[dict], unit: str = "short",
               bars: bool = False, thresholds: list[tuple[float, str]] | None = None) -> dict:
    steps = [{"color": "green", "value": None}]
    steps += [{"color": color, "value": value} for value, color in thresholds or []]
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "min": 0,
                "custom": {
                    "drawStyle": "bars" if bars else "line",
                    "fillOpacity": 60 if bars else 10,
                    "lineWidth": 1,
                    "showPoints": "never",
                    "spanNulls": False,
                    "thresholdsStyle": {"mode": "line" if thresholds else "off"},
                },
                "thresholds": {"mode": "absolute", "steps": steps},
            },
            "overrides": [],
        },
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def state_timeline() -> dict:
    mappings = [
        {
            "type": "value",
            "options": {
                str(number): {"text": name, "color": color, "index": number - 1}
                for number, (name, color) in enumerate(STATES, start=1)
            },
        }
    ]
    return {
        "type": "state-timeline",
        "title": "State per target",
        "description": "The exporter's verdict for each target (llm_vitals_state). busy = work "
        "pending and progressing (healthy, maybe full); stuck = work pending and no engine progress "
        "for stuck_after; unresponsive = idle-looking but the canary keeps failing; down = "
        "unreachable or engine dead; asleep = put to sleep on purpose (vLLM sleep mode: no canary, "
        "not ready); waiting_on_peer = only work the engine deferred (a KV transfer from a peer) is pending, "
        "and nothing moves: the peer's fault, never restarted; paused = the engine stopped on purpose (vLLM's "
        "/pause, a weight update, a sleep with requests kept, SGLang's paused requests): no canary, never "
        "restarted, pages past pause_budget. Only stuck and unresponsive are restarted.",
        "datasource": DATASOURCE,
        "targets": [target(state_number_expr(), "{{target}}")],
        "fieldConfig": {
            "defaults": {
                "mappings": mappings,
                "color": {"mode": "thresholds"},
                "thresholds": {"mode": "absolute", "steps": [{"color": "text", "value": None}]},
                "custom": {"fillOpacity": 80, "lineWidth": 0},
            },
            "overrides": [],
        },
        "options": {
            "mergeValues": True,
            "showValue": "auto",
            "alignValue": "left",
            "rowHeight": 0.9,
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "single", "sort": "none"},
        },
    }


def panels() -> list[dict]:
    """The panels in reading order: verdict first, then the evidence, then the actions."""
    rate = "$__rate_interval"
    rows: list[list[tuple[int, dict]]] = [
        [(24, state_timeline())],
        [
            (12, timeseries(
                "Engine steps per second",
                "Engine steps that produced output, per second between the exporter's last two "
                "reads (llm_vitals_engine_steps_per_second): vLLM iterations, llama.cpp decode "
                "calls, Triton executions, SGLang forward passes (none for an openai target). A busy "
                "target at 0 here is the picture of a hang; a long prefill can show 0 briefly "
                "while other signals move, and Triton counts an execution only when it completes.",
                [target(of_engine(f"llm_vitals_engine_steps_per_second{{{SEL}}}"), "{{target}}")],
                unit="ops")),
            (12, timeseries(
                "Generated tokens per second",
                "Output tokens per second (llm_vitals_generation_tokens_per_second).",
                [target(of_engine(f"llm_vitals_generation_tokens_per_second{{{SEL}}}"), "{{target}}")],
                unit="short")),
        ],
        [
            (12, timeseries(
                "Requests running / waiting",
                "As the engine reports them (Triton counts only queued requests: running reads 0). "
                "A long queue with steps moving is load (busy), not a fault: it never triggers a "
                "restart.",
                [
                    target(of_engine(f"llm_vitals_requests_running{{{SEL}}}"), "{{target}} running", "A"),
                    target(of_engine(f"llm_vitals_requests_waiting{{{SEL}}}"), "{{target}} waiting", "B"),
                ])),
            (12, timeseries(
                "Seconds without progress while work is pending",
                "llm_vitals_stuck_seconds: 0 when idle or progressing. The target turns stuck once "
                "this passes its stuck_after (60 s by default, the red line).",
                [target(of_engine(f"llm_vitals_stuck_seconds{{{SEL}}}"), "{{target}}")],
                unit="s", thresholds=[(60, "red")])),
        ],
        [
            (8, timeseries(
                "Restarts detected",
                "Restarts seen by the exporter (start time changed or counters reset), whoever "
                "did them: remediator, supervisor, kubelet or a person.",
                [target(of_engine(f"sum by (target) (increase(llm_vitals_restarts_total{{{SEL}}}[{rate}]))"),
                        "{{target}}")],
                bars=True)),
            (8, timeseries(
                "Canary results",
                "1-token completions sent only to idle-looking targets, by result. A busy target "
                "should get none.",
                [target(of_engine("sum by (target, result) (increase(llm_vitals_canary_requests_total"
                                  f"{{{SEL}}}[{rate}]))"), "{{target}} {{result}}")],
                bars=True)),
            (8, timeseries(
                "Remediator decisions by reason",
                "Each gate decision of the remediator (llm_vitals_remediator_decisions_total): "
                "allowed means a restart ran; every other reason is a deliberate refusal "
                "(cooldown, fleet_gate, not_stuck, ...).",
                [target("sum by (reason) (\n  increase(llm_vitals_remediator_decisions_total"
                        f"{{{SEL}}}[{rate}])\n  and on (target) {ENGINE_INFO}\n)", "{{reason}}")],
                bars=True)),
        ],
        [
            (12, timeseries(
                "Probe answers (1 = pass)",
                "What /probe/<target>/ready and /live answer (llm_vitals_ready, llm_vitals_live). "
                "Ready never depends on queue length.",
                [
                    target(of_engine(f"llm_vitals_ready{{{SEL}}}"), "{{target}} ready", "A"),
                    target(of_engine(f"llm_vitals_live{{{SEL}}}"), "{{target}} live", "B"),
                ])),
            (12, timeseries(
                "Age of the last poll",
                "Seconds since the exporter last completed a poll of the target. Verdicts older "
                "than a minute are stale (alert LLMVitalsPollingStale).",
                [target(of_engine(f"time() - llm_vitals_last_poll_timestamp_seconds{{{SEL}}}"), "{{target}}")],
                unit="s", thresholds=[(60, "red")])),
        ],
        [
            (12, timeseries(
                "Pace beside its peers (time per token / peers' median)",
                "llm_vitals_pace_ratio: the target's seconds per output token over the median of its "
                "workload's peers' (1 keeps pace; no line when it is alone, idle or did too little work). "
                "At or above pace.ratio (2, the red line) for pace.degraded_after it is degraded.",
                [target(of_engine(f"llm_vitals_pace_ratio{{{SEL}}}"), "{{target}}")],
                unit="short", thresholds=[(2, "red")])),
            (12, timeseries(
                "Degraded (1 = limping beside its peers)",
                "llm_vitals_degraded: serving at a fraction of its peers' pace for pace.degraded_after "
                "(alert LLMServerDegraded). Not a state and never a restart: look at its node.",
                [target(of_engine(f"llm_vitals_degraded{{{SEL}}}"), "{{target}}")],
                unit="short")),
        ],
    ]
    out: list[dict] = []
    y = 0
    for row in rows:
        height = 8
        x = 0
        for width, panel in row:
            panel = {"id": len(out) + 1, "gridPos": {"h": height, "w": width, "x": x, "y": y},
                     **panel}
            out.append(panel)
            x += width
        y += height
    return out


def multi_variable(name: str, label: str, query: str) -> dict:
    """A multi-select query variable over llm_vitals_target_info, "All" by default."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        # The plain-string form: every Grafana since 7 reads it (newer ones migrate it).
        "query": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        # A regex Grafana puts in `label=~"$name"` when "All" is chosen: cheaper than the
        # alternation of every value, and it includes targets (or engines) added later.
        "allValue": ".+",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
        "regex": "",
        "options": [],
    }


def templating() -> dict:
    return {
        "list": [
            {
                "name": "datasource",
                "label": "Data source",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "hide": 0,
                "refresh": 1,
                "regex": "",
                "options": [],
            },
            multi_variable("engine", "Engine", "label_values(llm_vitals_target_info, engine)"),
            # Only the targets of the chosen engines (Grafana refreshes it when $engine changes).
            multi_variable("target", "Target", f"label_values({ENGINE_INFO}, target)"),
        ]
    }


def dashboard() -> dict:
    return {
        "uid": "llm-vitals",
        "title": "llm-vitals",
        "description": "LLM server health from the engines' own counters: verdicts, progress, "
        "load, canaries and the remediator's decisions.",
        "tags": ["llm-vitals", "llm", "vllm", "llama.cpp", "triton", "sglang", "tgi"],
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "schemaVersion": 39,
        "version": 1,
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": templating(),
        "panels": panels(),
        "links": [],
    }


def render() -> str:
    """The dashboard as the committed file holds it (stable key order, trailing newline)."""
    return json.dumps(dashboard(), indent=2) + "\n"


def main() -> int:
    OUTPUT.write_text(render())
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
