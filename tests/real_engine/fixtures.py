"""The fixtures and hooks every real-engine tier's conftest imports; the conftest adds only its `engine` fixture.

One server and one exporter serve a tier's whole module (starting an engine costs up to minutes on
a loaded box); the drills run in file order, so the kill and restart drills come last. The server is
started only when its built parts are there: otherwise every drill skips with the tier's one line,
a failure under LLM_VITALS_REQUIRE_REAL_<TIER>=1 (CI).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from .engine import Engine, Kit
from .harness import ExporterProcess, Watcher
from .launcher import ServerProcess
from .report import Drill, Report, starts_line, table

# The session's reports, for the summary at the end (one list whichever tiers ran).
REPORTS = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def report(engine: Engine, request: pytest.FixtureRequest) -> Iterator[Report]:
    """The tier's report, rewritten after every drill and at the end."""
    # `timeout` (tools/real-tier-lib.sh) or CI ends a run with SIGTERM: made a KeyboardInterrupt,
    # the teardown below still stops the engine (in a session of its own, it would not get the signal).
    engine.tier.stop_on_sigterm()
    report = Report(path=engine.run_dir / "report.json", engine=engine.key, name=engine.name, logs=engine.log_dir)
    report.exporter = engine.exporter.facts()
    report.server = {**engine.facts(), "starts": []}
    request.config.stash.setdefault(REPORTS, []).append(report)
    yield report
    report.write()


@pytest.fixture(scope="module")
def server(engine: Engine, report: Report) -> Iterator[ServerProcess]:
    """The real engine on free loopback ports, stopped (with every process it spawned) by PID at the end."""
    missing = engine.setup_missing()
    if missing:
        engine.tier.skip_or_fail(missing)
    srv = engine.launcher()
    try:
        try:
            engine.start(srv)
        except engine.fatal_start_errors as exc:
            # One clear line and the end of the run, not a timeout per drill that hides the cause.
            pytest.exit(f"real-{engine.name} start: {exc}", returncode=1)
        yield srv
    finally:
        srv.stop()
        report.server["starts"] = srv.starts
        report.server["leftover_pids_after_stop"] = [p.pid for p in srv.leftovers()]
        report.write()


@pytest.fixture(scope="module")
def exporter(engine: Engine, server: ServerProcess) -> Iterator[ExporterProcess]:
    """The real exporter polling the engine as the engine's settings say, stopped by PID at the end."""
    proc = ExporterProcess(engine.exporter, server.url, engine.log_dir, target_keys=engine.target_keys(server))
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def watcher(exporter: ExporterProcess) -> Iterator[Watcher]:
    with Watcher(exporter) as w:
        yield w


@pytest.fixture
def kit(engine: Engine, server: ServerProcess, exporter: ExporterProcess, watcher: Watcher) -> Kit:
    return Kit(engine, server, exporter, watcher)


@pytest.fixture
def drill(request: pytest.FixtureRequest, engine: Engine, report: Report) -> Iterator[Drill]:
    """This test's record in the report, filed under the first of the engine's drill names its name starts with.

    Its outcome and duration are filled in after the test, with how well the watcher kept up.
    """
    test = request.node.name.removeprefix("test_")
    record = report.drill(next((d for d in engine.drills if test.startswith(d)), test))
    began = time.monotonic()
    yield record
    record.seconds = round(time.monotonic() - began, 1)
    if "watcher" in request.fixturenames:
        record.facts.update(request.getfixturevalue("watcher").health(record.started))
    rep = getattr(request.node, "rep_call", None)  # set by keep_call_report
    record.outcome = rep.outcome if rep is not None else "error"
    report.write()


@pytest.hookimpl(hookwrapper=True)
def keep_call_report(item, call):
    """A pytest_runtest_makereport hook (a tier's conftest imports it under that name): it keeps the
    test's call-phase report on the item, where the `drill` fixture reads the outcome."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep


def summarize(terminalreporter) -> None:
    """A pytest_terminal_summary hook: each tier's starts and its table, once (every tier's conftest imports it)."""
    reports = terminalreporter.config.stash.get(REPORTS, [])
    while reports:
        report = reports.pop(0)
        if not report.drills:
            continue
        data = report.as_dict()
        terminalreporter.section(f"real-{report.name} drills")
        for line in (starts_line(data), *table(data)):
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"report: {report.path}; logs: {report.logs}")
