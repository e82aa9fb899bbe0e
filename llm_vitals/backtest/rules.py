"""The alert rules the backtest replays: which exporter state each fires on, its `for:`, and whether it restarts.

Read from the shipped rules file (alerts/llm-vitals.rules.yml, in the package as
llm_vitals/backtest/llm-vitals.rules.yml, a link to it) or the operator's own (`--rules`), so a
`for:` changed there is the `for:` replayed. Only the rules on `llm_vitals_state{state="..."}`
concern one target's verdict; the others (the exporter's or the remediator's own health) are left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from llm_vitals.durations import parse_duration

SHIPPED = "llm-vitals.rules.yml"
_STATE = re.compile(r'llm_vitals_state\{state="([a-z_]+)"\}\s*==\s*1')
# LLMServerUnresponsiveLoadUnknown: only for a target whose load cannot be read (`engine: openai`),
# which has no counters in Prometheus to replay.
_LOAD_UNKNOWN_ONLY = re.compile(r"\band on\b.*llm_vitals_unresponsive_restart_allowed\s*==\s*0", re.S)
# LLMServerUnjudgedCanaryFailing: idle *and* its canaries failing; the canary's results are not in the
# engine's history (replay.py), so a rule that needs them cannot be replayed (it would fire on every idle).
_NEEDS_CANARY = re.compile(r"\band on\b.*llm_vitals_canary_requests_total", re.S)


class RulesError(ValueError):
    """A rules file that cannot be read as Prometheus alert rules."""


@dataclass(frozen=True, slots=True)
class AlertRule:
    """One alert on one target's state."""

    name: str
    state: str
    for_seconds: float
    restart: bool  # labels remediation="restart": the remediator acts on it
    needs_waiting: bool = False  # LLMServerSaturated: also llm_vitals_requests_waiting > 0
    severity: str = ""  # critical, warning, info: --incidents counts critical and warning as alarms


def shipped_rules_text() -> str:
    """The rules file that ships with the package."""
    return resources.files("llm_vitals.backtest").joinpath(SHIPPED).read_text(encoding="utf-8")


def load_rules(path: Path | None = None) -> tuple[AlertRule, ...]:
    """The target-state rules of `path`, or of the shipped file; RulesError when they cannot be read."""
    try:
        text = path.read_text(encoding="utf-8") if path is not None else shipped_rules_text()
    except OSError as exc:
        raise RulesError(f"cannot read the rules file {path}: {exc}") from None
    return parse_rules(text, str(path) if path is not None else SHIPPED)


def parse_rules(text: str, source: str = SHIPPED) -> tuple[AlertRule, ...]:
    """The alert rules on `llm_vitals_state{state="..."}` in a rules file's text."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RulesError(f"{source}: not YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("groups"), list):
        raise RulesError(f"{source}: no `groups:` list (not a Prometheus rules file)")
    found: list[AlertRule] = []
    for group in data["groups"]:
        for rule in (group or {}).get("rules") or []:
            if not isinstance(rule, dict) or "alert" not in rule:
                continue
            expr = str(rule.get("expr", ""))
            match = _STATE.search(expr)
            if match is None or _LOAD_UNKNOWN_ONLY.search(expr) or _NEEDS_CANARY.search(expr):
                continue
            try:
                for_seconds = parse_duration(rule.get("for", 0) or 0)
            except ValueError as exc:
                raise RulesError(f"{source}: alert {rule['alert']}: bad `for:` ({exc})") from None
            labels = rule.get("labels") or {}
            found.append(AlertRule(
                name=str(rule["alert"]), state=match.group(1), for_seconds=for_seconds,
                restart=labels.get("remediation") == "restart",
                needs_waiting="llm_vitals_requests_waiting > 0" in expr,
                severity=str(labels.get("severity", "")),
            ))
    if not found:
        raise RulesError(f'{source}: no alert rule on llm_vitals_state{{state="..."}}')
    return tuple(found)
