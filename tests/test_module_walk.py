"""tools/module_walk.py (issue 42): one real alert and one real poll, traced, print the modules each enters."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO


def walk(path: str, *flags: str) -> str:
    done = subprocess.run([sys.executable, str(REPO / "tools" / "module_walk.py"), path, *flags],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def counts(printed: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^    (\S+): (\d+) \(\d+\)$", printed, re.M)}


def test_the_alert_walks_from_the_service_to_the_journal_and_the_restart():
    printed = walk("alert")
    assert printed.startswith("alert: ")
    sequence = printed.splitlines()[1]
    assert sequence.lstrip().startswith("*remediator.service -> remediator.loop")  # the webhook's call
    seen = counts(printed)
    assert {"remediator.loop", "remediator.gate", "remediator.journal", "remediator.acting"} <= set(seen)
    # The summary line agrees with the table.
    head = re.match(r"alert: (\d+) entries into (\d+) modules, (\d+) returns", printed)
    assert head is not None
    assert (int(head[1]), int(head[2]), int(head[3])) == (sum(seen.values()), len(seen), sum(seen.values()) - len(seen))


def test_the_poll_walks_from_the_poller_through_the_verdict_by_package():
    printed = walk("poll", "--packages")
    assert printed.startswith("poll (by package): ")
    seen = counts(printed)
    assert seen["exporter.poller"] == 1 and "exporter.verdict" in seen
    assert not any(name.count(".") > 1 for name in seen)  # exporter.verdict.plan counted as exporter.verdict
