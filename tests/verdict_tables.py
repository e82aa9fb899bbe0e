"""What the pure verdict's table tests share: the clock they start at, one row of a table (`Case`),
and the replay of a row's reads through the verdict (`replay`), so that each table file holds only
its cases and the defaults of the target it judges."""

from __future__ import annotations

from dataclasses import dataclass, field

from llm_vitals.exporter.engines import EngineFacts
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import CanaryOutcome, Verdict, judge, record_canary

T0 = 1_796_000_000.0


def replay(rows: list[tuple[float, object]], settings: TargetSettings, facts: EngineFacts | None = None) -> list[Verdict]:
    """Feed each observation (or canary outcome) at T0 + its offset, in order; every verdict."""
    verdict: Verdict | None = None
    verdicts: list[Verdict] = []
    for offset, seen in rows:
        if isinstance(seen, CanaryOutcome):
            verdict = record_canary(verdict, seen, T0 + offset, settings)
        else:
            verdict = judge(verdict, seen, T0 + offset, settings, facts)
        verdicts.append(verdict)
    return verdicts


@dataclass
class Case:
    """One row: reads at their offsets, the state and reason the verdict must end in, and what else it must show."""

    id: str
    rows: list[tuple[float, object]]
    state: str
    reason: str
    restarts: int = 0
    facts: EngineFacts = field(default_factory=EngineFacts)
    settings: dict[str, object] = field(default_factory=dict)
    checks: dict[str, object] = field(default_factory=dict)  # a Verdict attribute (or started/up) -> its value
    ready: bool | None = None  # what /ready answers at the last read; None: not checked
