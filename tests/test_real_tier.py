"""The six real-part tiers' shared plumbing (tests/real_tier.py, and the engine tiers' kit in tests/real_engine/),
checked without any real part.

Each tier's real tests run under pytest in a subprocess with its caches pointed at an empty
directory, so no venv, model, binary or daemon is found and nothing is started: without the
switches nothing of the tiers but their tools' quick tests is collected; switched on, every real
test skips with the tier's one line; required as well (CI), every one of them fails instead.
A made-up engine tier in a temporary directory drives the kit's drill records, its summary and the
SIGTERM teardown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"


# directory under tests/, the tier's name in its messages, its switches' suffix, what `make test` collects of it
TIERS = [
    ("real_vllm", "vLLM", "VLLM", {"test_real_vllm_tools.py"}),
    ("real_sglang", "SGLang", "SGLANG", {"test_real_sglang_tools.py"}),
    ("real_triton", "Triton", "TRITON", {"test_real_triton_tools.py"}),
    ("real_llamacpp", "llama.cpp", "LLAMACPP", {"test_real_llamacpp_tools.py"}),
    ("k8s", "Kubernetes", "K8S", set()),
    ("real_docker", "Docker", "DOCKER", set()),
]
# The tests that need the real part: every file but the tools' quick tests.
REAL_TESTS = [
    "tests/real_vllm/test_real_vllm_drills.py",
    "tests/real_sglang/test_real_sglang_drills.py",
    "tests/real_triton/test_real_triton_drills.py",
    "tests/real_llamacpp/test_real_llamacpp_drills.py",
    "tests/k8s",
    "tests/real_docker",
]


def _env(tmp: Path, **switches: str) -> dict[str, str]:
    """This environment minus every LLM_VITALS_ variable (switches, cache and binary overrides), with
    the built parts' root and the tiers' output pointed at an empty directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_VITALS_")}
    env.update(LLM_VITALS_CACHE_ROOT=str(tmp / "built"), LLM_VITALS_CACHE=str(tmp / "cache"), **switches)
    return env


def _pytest(args: list[str], env: dict[str, str], basetemp: Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """A pytest run of its own, its temporary directories under `basetemp` (apart from this run's)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
                           f"--basetemp={basetemp}", *args],
                          cwd=cwd, env=env, check=False, capture_output=True, text=True, timeout=300)


def _outcomes(junit: Path) -> dict[str, list[tuple[str, str]]]:
    """Per tier directory: (outcome, message) of each test that ran, from pytest's JUnit XML."""
    found: dict[str, list[tuple[str, str]]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        tier = case.get("classname", "").split(".")[1]  # tests.<tier>.test_file[.Class]
        marks = [(child.tag, child.get("message", "")) for child in case if child.tag in ("error", "failure", "skipped")]
        found.setdefault(tier, []).append(marks[0] if marks else ("passed", ""))
    return found


# One pytest run serves all six tiers, each tier a subtest. Parametrized, each tier's case would need
# a run of its own under `pytest -n 2`: a module fixture is made once per worker, and xdist_group
# marks do not keep tests on one worker here (pytest 9.2, xdist 3.8: a marked module still spreads).


def test_without_its_switch_make_test_collects_only_the_tiers_quick_tests(tmp_path, subtests):
    result = _pytest(["--collect-only", "-q", *(f"tests/{d}" for d, *_ in TIERS)], _env(tmp_path), tmp_path / "basetemp")
    assert result.returncode == 0, result.stdout + result.stderr
    collected = {line.split("::")[0] for line in result.stdout.splitlines() if "::" in line}
    for tier, _, _, kept in TIERS:
        with subtests.test(tier=tier):
            assert {Path(f).name for f in collected if f.startswith(f"tests/{tier}/")} == kept


def _run_real_tests(tmp_path: Path, prefixes: tuple[str, ...], status: int) -> dict[str, list[tuple[str, str]]]:
    """Every tier's real tests in one run, each tier's LLM_VITALS_<prefix>REAL_... switches set."""
    switches = {f"LLM_VITALS_{p}REAL_{s}": "1" for _, _, s, _ in TIERS for p in prefixes}
    result = _pytest([f"--junitxml={tmp_path / 'j.xml'}", "-q", *REAL_TESTS], _env(tmp_path, **switches),
                     tmp_path / "basetemp")
    assert result.returncode == status, result.stdout[-3000:] + result.stderr[-3000:]
    outcomes = _outcomes(tmp_path / "j.xml")
    assert {t for t, *_ in TIERS} <= set(outcomes), f"some tier ran no real test: {sorted(outcomes)}"
    return outcomes


def test_switched_on_without_its_real_part_every_real_test_skips_with_the_tiers_line(tmp_path, subtests):
    outcomes = _run_real_tests(tmp_path, ("",), status=0)
    for tier, name, _, _ in TIERS:
        with subtests.test(tier=tier):
            for outcome, message in outcomes[tier]:
                assert outcome == "skipped" and message.startswith(f"SKIPPED: real-{name} tier: "), (outcome, message)
                assert "makes this a failure" not in message


def test_required_without_its_real_part_every_real_test_fails_naming_the_variable(tmp_path, subtests):
    """As .ci/run runs each tier: its LLM_VITALS_REQUIRE_REAL_... set as well."""
    outcomes = _run_real_tests(tmp_path, ("", "REQUIRE_"), status=1)
    for tier, name, switch, _ in TIERS:
        with subtests.test(tier=tier):
            for outcome, message in outcomes[tier]:
                assert outcome == "error", (outcome, message)  # failed in its fixture, before any real part started
                assert message.startswith(f"failed on setup with \"Failed: SKIPPED: real-{name} tier: "), message
                assert message.endswith(f"[LLM_VITALS_REQUIRE_REAL_{switch}=1 makes this a failure]\""), message


FAKE_CONFTEST = '''
from pathlib import Path

import pytest
from real_engine.engine import Engine
from real_engine.fixtures import drill, report  # noqa: F401
from real_engine.fixtures import keep_call_report as pytest_runtest_makereport  # noqa: F401
from real_engine.fixtures import summarize as pytest_terminal_summary  # noqa: F401
from real_engine.harness import ExporterSettings
from real_tier import RealTier


class FakeEngine(Engine):
    key = "fake"
    name = "Fake"
    tier = RealTier("Fake", enable="LLM_VITALS_REAL_FAKE", require="LLM_VITALS_REQUIRE_REAL_FAKE")
    drills = ("idle", "kill")
    exporter = ExporterSettings(target="real-fake", engine="vllm", stuck_after=6.0)

    def facts(self):
        return {"version": "fake 1"}


ENGINE = FakeEngine()
collect_ignore = ENGINE.tier.left_out("test_drills.py")


def pytest_configure(config):
    ENGINE.tier.stop_on_sigterm()


@pytest.fixture(scope="session")
def engine():
    return ENGINE


@pytest.fixture
def server(report):
    report.server["starts"] = [{"seconds": 1.25, "pid": 4242}]
    yield
    Path("stopped-by-teardown").write_text("yes")
'''

FAKE_DRILLS = '''
import os
import signal


def test_idle_is_quiet(server, drill):
    drill.facts["seen"] = True


def test_kill_is_noticed(server, drill):
    assert os.environ.get("FAKE_KILL_PASSES") == "1", "the kill drill failed"


def test_sigterm_mid_drill(server):
    if os.environ.get("FAKE_SIGTERM") == "1":
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt the run")
'''


def _fake_tier(tmp_path: Path) -> Path:
    tier = tmp_path / "fake_tier"
    tier.mkdir()
    (tier / "__init__.py").write_text("")
    (tier / "conftest.py").write_text(FAKE_CONFTEST)
    (tier / "test_drills.py").write_text(FAKE_DRILLS)
    return tier


def _fake_env(tmp_path: Path, **switches: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_VITALS_")}
    env.update(PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO)]), LLM_VITALS_CACHE=str(tmp_path), **switches)
    return env


