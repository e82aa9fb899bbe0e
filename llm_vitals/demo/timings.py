"""How fast the story runs: the normal pace for people, a compressed one for the test."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timings:
    """Every duration the demo's processes and story use, in seconds."""

    poll_interval: float  # exporter
    stuck_after: float  # exporter: no progress with work pending for this long = stuck
    cooldown: float  # remediator: global cooldown between restarts
    startup_seconds: float  # simulator: loading period after a restart
    rule_for: float  # Prometheus `for:` on the alert rules (or the relay's equivalent)
    repeat_interval: float  # Alertmanager re-sends a still-firing alert this often
    batch_seconds: float  # how long the batch job keeps backend 1 saturated
    hold_seconds: float  # how long the fleet-wide hang is left alone after the fleet gate refused
    step_timeout: float  # a step that has not reached its outcome by then is reported as failed

    @property
    def scrape_interval(self) -> float:
        return min(1.0, self.poll_interval)


NORMAL = Timings(poll_interval=1.0, stuck_after=8.0, cooldown=20.0, startup_seconds=3.0, rule_for=2.0,
                 repeat_interval=5.0, batch_seconds=20.0, hold_seconds=8.0, step_timeout=90.0)
# For tests (`--fast`): the same story in about a minute. stuck_after stays a few polls long so that
# "stuck" still means several reads without progress.
FAST = Timings(poll_interval=0.5, stuck_after=3.0, cooldown=8.0, startup_seconds=1.0, rule_for=1.5,
               repeat_interval=2.0, batch_seconds=5.0, hold_seconds=3.0, step_timeout=60.0)
