"""The status page at `/`: one server-rendered HTML page that refreshes itself, no build step.

One row per target (its workload under its name, when that is more than the name; state, reason,
time in state, running/waiting, steps/s with an inline SVG sparkline of the last few minutes) from
the exporter's cache, and the remediator's recent decisions when `remediator_url` is set. The page
is for people; machines read `/api/v1/targets` and `/metrics`. Everything from a target, a config or
the remediator is HTML-escaped: a target name or a remediator detail must never become markup.

`render_page()` is pure (data and `now` in, HTML out) so that tests render it without a server;
`setup_status_page(app)` wires it into the exporter app. No handler awaits the remediator: a
background task reads its decisions once at startup and then every refresh interval, and the page
renders from that cache.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import SecretStr

from llm_vitals.exporter.keys import CLOCK, SESSION, SETTINGS, STORE
from llm_vitals.exporter.state import target_view
from llm_vitals.targets import UNHEALTHY_STATES, TargetView

log = logging.getLogger("llm_vitals.exporter")

# The sparkline shows at most this much history (the exporter may keep more, `history_seconds`).
SPARK_WINDOW_SECONDS = 300.0
SPARK_MIN_SECONDS = 60.0
SPARK_WIDTH, SPARK_HEIGHT = 160, 28
# A slow or dead remediator must not hold the reader (nor the exporter's startup) for long.
REMEDIATOR_TIMEOUT_SECONDS = 1.0
ACTIONS_LIMIT = 10

STATE_COLOURS = {
    "idle": "#6b7280",
    "busy": "#2563eb",
    "stuck": "#dc2626",
    "unresponsive": "#ea580c",
    "asleep": "#6d28d9",
    "down": "#7f1d1d",
    "starting": "#a16207",
    "waiting_on_peer": "#0e7490",
    "paused": "#4f46e5",
}


@dataclass(frozen=True)
class Decisions:
    """The remediator's recent actions, or why they could not be shown (`note`)."""

    actions: Sequence[Mapping[str, Any]] = ()
    note: str | None = None
    url: str | None = None
    pause: Mapping[str, Any] | None = None  # the remediator's pause, when it reports one in force


def _text(value: object) -> str:
    return "" if value is None else escape(str(value), quote=True)


