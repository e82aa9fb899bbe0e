"""The /metrics page rendered whole, from scratch, as the exporter did before each target's lines
were kept (llm_vitals/exporter/page.py): the reference the joined page is tested against
(tests/test_page_cache.py), and the baseline of bench/bench_scale.py's in-process comparison.

`VitalsCollector` gives the same FAMILIES as prometheus-client objects: prometheus-client's output
for it is the reference `render_families` is tested against byte for byte
(tests/test_exporter_exposition.py). Neither ships: the exporter serves only the joined page.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llm_vitals.exporter.collector import (
    FAMILIES,
    TARGETS_HELP,
    TARGETS_NAME,
    Reading,
    escape_label,
    format_value,
    help_line,
    labels_around_target,
    read,
)
from llm_vitals.exporter.state import StateStore


def render_families(readings: Iterable[Reading], now: float) -> Iterator[str]:
    """The text (format 0.0.4) of each family of FAMILIES for every target, one family at a time,
    then the target count.

    Byte for byte what prometheus-client writes for VitalsCollector (tests/test_exporter_exposition.py
    checks it), at a fraction of the cost: label text is built once per scrape, not per sample.
    """
    readings = list(readings)
    targets = [(reading, f'target="{escape_label(reading.name)}"') for reading in readings]
    for family in FAMILIES:
        out = [help_line(family.name, family.kind, family.help)]
        name, rows = family.name, family.rows
        if not family.more_labels:
            for reading, target in targets:
                for _, value in rows(reading, now):
                    out.append(f"{name}{{{target}}} {format_value(value)}\n")
        else:
            around: dict[tuple[str, ...], tuple[str, str]] = {}  # this scrape's lookups, cheaper than the cache's
            for reading, target in targets:
                for more, value in rows(reading, now):
                    parts = around.get(more)
                    if parts is None:
                        parts = around[more] = labels_around_target(family.labels, more)
                    out.append(f"{name}{{{parts[0]}{target}{parts[1]}}} {format_value(value)}\n")
        yield "".join(out)
    yield help_line(TARGETS_NAME, "gauge", TARGETS_HELP) + f"{TARGETS_NAME} {format_value(len(readings))}\n"


def render_vitals(store: StateStore, now: float) -> str:
    """The whole page at once (see render_families)."""
    return "".join(render_families([read(record, now) for record in store], now))


class VitalsCollector(Collector):
    """FAMILIES as prometheus-client metric families: the samples `collector.target_texts` writes (its
    docstring has an example), built by the client library, to hold the exporter's own text to it."""

    def __init__(self, store: StateStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        readings = [read(record, now) for record in self.store]
        for family in FAMILIES:
            kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            metric = kind(family.name, family.help, labels=list(family.labels))
            for reading in readings:
                for more, value in family.rows(reading, now):
                    metric.add_metric([reading.name, *more], value)
            yield metric
        targets = GaugeMetricFamily(TARGETS_NAME, TARGETS_HELP)
        targets.add_metric([], len(self.store.records))
        yield targets
