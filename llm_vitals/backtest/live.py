"""`--compare-live`: the replay against the exporter's own `llm_vitals_state`, where the same Prometheus scraped it.

The proof that the replay is the live rule: for each target the exporter watched, every scrape of
its `llm_vitals_state{target=...,state=...} == 1` is compared with the replay's state as of that
time (its latest read at or before it). Reported per target: the share of those scrapes where the
two agree, and every disagreement longer than two of the exporter's scrapes (a shorter one is the
two reading the same change at different moments: the exporter polls on its own clock, the replay
reads Prometheus's scrapes of the engine).

A live target is matched to a replayed one by name (the exporter's `target` label is its config's
`name`; the backtest's targets are `instance`s), else by the host:port of the url in its
`llm_vitals_target_info`. The replay cannot see the canary, so a live `unresponsive` (an idle-looking
server whose canary failed) is a disagreement the report names.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from llm_vitals.backtest.history import Series, scrape_interval

LIVE_STATE = "llm_vitals_state"
TARGET_INFO = "llm_vitals_target_info"
LONGER_THAN_SCRAPES = 2


@dataclass(frozen=True, slots=True)
class Disagreement:
    """A run of consecutive exporter scrapes where the live state and the replay's differ."""

    start: float
    end: float  # the last disagreeing scrape
    scrapes: int
    live: str
    replay: str  # the replay's states over the run, joined by "/" when it changed within it


@dataclass
class Agreement:
    """One target: how many of the exporter's scrapes agreed with the replay, and the long disagreements."""

    target: str
    live_target: str
    compared: int = 0
    agreed: int = 0
    interval: float | None = None  # the exporter's scrape interval
    disagreements: list[Disagreement] = field(default_factory=list)

    @property
    def percent(self) -> float | None:
        return 100.0 * self.agreed / self.compared if self.compared else None


def live_timelines(series: Iterable[Series]) -> dict[str, list[tuple[float, str]]]:
    """Per live target (its `target` label), the (time, state) of each scrape, from `llm_vitals_state` samples at 1.

    Several exporters (a replicated pair) may export one target: the first by `instance` is kept.
    """
    chosen: dict[str, str] = {}
    found: dict[str, list[tuple[float, str]]] = {}
    for one in sorted(series, key=lambda s: s.labels.get("instance", "")):
        target, state, exporter = one.labels.get("target"), one.labels.get("state"), one.labels.get("instance", "")
        if not target or not state or chosen.setdefault(target, exporter) != exporter:
            continue
        found.setdefault(target, []).extend((at, state) for at, value in zip(one.times, one.values, strict=True)
                                            if value == 1)
    for timeline in found.values():
        timeline.sort()
    return found


def match_targets(live: Iterable[str], replayed: Iterable[str], urls: Mapping[str, str]) -> dict[str, str]:
    """Replayed target -> live target: by name, else by the host:port of the live target's url."""
    names = set(replayed)
    matched: dict[str, str] = {}
    for target in live:
        if target in names:
            matched[target] = target
            continue
        url = urls.get(target)
        address = urlsplit(url).netloc if url else ""
        if address in names and address not in matched:
            matched[address] = target
    return matched


def compare(target: str, live_target: str, timeline: Sequence[tuple[float, str]],
            replay_state_at: Callable[[float], str | None], window: tuple[float, float]) -> Agreement:
    """The exporter's scrapes of one target within the window against the replay's state at each."""
    result = Agreement(target, live_target)
    inside = [(at, state) for at, state in timeline if window[0] <= at <= window[1]]
    result.interval = scrape_interval([at for at, _ in inside])
    run: list[tuple[float, str, str]] = []

    def close() -> None:
        if len(run) > LONGER_THAN_SCRAPES:
            replays = "/".join(state for state, _ in itertools.groupby(r for _, _, r in run))
            lives = "/".join(state for state, _ in itertools.groupby(lv for _, lv, _ in run))
            result.disagreements.append(Disagreement(run[0][0], run[-1][0], len(run), lives, replays))
        run.clear()

    for at, state in inside:
        replayed = replay_state_at(at)
        if replayed is None:
            continue  # before the replay's first read of it
        result.compared += 1
        if replayed == state:
            result.agreed += 1
            close()
        else:
            run.append((at, state, replayed))
    close()
    return result


def target_urls(label_sets: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """Live target -> its url, from `llm_vitals_target_info`'s label sets."""
    return {labels["target"]: labels["url"] for labels in label_sets if labels.get("target") and labels.get("url")}
