"""docs/metrics.md, the metrics reference, is the collector's own list: regenerate it, and it must not change."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import metrics_table


def test_readme_metrics_table_matches_the_collector() -> None:
    readme = (REPO / "docs" / "metrics.md").read_text()
    assert metrics_table.readme_table(readme) == metrics_table.metrics_table(), (
        "docs/metrics.md's metrics table is out of date: run `.venv/bin/python tools/metrics_table.py --write`"
    )


def test_every_metric_the_collector_emits_has_a_row_with_help() -> None:
    from whole_page import VitalsCollector

    from llm_vitals.exporter.settings import parse_settings
    from llm_vitals.exporter.state import StateStore

    # What prometheus-client makes of FAMILIES (as a scrape would), not the table the script reads.
    settings = parse_settings({"targets": [{"name": "t", "url": "http://127.0.0.1:9"}]})
    families = list(VitalsCollector(StateStore(settings, 0.0), clock=lambda: 0.0).collect())
    table = metrics_table.readme_table((REPO / "docs" / "metrics.md").read_text())
    for family in families:
        assert family.documentation.strip(), f"{family.name} has no HELP text"
        assert f"`{family.name}" in table


def test_the_script_prints_the_table() -> None:
    run = subprocess.run([sys.executable, str(REPO / "tools" / "metrics_table.py")], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == metrics_table.metrics_table()
