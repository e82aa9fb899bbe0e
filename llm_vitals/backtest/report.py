"""The backtest's result as text (one line per target, then totals) and as JSON. Pure: a Result in, a string out."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from llm_vitals.backtest.incidents import KINDS, Scored
from llm_vitals.backtest.live import Agreement
from llm_vitals.backtest.replay import TargetReplay
from llm_vitals.backtest.run import Result
from llm_vitals.durations import format_duration


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _clock(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%m-%d %H:%M:%S")


def length(seconds: float) -> str:
    """A span as `1h02m`, `2m15s`, `45s`."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def as_json(result: Result) -> dict[str, Any]:
    """The `--json` document."""
    targets = [_target_json(result, replay) for replay in result.targets.values()]
    return {
        "window": {"start": result.window.start, "end": result.window.end, "step": result.window.step,
                   "chunks": result.chunks, "chunks_read": result.chunks_read},
        "targets": targets,
        "totals": {
            "targets": len(targets),
            "episodes": {state: sum(1 for t in targets for e in t["episodes"] if e["state"] == state)
                         for state in sorted({e["state"] for t in targets for e in t["episodes"]})},
            "alerts": sum(len(t["alerts"]) for t in targets),
            "would_restart": sum(t["would_restart"] for t in targets),
            "restarts_seen": sum(t["restarts_seen"] for t in targets),
            "watchdog_restarts": sum(t["watchdog_restarts"] for t in targets),
        },
        "notes": [{"at": n.at, "text": n.text} for n in result.notes],
        **({"incidents": incidents_json(result.scored)} if result.scored is not None else {}),
        **({"live": [live_json(a) for a in result.live]} if result.live is not None else {}),
    }


def live_json(agreement: Agreement) -> dict[str, Any]:
    """--compare-live in the JSON, one target."""
    return {"target": agreement.target, "live_target": agreement.live_target, "compared": agreement.compared,
            "agreed": agreement.agreed, "percent": agreement.percent, "exporter_interval": agreement.interval,
            "disagreements": [{"start": d.start, "end": d.end, "scrapes": d.scrapes, "live": d.live, "replay": d.replay}
                              for d in agreement.disagreements]}


def live_lines(live: list[Agreement]) -> list[str]:
    """--compare-live in the text: a line per target, one per long disagreement, then the overall share."""
    lines = []
    for a in live:
        share = f"{a.percent:.1f}%" if a.percent is not None else "nothing"
        lines.append(f"live {a.target}" + (f" (the exporter's {a.live_target})" if a.live_target != a.target else "")
                     + f": the replay agrees with {share} of {a.compared} exporter scrape(s); "
                     + f"{len(a.disagreements)} disagreement(s) longer than two scrapes")
        lines += [f"    {_clock(d.start)} for {d.scrapes} scrapes: live {d.live}, replay {d.replay}"
                  for d in a.disagreements]
    compared, agreed = sum(a.compared for a in live), sum(a.agreed for a in live)
    overall = f"{100.0 * agreed / compared:.1f}%" if compared else "nothing"
    lines.append(f"compare-live: {len(live)} target(s), the replay agrees with {overall} of {compared} exporter "
                 f"scrape(s); {sum(len(a.disagreements) for a in live)} disagreement(s) longer than two scrapes")
    return lines


def incidents_json(scored: Scored) -> dict[str, Any]:
    """--incidents in the JSON: per policy its totals, per incident each policy's outcome, the false alarms."""
    return {
        "policies": {policy: {"caught": s.caught, "missed": s.missed, "false_alarms": s.false_alarms,
                              "lead_times": s.lead_times, "median_lead_time": s.median_lead_time}
                     for policy, s in scored.scores.items()},
        "incidents": [{"target": i.target, "selector": i.selector, "start": i.start, "end": i.end, "kind": i.kind,
                       "note": i.note, "targets": list(names),
                       **{policy: {"caught": o.caught, "first_alarm": o.first_alarm, "lead_time": o.lead_time,
                                   "on": o.target} for policy, o in outcomes.items()}}
                      for i, names, outcomes in scored.incidents],
        "false_alarms": [{"policy": a.policy, "target": a.target, "start": a.start, "end": a.end, "what": a.what}
                         for a in scored.false_alarms],
        "unscored": [{"what": i.what, "start": i.start, "end": i.end, "why": why} for i, why in scored.unscored],
    }


def incidents_line(scored: Scored, watchdog_timeout: str) -> str:
    """The one-line summary of --incidents: each policy's caught, missed, false alarms and lead times."""
    kinds = ", ".join(f"{sum(1 for i, _, _ in scored.incidents if i.kind == kind)} {kind}"
                      for kind in KINDS if any(i.kind == kind for i, _, _ in scored.incidents))
    parts = []
    for policy, s in scored.scores.items():
        name = "llm-vitals" if policy == "llm-vitals" else f"a watchdog with a {watchdog_timeout} timeout"
        lead = ""
        if s.lead_times:
            low, high = min(s.lead_times), max(s.lead_times)
            lead = (f", lead time {signed(low)}" if low == high else
                    f", lead time {signed(low)} to {signed(high)} (median {signed(s.median_lead_time or 0.0)})")
        parts.append(f"{name} caught {s.caught}, missed {s.missed}, {s.false_alarms} false alarm(s){lead}")
    skipped = f" ({len(scored.unscored)} not scored)" if scored.unscored else ""
    return f"incidents: {len(scored.incidents)} scored ({kinds or 'none'}){skipped}; " + "; ".join(parts)


