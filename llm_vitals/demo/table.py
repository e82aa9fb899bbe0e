"""The terminal view: a table of the fleet redrawn in place, the story line, and recent events."""

from __future__ import annotations

import shutil
import time
from typing import Any

from llm_vitals.demo.story import Observer, Status

COLUMNS = ("target", "engine", "state", "run/wait", "steps/s", "tok/s", "stuck s", "restarts", "last decision")
WIDTHS = (11, 9, 12, 9, 8, 8, 8, 8, 0)
STATE_COLOURS = {"idle": "2", "busy": "34", "stuck": "1;31", "unresponsive": "1;33", "down": "31", "starting": "33",
                 "asleep": "35", "waiting_on_peer": "36", "paused": "35"}


def _cell(text: str, width: int) -> str:
    return text if width == 0 else text[:width].ljust(width)


def _decision(action: dict[str, Any] | None, now: float) -> str:
    if action is None:
        return ""
    ago = f"{now - action['time']:.0f}s ago"
    if action["decision"] == "restart":
        return f"restart {action.get('result') or 'pending'} ({ago})"
    return f"{action['decision']} {action['reason']} ({ago})"


def rows(observer: Observer, now: float) -> list[list[str]]:
    out = []
    for name, t in observer.targets.items():
        running, waiting = t.get("running"), t.get("waiting")
        stuck = t.get("stuck_seconds") or 0.0
        out.append([
            name, t.get("engine", "?"), t.get("state", "?"),
            "–" if running is None or waiting is None else f"{running:g}/{waiting:g}",
            f"{t.get('steps_per_second') or 0:.1f}", f"{t.get('generation_tokens_per_second') or 0:.1f}",
            f"{stuck:.1f}" if stuck else "–", str(t.get("restarts", 0)),
            _decision(observer.last_decision(name), now),
        ])
    return out


def render(observer: Observer, status: Status, header: list[str], colour: bool = True) -> list[str]:
    """The whole screen as lines (no trailing newlines)."""
    now = time.time()
    lines = list(header)
    lines.append("")
    lines.append("  ".join(_cell(c, w) for c, w in zip(COLUMNS, WIDTHS, strict=True)))
    for row in rows(observer, now):
        cells = [_cell(c, w) for c, w in zip(row, WIDTHS, strict=True)]
        if colour and row[2] in STATE_COLOURS:
            cells[2] = f"\x1b[{STATE_COLOURS[row[2]]}m{cells[2]}\x1b[0m"
        lines.append("  ".join(cells))
    if not observer.targets:
        lines.append("(waiting for the exporter)")
    lines.append("")
    lines.append(f"loop {status.loop}, {status.step}" if status.loop else status.step)
    lines.append(f"  {status.detail}")
    lines.append("")
    lines.append("recent events:")
    for at, text in status.events:
        lines.append(f"  {time.strftime('%H:%M:%S', time.localtime(at))}  {text}")
    return lines


def clip(line: str, width: int) -> str:
    """Cut a line to `width` visible characters (ANSI escapes do not count), so nothing wraps."""
    out, visible, i = [], 0, 0
    while i < len(line):
        if line[i] == "\x1b":
            end = line.find("m", i)
            end = len(line) - 1 if end < 0 else end
            out.append(line[i:end + 1])
            i = end + 1
            continue
        if visible >= width:
            break
        out.append(line[i])
        visible += 1
        i += 1
    return "".join(out) + ("\x1b[0m" if "\x1b[" in line else "")


class Screen:
    """Redraws the same block of lines in place with ANSI cursor movement."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.drawn = 0

    def draw(self, lines: list[str]) -> None:
        out = []
        if self.drawn:
            out.append(f"\x1b[{self.drawn}F")  # to the start of the block drawn last time
        out.append("\x1b[J")  # clear from there to the end of the screen
        width = max(20, shutil.get_terminal_size((120, 40)).columns - 1)
        out.append("\n".join(clip(line, width) + "\x1b[K" for line in lines) + "\n")
        self.stream.write("".join(out))
        self.stream.flush()
        self.drawn = len(lines)
