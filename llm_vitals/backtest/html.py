"""The backtest as one self-contained HTML page: per target, the state timeline over the pending gauge and the step rate.

Charts are matplotlib figures written as inline SVG (text as text, no fonts or scripts embedded,
nothing fetched when the page is viewed). matplotlib is the optional `html` extra, imported here
only, and this module only when `--html` is given. Each target's episodes are also listed as
plain HTML (`li.episode[data-state]`), so the page reads without the charts and tests can check it.
"""

from __future__ import annotations

import html
import io
import math
from collections.abc import Sequence
from datetime import UTC, datetime

from llm_vitals.backtest import report
from llm_vitals.backtest.replay import TargetReplay
from llm_vitals.backtest.run import Result
from llm_vitals.targets import STATES

STATE_COLOURS = {"starting": "#9e9e9e", "idle": "#a5d6a7", "busy": "#2e7d32", "stuck": "#c62828",
                 "unresponsive": "#ef6c00", "down": "#212121", "asleep": "#1565c0",
                 "waiting_on_peer": "#00838f", "paused": "#5c6bc0"}
MAX_POINTS = 2000  # per curve: a week at 15 s is 40,320 reads, more than a chart's pixels


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _thin(values: Sequence[float]) -> list[float]:
    stride = max(1, math.ceil(len(values) / MAX_POINTS))
    return list(values[::stride])


def chart(result: Result, replay: TargetReplay) -> str:
    """One target's chart as an SVG element."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    with rc_context({"svg.fonttype": "none", "svg.hashsalt": replay.name, "font.size": 8}):
        figure = Figure(figsize=(11, 3.2), layout="constrained")
        timeline, pending, rate = figure.subplots(3, 1, sharex=True, height_ratios=[0.6, 1, 1])
        start = result.window.start
        changes = replay.state_changes
        for i, (at, state) in enumerate(changes):
            until = changes[i + 1][0] if i + 1 < len(changes) else (replay.last_read or at)
            timeline.broken_barh([((at - start) / 3600, max(until - at, result.window.step) / 3600)], (0, 1),
                                 color=STATE_COLOURS.get(state, "#ff00ff"))
        timeline.set_yticks([])
        timeline.set_ylabel("state")
        seen = {state for _, state in changes}
        timeline.legend(handles=[Patch(color=STATE_COLOURS[s], label=s) for s in STATES if s in seen],
                        loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
        trace = replay.trace
        if trace is not None and len(trace.at):
            hours = [(t - start) / 3600 for t in _thin(trace.at)]
            pending.plot(hours, _thin(trace.pending), color="#37474f", linewidth=0.8, drawstyle="steps-post")
            rate.plot(hours, _thin(trace.steps_rate), color="#2e7d32", linewidth=0.8)
        pending.set_ylim(bottom=0)
        rate.set_ylim(bottom=0)
        pending.set_ylabel("pending")
        rate.set_ylabel("steps/s")
        rate.set_xlabel(f"hours since {_when(start)} UTC")
        for axes in (timeline, pending, rate):
            for decision in result.would_restart(replay.name):
                axes.axvline((decision.at - start) / 3600, color="#c62828", linestyle="--", linewidth=1.2)
            for seen_restart in replay.restarts_seen:
                axes.axvline((seen_restart.at - start) / 3600, color="#000000", linestyle=":", linewidth=1.2)
            for begin, _ in replay.watchdog.periods:
                axes.axvline((begin - start) / 3600, color="#ef6c00", linestyle="-", linewidth=0.6, alpha=0.6)
        out = io.StringIO()
        figure.savefig(out, format="svg")
    svg = out.getvalue()
    return svg[svg.index("<svg"):]


STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #212121; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }
td:first-child, th:first-child { text-align: left; }
section.target { margin-bottom: 2em; }
.legend span { margin-right: 1.2em; }
li.episode[data-state="stuck"] { color: #c62828; }
svg { max-width: 100%; height: auto; }
"""


