"""Prometheus's `for:` and Alertmanager's repeat, for one target's restartable alert, as one pure step.

The demo's relay (no Prometheus on the machine) and the incident replay (virtual time) both turn the
exporter's state into the webhooks Alertmanager would send; this is the one place that says how.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The restartable alerts of alerts/llm-vitals.rules.yml, by the exporter state they fire on.
ALERT_FOR_STATE = {"stuck": "LLMServerStuck", "unresponsive": "LLMServerUnresponsive"}


@dataclass(frozen=True)
class RuleState:
    """One target's alert between two evaluations: pending since `active_at`, firing once `firing`."""

    alertname: str | None = None
    active_at: float | None = None
    firing: bool = False
    last_sent: float | None = None  # the last firing notification


@dataclass(frozen=True)
class Notification:
    status: Literal["firing", "resolved"]
    alertname: str
    starts_at: float  # the alert's ActiveAt: when its expression first held


def evaluate(previous: RuleState, state: str | None, now: float, rule_for: float,
             repeat_interval: float) -> tuple[RuleState, list[Notification]]:
    """One evaluation of the rules on the target's `state`: the next RuleState and what is sent.

    Pending from the first evaluation that sees the state, firing at the first one `rule_for`
    later; a firing alert is re-sent every `repeat_interval` and resolved once its state is gone.
    """
    alertname = ALERT_FOR_STATE.get(state or "")
    sent: list[Notification] = []
    current = previous
    if current.alertname is not None and current.alertname != alertname:
        if current.firing and current.active_at is not None:
            sent.append(Notification("resolved", current.alertname, current.active_at))
        current = RuleState()
    if alertname is None:
        return current, sent
    if current.alertname is None:
        return RuleState(alertname, active_at=now), sent  # pending
    assert current.active_at is not None
    firing = current.firing or now - current.active_at >= rule_for
    if not firing:
        return current, sent
    if current.last_sent is None or now - current.last_sent >= repeat_interval:
        sent.append(Notification("firing", alertname, current.active_at))
        return RuleState(alertname, current.active_at, True, now), sent
    return RuleState(alertname, current.active_at, True, current.last_sent), sent
