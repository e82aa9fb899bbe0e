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


def reports(printed: str) -> dict[str, tuple[tuple[int, int, int], dict[str, int], str]]:
    """Each path's report: (entries, modules, returns) as its summary line says, its table, and its sequence."""
    out = {}
    for block in re.split(r"^(?=\S)", printed, flags=re.M):
        head = re.match(r"(.+?): (\d+) entries into (\d+) modules, (\d+) returns", block)
        if head is not None and block.count("\n") > 1:
            out[head[1]] = ((int(head[2]), int(head[3]), int(head[4])), counts(block), block.splitlines()[1].strip())
    return out


def test_the_alert_walks_from_the_service_to_its_answer_then_the_restart_in_its_task():
    printed = walk("alert")
    paths = reports(printed)
    assert list(paths) == ["alert", "restart"]
    for (entries, modules, returns), seen, _ in paths.values():  # each summary line agrees with its table
        assert (entries, modules, returns) == (sum(seen.values()), len(seen), sum(seen.values()) - len(seen))
    (_, _, returns), seen, sequence = paths["alert"]
    assert sequence.startswith("*remediator.service -> remediator.loop -> remediator.gate")  # the webhook's call, the look
    assert {"remediator.ledger", "remediator.store.sqlite", "remediator.journal", "remediator.acting"} <= set(seen)
    # The gate's look and its decision in the transaction are one frame (gate.on_alert): entered once.
    assert returns == 0 and seen["remediator.gate"] == 1
    (_, _, returns), seen, sequence = paths["restart"]
    assert sequence.startswith("*remediator.acting -> ")  # a task of its own, started by the answer's carry_out
    assert returns == 0 and {"remediator.ledger", "remediator.journal"} <= set(seen)


def test_the_poll_enters_each_module_once():
    paths = reports(walk("poll"))
    (_, _, returns), _, sequence = paths["poll"]
    assert sequence.startswith("*exporter.poller -> ") and returns == 0


def test_the_poll_walks_from_the_poller_through_the_verdict_by_package():
    printed = walk("poll", "--packages")
    assert printed.startswith("poll (by package): ")
    seen = counts(printed)
    assert seen["exporter.poller"] == 1 and "exporter.verdict" in seen
    assert not any(name.count(".") > 1 for name in seen)  # exporter.verdict.plan counted as exporter.verdict
