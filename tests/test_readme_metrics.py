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


def test_the_remediators_table_matches_its_metrics() -> None:
    readme = (REPO / "docs" / "metrics.md").read_text()
    table = metrics_table.readme_table(readme, metrics_table.REMEDIATOR_START, metrics_table.REMEDIATOR_END)
    assert table == metrics_table.remediator_table(), (
        "docs/metrics.md's remediator table is out of date: run `.venv/bin/python tools/metrics_table.py --write`"
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
    assert run.stdout.strip() == f"{metrics_table.metrics_table()}\n\n{metrics_table.remediator_table()}"


def test_every_metric_the_remediator_serves_is_a_row_of_its_table_and_every_one_read_is_served() -> None:
    import re
    from types import SimpleNamespace

    from llm_vitals.remediator.gate import JournalState
    from llm_vitals.remediator.metrics import EVENTS, FAMILIES, RemediatorMetrics
    from llm_vitals.remediator.store import StoreHealth

    journal = SimpleNamespace(last_restart_by_target={"a": 1.0})
    state = JournalState(open_circuits=frozenset({"a"}), gpu_nodes=frozenset({"n"}), pages={"a": 1.0})
    metrics = RemediatorMetrics(["a"], journal, lambda: state, lambda: 2.0, StoreHealth)
    served = {family.name for family in metrics.registry.collect()}  # a counter's without _total
    declared = {each.name.removesuffix("_total"): each for each in [*EVENTS, *FAMILIES]}
    assert served == set(declared)
    # What the alert rules, the dashboards and the docs read of the remediator is served, under that name.
    read = set()
    for path in [*(REPO / "alerts").glob("*.yml"), *(REPO / "dashboards").glob("*.json"), REPO / "docs" / "interfaces.md",
                 REPO / "docs" / "remediator.md", REPO / "docs" / "runbook.md"]:
        if path.exists():
            read |= set(re.findall(r"llm_vitals_remediator_[a-z_]+", path.read_text()))
    names = {each.name for each in [*EVENTS, *FAMILIES]}
    suffixed = {n + s for n in names for s in ("", "_bucket", "_count", "_sum")}
    assert read and read <= suffixed, sorted(read - suffixed)