def signed(seconds: float) -> str:
    """A lead time: `+1m15s` after the incident's start, `-3h15m` before it."""
    return ("-" if seconds < 0 else "+") + length(abs(seconds))


def _target_json(result: Result, replay: TargetReplay) -> dict[str, Any]:
    return {
        "target": replay.name,
        "engine": replay.engine.name,
        "workload": replay.workload,
        "first_read": replay.first_read,
        "last_read": replay.last_read,
        "reads": replay.reads,
        "missed_reads": replay.missed_reads,
        "episodes": [{"state": e.state, "start": e.start, "end": e.end, "reason": e.reason, "detail": e.detail}
                     for e in replay.episodes],
        "alerts": [{"alert": a.alert, "active_at": a.active_at, "start": a.start, "end": a.end, "restart": a.restart}
                   for a in replay.alerts],
        "gate": [{"at": d.at, "alert": d.alert, "allowed": d.allowed, "reason": d.reason, "detail": d.detail}
                 for d in result.decisions if d.target == replay.name],
        "would_restart": len(result.would_restart(replay.name)),
        "restarts_seen": len(replay.restarts_seen),
        "restarts_seen_at": [{"at": r.at, "why": r.why} for r in replay.restarts_seen],
        "watchdog_restarts": replay.watchdog.restarts,
        "watchdog_periods": [{"start": s, "end": e} for s, e in replay.watchdog.periods],
        "notes": [{"at": n.at, "text": n.text} for n in replay.notes],
    }


def as_text(result: Result) -> str:
    """One line per target, its notes indented below it, then the totals and the notes on the whole history."""
    window = result.window
    lines = [f"backtest {iso(window.start)} to {iso(window.end)}, a read every {window.step:g}s "
             f"({result.chunks_read} of {result.chunks} chunk(s) read)"]
    for replay in result.targets.values():
        lines.append(_target_line(result, replay))
        lines += [f"    note{f' {_clock(n.at)}' if n.at is not None else ''}: {n.text}" for n in replay.notes]
    data = as_json(result)["totals"]
    episodes = ", ".join(f"{count} {state}" for state, count in data["episodes"].items()) or "none"
    lines.append(f"totals: {data['targets']} target(s); episodes: {episodes}; {data['alerts']} alert(s); "
                 f"llm-vitals would have restarted {data['would_restart']}; restarts seen {data['restarts_seen']}; "
                 f"a watchdog with a {watchdog_timeout(result)} timeout would have restarted {data['watchdog_restarts']}")
    if result.live is not None:
        lines += live_lines(result.live)
    if result.scored is not None:
        lines += _incident_lines(result.scored)
        lines.append(incidents_line(result.scored, watchdog_timeout(result)))
    lines += [f"note{f' {_clock(n.at)}' if n.at is not None else ''}: {n.text}" for n in result.notes]
    return "\n".join(lines) + "\n"


def _incident_lines(scored: Scored) -> list[str]:
    lines = []
    for incident, names, outcomes in scored.incidents:
        said = "; ".join(f"{policy} " + (f"caught at {_clock(o.first_alarm)} ({signed(o.lead_time)})"
                                         if o.caught and o.first_alarm is not None and o.lead_time is not None
                                         else "missed")
                         for policy, o in outcomes.items())
        note = f" \"{incident.note}\"" if incident.note else ""
        lines.append(f"incident {incident.kind} {incident.what} {_clock(incident.start)} for "
                     f"{length(incident.end - incident.start)}{note} ({len(names)} target(s)): {said}")
    lines += [f"false alarm: {a.policy} on {a.target} at {_clock(a.start)} ({a.what})" for a in scored.false_alarms]
    lines += [f"incident not scored: {i.what} {_clock(i.start)}: {why}" for i, why in scored.unscored]
    return lines


def watchdog_timeout(result: Result) -> str:
    first = next(iter(result.targets.values()), None)
    return format_duration(first.watchdog.timeout) if first is not None else "?"


def _target_line(result: Result, replay: TargetReplay) -> str:
    episodes = ", ".join(f"{e.state} {_clock(e.start)} for {length(e.end - e.start)}"
                         for e in replay.episodes) or "busy/idle throughout"
    alerts = ", ".join(f"{a.alert} {_clock(a.start)}" for a in replay.alerts) or "none"
    restarts = result.would_restart(replay.name)
    would = f"{len(restarts)}" + (f" ({', '.join(_clock(d.at) for d in restarts)})" if restarts else "")
    refused = sorted({d.reason for d in result.decisions if d.target == replay.name and not d.allowed})
    if refused:
        would += f", refused: {', '.join(refused)}"
    seen = f"{len(replay.restarts_seen)}" + (
        f" ({', '.join(f'{_clock(r.at)} {r.why}' for r in replay.restarts_seen)})" if replay.restarts_seen else "")
    return (f"{replay.name} ({replay.engine.name}): {episodes}; alerts: {alerts}; would restart: {would}; "
            f"restarts seen: {seen}; watchdog restarts: {replay.watchdog.restarts}")


def dumps(result: Result) -> str:
    return json.dumps(as_json(result), indent=2) + "\n"