def test_drill_records_file_each_drill_with_its_outcome_and_the_summary_names_them(tmp_path):
    _fake_tier(tmp_path)
    result = _pytest(["-q", "fake_tier", "-k", "not sigterm"], _fake_env(tmp_path, LLM_VITALS_REAL_FAKE="1"),
                     tmp_path / "basetemp", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr  # the kill drill fails
    report = json.loads((tmp_path / "real-fake" / "report.json").read_text())
    drills = {d["name"]: d for d in report["drills"]}
    assert {n: d["outcome"] for n, d in drills.items()} == {"idle": "passed", "kill": "failed"}
    assert drills["idle"]["facts"] == {"seen": True} and isinstance(drills["idle"]["seconds"], float)
    summary = result.stdout[result.stdout.index("real-Fake drills"):]
    assert "Fake starts (to ready): 1.2 s (pid 4242)" in summary
    assert [line.split()[:2] for line in summary.splitlines() if line.startswith(("idle ", "kill "))] == [
        ["idle", "passed"], ["kill", "failed"]]
    assert f"report: {tmp_path}/real-fake/report.json; logs: {tmp_path}/real-fake/logs" in summary


def test_without_its_switch_the_fake_tier_collects_no_drill(tmp_path):
    _fake_tier(tmp_path)
    result = _pytest(["-q", "fake_tier"], _fake_env(tmp_path), tmp_path / "basetemp", cwd=tmp_path)
    assert result.returncode == 5, result.stdout + result.stderr  # nothing collected, nothing run
    assert not (tmp_path / "real-fake").exists()


def test_sigterm_mid_run_still_tears_the_fixtures_down(tmp_path):
    _fake_tier(tmp_path)
    env = _fake_env(tmp_path, LLM_VITALS_REAL_FAKE="1", FAKE_SIGTERM="1", FAKE_KILL_PASSES="1")
    result = _pytest(["-q", "fake_tier", "-k", "sigterm"], env, tmp_path / "basetemp", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr  # interrupted, not killed by the signal
    assert "KeyboardInterrupt" in result.stdout and "signal 15" in result.stdout, result.stdout
    assert (tmp_path / "stopped-by-teardown").read_text() == "yes"