def _incidents(result: Result) -> str:
    """--incidents: the summary line (as the text's), then one row per incident."""
    if result.scored is None:
        return ""
    timeout = report.watchdog_timeout(result)
    rows = "".join(
        f"<tr class='incident' data-kind='{html.escape(i.kind)}'><td>{html.escape(i.what)}</td><td>{_when(i.start)}</td>"
        f"<td>{_when(i.end)}</td><td>{html.escape(i.kind)}</td><td>{html.escape(i.note)}</td>"
        + "".join(f"<td>{report.signed(o.lead_time) if o.caught and o.lead_time is not None else 'missed'}</td>"
                  for o in outcomes.values()) + "</tr>"
        for i, _, outcomes in result.scored.incidents)
    false = "".join(f"<li class='false-alarm'>{html.escape(a.policy)} on {html.escape(a.target)} at {_when(a.start)} "
                    f"({html.escape(a.what)})</li>" for a in result.scored.false_alarms)
    return (f"<h2>Incidents</h2><p class='incidents-summary'>{html.escape(report.incidents_line(result.scored, timeout))}</p>"
            "<table><tr><th>incident</th><th>start</th><th>end</th><th>kind</th><th>note</th><th>llm-vitals</th>"
            f"<th>watchdog</th></tr>{rows}</table><ul>{false}</ul>")


def page(result: Result) -> str:
    """The whole page."""
    window = result.window
    rows, sections = [], []
    for replay in result.targets.values():
        name = html.escape(replay.name)
        would = result.would_restart(replay.name)
        rows.append(f"<tr><td><a href='#t-{name}'>{name}</a></td><td>{html.escape(replay.engine.name)}</td>"
                    f"<td>{sum(1 for e in replay.episodes if e.state == 'stuck')}</td>"
                    f"<td>{len(replay.alerts)}</td><td>{len(would)}</td><td>{len(replay.restarts_seen)}</td>"
                    f"<td>{replay.watchdog.restarts}</td></tr>")
        episodes = "".join(
            f"<li class='episode' data-state='{html.escape(e.state)}' data-start='{e.start:.0f}' data-end='{e.end:.0f}'>"
            f"{html.escape(e.state)} from {_when(e.start)} to {_when(e.end)} ({html.escape(e.reason)}): "
            f"{html.escape(e.detail)}</li>" for e in replay.episodes) or "<li>busy or idle throughout</li>"
        marks = "".join(f"<li class='would-restart'>llm-vitals would restart at {_when(d.at)} ({html.escape(d.alert)})</li>"
                        for d in would)
        marks += "".join(f"<li class='restart-seen'>restart seen at {_when(r.at)}: {html.escape(r.why)}</li>"
                         for r in replay.restarts_seen)
        notes = "".join(f"<li class='note'>{html.escape(n.text)}</li>" for n in replay.notes)
        sections.append(f"<section class='target' id='t-{name}' data-target='{name}'><h2>{name}</h2>"
                        f"{chart(result, replay)}<ul class='episodes'>{episodes}</ul><ul>{marks}{notes}</ul></section>")
    notes = "".join(f"<li class='note'>{html.escape(n.text)}</li>" for n in result.notes)
    scored = _incidents(result)
    if result.live is not None:
        scored += ("<h2>Replay against the live exporter</h2><ul class='live'>"
                   + "".join(f"<li>{html.escape(line)}</li>" for line in report.live_lines(result.live)) + "</ul>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>llm-vitals backtest</title><style>{STYLE}</style></head>
<body>
<h1>llm-vitals backtest</h1>
<p>{_when(window.start)} to {_when(window.end)} UTC, a read every {window.step:g}s. Dashed red: a restart llm-vitals
would have made (the gate allowed it). Dotted black: a restart seen in the history. Orange: a request-based watchdog's
restart (a probe that would have waited past its timeout).</p>
<table><tr><th>target</th><th>engine</th><th>stuck episodes</th><th>alerts</th><th>llm-vitals restarts</th>
<th>restarts seen</th><th>watchdog restarts</th></tr>{''.join(rows)}</table>
{scored}<ul>{notes}</ul>
{''.join(sections)}
</body></html>
"""
