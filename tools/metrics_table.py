"""Print the metrics reference (docs/metrics.md): one markdown row per metric the exporter's collector
emits, then one per metric of the remediator.

The names, types, labels and HELP texts come from the exposition's own table,
`llm_vitals.exporter.collector.FAMILIES`, and from `LifecycleCollector` and `LoopLagCollector` (run
on a one-target store, no polling, no network), and from the remediator's tables
(`llm_vitals.remediator.metrics.EVENTS` and `FAMILIES`), so docs/metrics.md cannot drift from the code:

    .venv/bin/python tools/metrics_table.py            # print the table
    .venv/bin/python tools/metrics_table.py --write    # replace it in docs/metrics.md, between the markers

`tests/test_readme_metrics.py` fails while docs/metrics.md's table differs from this output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "docs" / "metrics.md"
START = "<!-- metrics-table:start -->"
END = "<!-- metrics-table:end -->"
REMEDIATOR_START = "<!-- remediator-metrics-table:start -->"
REMEDIATOR_END = "<!-- remediator-metrics-table:end -->"

sys.path.insert(0, str(REPO))  # run from a checkout without installing, too

from llm_vitals.exporter.collector import (  # noqa: E402 -- after the sys.path line above
    FAMILIES,
    TARGETS_HELP,
    TARGETS_NAME,
    LifecycleCollector,
    LoopLagCollector,
)
from llm_vitals.exporter.discovery.manager import Discovery, apply_to_store  # noqa: E402
from llm_vitals.exporter.loop_lag import LoopLag  # noqa: E402
from llm_vitals.exporter.reload import ReloadState  # noqa: E402
from llm_vitals.exporter.settings import parse_settings  # noqa: E402
from llm_vitals.exporter.state import StateStore  # noqa: E402
from llm_vitals.remediator import metrics as remediator_metrics  # noqa: E402


def _cell(text: str) -> str:
    # `<target>` would be read as an HTML tag by a markdown renderer.
    text = " ".join(text.split()).replace("|", "\\|")
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def metrics_table() -> str:
    """The markdown table (header included, no trailing newline)."""
    settings = parse_settings({"targets": [{"name": "t", "url": "http://127.0.0.1:9"}]})
    store = StateStore(settings, 0.0)
    lifecycle = LifecycleCollector(Discovery(settings, store, apply_to_store(store, lambda: 0.0), lambda: 0.0),
                                   ReloadState(None))
    rows = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for each in FAMILIES:  # their names as exposed: a counter's ends in _total already
        labels = ", ".join(f"`{label}`" for label in each.labels)
        rows.append(f"| `{each.name}` | {each.kind} | {labels} | {_cell(each.help)} |")
    rows.append(f"| `{TARGETS_NAME}` | gauge | – | {_cell(TARGETS_HELP)} |")
    for family in [*lifecycle.collect(), *LoopLagCollector(LoopLag()).collect()]:
        name = family.name + ("_total" if family.type == "counter" else "")
        # The label names a family was declared with (also when it has no sample for this store).
        labels = getattr(family, "_labelnames", None) or sorted({k for s in family.samples for k in s.labels})
        label_text = ", ".join(f"`{label}`" for label in labels) or "–"
        rows.append(f"| `{name}` | {family.type} | {label_text} | {_cell(family.documentation)} |")
    return "\n".join(rows)


def remediator_table() -> str:
    """The remediator's metrics as a markdown table: its events, then what a scrape reads of its state."""
    rows = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for each in [*remediator_metrics.EVENTS, *remediator_metrics.FAMILIES]:
        labels = ", ".join(f"`{label}`" for label in each.labels) or "–"
        rows.append(f"| `{each.name}` | {each.kind} | {labels} | {_cell(each.help)} |")
    return "\n".join(rows)


def readme_table(text: str, start: str = START, end: str = END) -> str:
    """The table currently between the markers in the reference text."""
    if start not in text or end not in text:
        raise ValueError(f"docs/metrics.md has no {start} ... {end} block")
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def replace_table(text: str, table: str, start: str = START, end: str = END) -> str:
    before, rest = text.split(start, 1)
    after = rest.split(end, 1)[1]
    return f"{before}{start}\n{table}\n{end}{after}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update docs/metrics.md between the marker comments")
    args = parser.parse_args(argv)
    table, remediator = metrics_table(), remediator_table()
    if args.write:
        text = replace_table(REFERENCE.read_text(), table)
        REFERENCE.write_text(replace_table(text, remediator, REMEDIATOR_START, REMEDIATOR_END))
        print(f"updated {REFERENCE}")
    else:
        print(f"{table}\n\n{remediator}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