def elapsed_text(seconds: float | None) -> str:
    """`42s`, `3m 05s`, `2h 01m`: a human-sized time in state."""
    if seconds is None:
        return "–"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def _number(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def sparkline(points: Iterable[Sequence[Any]], now: float, window: float = SPARK_WINDOW_SECONDS) -> str:
    """An inline SVG of steps/s over the last `window` seconds; stuck/unresponsive/down polls shaded.

    `points` are the exporter's history entries `(unix_time, steps_per_second, state)`.
    """
    recent = [(float(t), float(v or 0.0), str(s)) for t, v, s, *_ in points if float(t) >= now - window]
    # A young history is stretched over at least a minute, not squeezed into the right edge.
    if recent:
        window = min(window, max(SPARK_MIN_SECONDS, now - recent[0][0]))
    start = now - window
    w, h = SPARK_WIDTH, SPARK_HEIGHT
    if not recent:
        return (f'<svg class="spark" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
                f'aria-label="no history yet"><line x1="0" y1="{h - 1}" x2="{w}" y2="{h - 1}" stroke="#d1d5db"/></svg>')
    top = max(v for _, v, _ in recent) or 1.0

    def x(t: float) -> float:
        return round((t - start) / window * w, 1)

    def y(v: float) -> float:
        return round(h - 2 - v / top * (h - 4), 1)

    shading = []
    for i, (t, _, state) in enumerate(recent):
        if state in UNHEALTHY_STATES:
            end = recent[i + 1][0] if i + 1 < len(recent) else now
            shading.append(f'<rect x="{x(t)}" y="0" width="{max(1.0, round(x(end) - x(t), 1))}" height="{h}" '
                           f'fill="{STATE_COLOURS[state]}" fill-opacity="0.18"/>')
    line = " ".join(f"{x(t)},{y(v)}" for t, v, _ in recent)
    label = f"steps per second over the last {elapsed_text(window)}, peak {top:.1f}"
    return (f'<svg class="spark" width="{w}" height="{h}" viewBox="0 0 {w} {h}" preserveAspectRatio="none" role="img" '
            f'aria-label="{label}">'
            f'{"".join(shading)}<polyline points="{line}" fill="none" stroke="#2563eb" stroke-width="1.5"/></svg>')


def _target_row(target: TargetView, history: Sequence[Sequence[Any]], now: float) -> str:
    state = target.state
    colour = STATE_COLOURS.get(state, "#374151")
    since = target.since
    in_state = elapsed_text(now - since) if since is not None else "–"
    running, waiting = target.running, target.waiting
    load = "–" if running is None or waiting is None else f"{running:g} / {waiting:g}"
    stuck = target.stuck_seconds
    detail = target.detail
    # The workload the remediator counts restarts against: shown when it is more than the name itself.
    workload = target.workload or target.name
    owned = f' · <span class="workload">{_text(workload)}</span>' if workload != target.name else ""
    return (
        f'<tr class="target" data-target="{_text(target.name)}" data-state="{_text(state)}" data-workload="{_text(workload)}">'
        f'<td class="name"><span>{_text(target.name)}</span>'
        f'<div class="sub">{_text(target.role)} · {_text(target.url)}{owned}</div></td>'
        f'<td class="badges"><span class="state" style="background:{colour}">{_text(state)}</span>{_gpu_fault_badge(target)}'
        f'{_backstop_badge(target)}{_pace_badge(target)}</td>'
        f'<td class="reason" title="{_text(detail)}">{_text(target.reason)}<div class="sub">{_text(detail)}</div></td>'
        f'<td class="num">{in_state}</td>'
        f'<td class="num">{_text(load)}</td>'
        f'<td class="num">{_number(target.steps_per_second)}</td>'
        f'<td class="spark">{sparkline(history, now)}</td>'
        f'<td class="num">{_number(target.generation_tokens_per_second)}</td>'
        f'<td class="num">{elapsed_text(stuck) if stuck else "–"}</td>'
        f'<td class="num">{_text(target.restarts)}</td>'
        "</tr>"
    )


def _backstop_badge(target: TargetView) -> str:
    """The liveness backstop under the state, when it is not simply `act`: held (and why), or armed."""
    backstop = target.backstop
    if backstop is None or backstop.mode == "act":
        return ""
    age = backstop.word_age_seconds
    heard = f"word {elapsed_text(age)} old" if age is not None else "no word yet"
    what = "liveness held" if backstop.mode == "hold" else "backstop armed"
    return (f'<div class="backstop" data-backstop="{_text(backstop.mode)}" title="{_text(backstop.detail)}">'
            f'<strong>{what}</strong> <span class="sub">{_text(backstop.reason)} · {heard}</span></div>')


def _pace_badge(target: TargetView) -> str:
    """Its pace beside its peers under the state: `degraded` and the ratio, the ratio alone, or why it is not judged."""
    pace = target.pace
    if pace.basis == "no_signal":
        return ""
    if pace.degraded:
        return (f'<div class="degraded" data-pace="degraded" title="{_text(pace.detail)}"><strong>degraded</strong> '
                f'<span class="sub">{_number(pace.ratio)}x its {pace.peers} peers\' time per token</span></div>')
    shown = f"pace {_number(pace.ratio)}x of {pace.peers} peers" if pace.ratio is not None else \
        f"pace not judged: {pace.basis.replace('_', ' ')}"
    return f'<div class="sub" data-pace="{_text(pace.basis)}" title="{_text(pace.detail)}">{_text(shown)}</div>'


def _gpu_fault_badge(target: TargetView) -> str:
    """A `GPU fault` mark under the state, the detail (the node condition's reason first) beside it."""
    if not target.gpu_fault:
        return ""
    return (f'<div class="gpu-fault" title="{_text(target.gpu_fault_detail)}"><strong>GPU fault</strong> '
            f'<span class="sub">({_text(target.gpu_fault_source)}) {_text(target.gpu_fault_detail)}</span></div>')


def _decisions_section(decisions: Decisions | None, now: float) -> str:
    if decisions is None:
        return ('<section><h2>Remediator</h2><p class="note">No <code>remediator_url</code> in the exporter config: '
                "recent restart decisions are not shown.</p></section>")
    parts = [f'<section><h2>Remediator decisions <span class="sub">{_text(decisions.url)}</span></h2>']
    if decisions.note:
        parts.append(f'<p class="note" id="remediator-note">{_text(decisions.note)}</p>')
    pause = decisions.pause
    if pause and pause.get("paused") and isinstance(pause.get("until"), (int, float)):
        left = elapsed_text(pause["until"] - now)
        parts.append(f'<p class="note paused" id="remediator-paused"><strong>Paused</strong> for {left} more: '
                     f'{_text(pause.get("reason"))}. Nothing is restarted; DELETE /api/v1/pause resumes.</p>')
    if decisions.actions:
        parts.append('<table id="decisions"><thead><tr><th>when</th><th>target</th><th>alert</th><th>decision</th>'
                     "<th>reason</th><th>result</th><th>detail</th></tr></thead><tbody>")
        for action in decisions.actions:
            when = action.get("time")
            ago = f"{elapsed_text(now - when)} ago" if isinstance(when, (int, float)) else ""
            decision = str(action.get("decision") or "")
            parts.append(
                f'<tr class="decision {_text(decision)}"><td class="num">{ago}</td><td class="target">{_text(action.get("target"))}</td>'
                f'<td class="nowrap">{_text(action.get("alertname"))}</td><td class="nowrap">{_text(decision)}</td>'
                f'<td class="nowrap">{_text(action.get("reason"))}</td><td class="nowrap">{_text(action.get("result"))}</td>'
                f'<td class="sub detail" title="{_text(action.get("detail"))}">{_text(action.get("detail"))}</td></tr>'
            )
        parts.append("</tbody></table>")
    elif not decisions.note:
        parts.append('<p class="note">No decisions yet.</p>')
    parts.append("</section>")
    return "".join(parts)


_STYLE = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5rem;color:#111827;background:#f9fafb}
h1{font-size:1.3rem;margin:0 0 .2rem}h2{font-size:1.05rem;margin:1.5rem 0 .4rem}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0001;width:100%}
th,td{padding:.35rem .5rem;border-bottom:1px solid #e5e7eb;text-align:left;vertical-align:middle}
th{font-size:.72rem;text-transform:uppercase;letter-spacing:.03em;color:#6b7280}
td.name,td.reason .sub,td.detail,td.target,.gpu-fault,.backstop .sub{overflow-wrap:anywhere}
.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.state{color:#fff;border-radius:.6rem;padding:.1rem .55rem;font-weight:600;font-size:.85rem;white-space:nowrap}
.sub{color:#6b7280;font-size:.78rem;font-weight:normal}
td.name{min-width:12rem;max-width:22rem}
td.reason{min-width:8rem;max-width:18rem}
td.badges{max-width:14rem}
td.detail{max-width:26rem}
td.spark{padding:.2rem .3rem}
svg.spark{width:120px;height:28px;display:block}
.nowrap{white-space:nowrap}
.degraded{color:#9a3412;font-size:.8rem}
.gpu-fault{color:#991b1b;font-size:.8rem}
.note{color:#92400e;background:#fffbeb;border:1px solid #fde68a;padding:.4rem .6rem;display:inline-block;max-width:100%;
overflow-wrap:anywhere}
tr.decision.restart td:nth-child(4){color:#166534;font-weight:600}
tr.decision.refused td:nth-child(4){color:#92400e}
footer{margin-top:1rem;color:#6b7280;font-size:.78rem}
@media (max-width:1100px){body{margin:.75rem}th,td{padding:.3rem .35rem}td.name{min-width:9rem}}
"""


def render_page(
    targets: Sequence[TargetView],
    histories: Mapping[str, Sequence[Sequence[Any]]],
    decisions: Decisions | None,
    now: float,
    refresh_seconds: int = 5,
) -> str:
    """The whole page for these targets (`histories` maps a name to its points)."""
    rows = "".join(_target_row(t, histories.get(t.name, ()), now) for t in targets)
    counts: dict[str, int] = {}
    for target in targets:
        counts[target.state] = counts.get(target.state, 0) + 1
    summary = ", ".join(f"{n} {_text(s)}" for s, n in sorted(counts.items()))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now))
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="refresh" content="{int(refresh_seconds)}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>llm-vitals: {summary or 'no targets'}</title><style>{_STYLE}</style></head><body>"
        f'<h1>llm-vitals</h1><div class="sub">{len(targets)} target(s): {summary or "none"} · '
        f"refreshes every {int(refresh_seconds)} s · "
        '<a href="/api/v1/targets">/api/v1/targets</a> · <a href="/metrics">/metrics</a></div>'
        '<h2>Targets</h2><table id="targets"><thead><tr><th>target</th><th>state</th><th>reason</th>'
        "<th>in state</th><th>run / wait</th><th>steps/s</th><th>steps/s, last minutes</th>"
        "<th>tokens/s</th><th>stuck</th><th>restarts</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        f"{_decisions_section(decisions, now)}"
        f'<footer>Rendered {stamp} from the exporter\'s cache. busy is load, never a reason to restart; '
        "stuck means work pending and no engine progress.</footer></body></html>"
    )


async def fetch_decisions(session: aiohttp.ClientSession, base_url: str, token: SecretStr | None = None,
                          timeout: float = REMEDIATOR_TIMEOUT_SECONDS) -> Decisions:
    """Read the remediator's `/api/v1/actions` (with the bearer `token`: its read token); any failure
    becomes a note, never an exception."""
    url = f"{base_url.rstrip('/')}/api/v1/actions"
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token is not None else {}
    try:
        async with session.get(url, params={"limit": str(ACTIONS_LIMIT)}, headers=headers,
                               timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            if response.status == 401:
                return Decisions(note="the remediator asks for a token: set remediator_token_env or "
                                      "remediator_token_file in the exporter config to its read token "
                                      "(the remediator's auth.read_token_env)", url=base_url)
            if response.status != 200:
                return Decisions(note=f"the remediator answered HTTP {response.status}", url=base_url)
            body = await response.json(content_type=None)
    except TimeoutError:
        return Decisions(note=f"the remediator did not answer within {timeout:g} s", url=base_url)
    except (aiohttp.ClientError, ValueError) as exc:
        return Decisions(note=f"cannot read the remediator: {type(exc).__name__}", url=base_url)
    actions = body.get("actions") if isinstance(body, dict) else None
    if not isinstance(actions, list):
        return Decisions(note="the remediator's answer has no `actions` list", url=base_url)
    pause = body.get("pause")
    return Decisions(actions=[a for a in actions if isinstance(a, dict)][:ACTIONS_LIMIT], url=base_url,
                     pause=pause if isinstance(pause, dict) else None)


@dataclass
class DecisionsCache:
    """The remediator's decisions as last read; None when the exporter has no `remediator_url`."""

    latest: Decisions | None = None


DECISIONS = web.AppKey("remediator_decisions", DecisionsCache)


def refresh_seconds(poll_interval: float) -> int:
    """How often the page reloads itself, and so how often the remediator's decisions are read."""
    return max(1, min(10, round(poll_interval)))


async def _read_decisions(app: web.Application) -> AsyncIterator[None]:
    """Fill the DECISIONS cache: once before serving, then every refresh interval, until shutdown."""
    settings = app[SETTINGS]
    if settings.remediator_url is None:
        yield
        return
    url, cache = str(settings.remediator_url), app[DECISIONS]
    cache.latest = await fetch_decisions(app[SESSION], url, settings.remediator_token)

    async def loop() -> None:
        while True:
            await asyncio.sleep(refresh_seconds(settings.poll_interval))
            try:
                cache.latest = await fetch_decisions(app[SESSION], url, settings.remediator_token)
            except Exception as exc:  # a bug here: logged, shown, and the next read tries again
                log.exception("reading the remediator's decisions failed unexpectedly")
                cache.latest = Decisions(note=f"cannot read the remediator: {type(exc).__name__}", url=url)

    task = asyncio.create_task(loop(), name="remediator-decisions")
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def setup_status_page(app: web.Application) -> None:
    """Register `GET /` (the status page) on an exporter app made by `exporter.app.create_app`."""
    if any(r.method == "GET" and r.resource is not None and r.resource.canonical == "/" for r in app.router.routes()):
        return  # already set up (create_app does it); a second call must not fail
    app[DECISIONS] = DecisionsCache()
    app.cleanup_ctx.append(_read_decisions)  # after the client session's: it reads through that session

    async def status_page(request: web.Request) -> web.Response:
        app_ = request.app
        settings = app_[SETTINGS]
        decisions = app_[DECISIONS].latest
        now = app_[CLOCK].now()
        store = app_[STORE]
        records = list(store)
        targets = [target_view(record, now.mono, now.wall) for record in records]
        histories = {record.name: list(record.history) for record in records}  # kept in wall time
        refresh = refresh_seconds(settings.poll_interval)
        html = render_page(targets, histories, decisions, now.wall, refresh_seconds=refresh)
        return web.Response(text=html, content_type="text/html", charset="utf-8",
                            headers={"Cache-Control": "no-store"})

    app.router.add_get("/", status_page)
