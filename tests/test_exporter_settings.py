"""Exporter config: durations, defaults, unknown keys, and each invalid file's exact message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from llm_vitals.exporter.settings import ConfigError, load_settings, parse_settings

DATA = REPO / "tests" / "data"

INVALID = {
    "invalid-exporter-unknown-key.yaml": "poll_intervall: unknown key (did you mean poll_interval?)",
    "invalid-exporter-target-typo.yaml": "targets[0].stuck_afte: unknown key (did you mean stuck_after?)",
    "invalid-exporter-bad-duration.yaml": "poll_interval: not a duration: 'five seconds' (use e.g. 30s, 5m, 1h or plain seconds)",
    "invalid-exporter-duplicate-name.yaml": "duplicate target name 'gpu-a'",
    "invalid-exporter-bad-engine.yaml": "targets[0].engine: Input should be 'vllm', 'llamacpp', 'triton', 'sglang', 'tgi' or 'openai'",
    "invalid-exporter-no-targets.yaml": "give at least one target, or a discovery source",
    "invalid-exporter-missing-key-env.yaml": "targets[0].api_key_env: environment variable LLM_VITALS_TEST_KEY_THAT_IS_NOT_SET is not set",
    "invalid-exporter-bad-listen.yaml": "listen: listen must be HOST:PORT, got '9471'",
    "invalid-exporter-bad-workload.yaml":
        r"targets[0].workload: workload 'vllm fleet' must match ^[A-Za-z0-9][A-Za-z0-9_.:/\[\]-]{0,511}$",
    "invalid-exporter-not-yaml.yaml": "not valid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>'",
    # One message for every duration that must be above 0, zero or negative alike.
    "invalid-exporter-zero-canary-timeout.yaml": "targets[0].canary.timeout: must be > 0",
    "invalid-exporter-zero-liveness-budget.yaml": "targets[0].liveness_budget: must be > 0",
    "invalid-exporter-zero-metrics-timeout.yaml": "metrics_timeout: must be > 0",
    "invalid-exporter-zero-refresh-interval.yaml": "discovery[0].file.refresh_interval: must be > 0",
    "invalid-exporter-negative-down-after.yaml": "targets[0].down_after: must be > 0",
    # NaN and the infinities (issue 29): NaN compares false with everything, so it has a message of its own.
    "invalid-exporter-nan-stuck-after.yaml": "targets[0].stuck_after: not a duration: NaN (a duration must be a number of seconds)",
    "invalid-exporter-nan-startup-grace.yaml":
        "targets[0].startup_grace: not a duration: NaN (a duration must be a number of seconds)",
    "invalid-exporter-inf-metrics-timeout.yaml": "metrics_timeout: duration too large: 'inf' (at most 100 years)",
    "invalid-exporter-minus-inf-canary-interval.yaml": "targets[0].canary.interval: must be > 0",
    "invalid-exporter-overflowing-down-after.yaml":
        "targets[0].down_after: duration too large: '9999999999999999999999999999999999999999' (at most 100 years)",
    "invalid-exporter-nan-poll-jitter.yaml": "poll_jitter: Input should be a finite number",
    "invalid-exporter-restart-risk-not-openai.yaml": (
        "targets[0]: restart_risking_busy_server is for engine openai, whose load cannot be read; "
        "a vllm target's canary never goes to a busy server"),
}


@pytest.mark.parametrize("name,message", sorted(INVALID.items()))
def test_invalid_config_file_gives_its_exact_message(name: str, message: str) -> None:
    path = DATA / name
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    assert str(caught.value) == f"{path}: {message}"


def test_example_config_is_valid_and_durations_are_seconds() -> None:
    settings = load_settings(REPO / "llm_vitals" / "exporter" / "example.yaml", environ={})
    assert settings.poll_interval == 5.0
    gpu_a = settings.target("gpu-a")
    assert gpu_a.stuck_after == 60.0 and gpu_a.startup_grace == 900.0
    assert gpu_a.canary.interval == 30.0 and gpu_a.canary.timeout == 10.0
    assert gpu_a.liveness == 120.0  # default 2 x stuck_after
    assert settings.target("front").role == "proxy"
    assert settings.metrics_timeout == 10.0 and settings.max_page_bytes == 4 * 1024 * 1024


def test_plain_seconds_and_remediator_url_are_accepted() -> None:
    settings = parse_settings({
        "poll_interval": 2, "remediator_url": "http://127.0.0.1:9472",
        "targets": [{"name": "a", "url": "http://127.0.0.1:1", "stuck_after": "1500ms", "liveness_budget": "5m"}],
    }, environ={})
    assert settings.poll_interval == 2.0
    assert settings.targets[0].stuck_after == 1.5 and settings.targets[0].liveness == 300.0
    assert str(settings.remediator_url) == "http://127.0.0.1:9472/"


def test_api_key_comes_from_env_or_file_and_is_never_printed(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("file-secret-123\n")
    settings = parse_settings({"targets": [
        {"name": "a", "url": "http://127.0.0.1:1", "api_key_env": "K"},
        {"name": "b", "url": "http://127.0.0.1:2", "api_key_file": str(key_file)},
    ]}, environ={"K": "env-secret-456"})
    assert settings.targets[0].api_key.get_secret_value() == "env-secret-456"
    assert settings.targets[1].api_key.get_secret_value() == "file-secret-123"
    for text in (repr(settings), str(settings), settings.model_dump_json()):
        assert "env-secret-456" not in text and "file-secret-123" not in text


def test_check_config_exits_0_for_valid_and_1_for_invalid() -> None:
    def run(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "llm_vitals.exporter.cli", "--config", str(path), "--check-config"],
                              capture_output=True, text=True, cwd=REPO, timeout=60)

    good = run(REPO / "llm_vitals" / "exporter" / "example.yaml")
    assert good.returncode == 0, good.stderr
    bad = run(DATA / "invalid-exporter-target-typo.yaml")
    assert bad.returncode == 1
    assert "targets[0].stuck_afte: unknown key" in bad.stderr


def test_a_blank_secret_is_a_config_error_not_an_empty_token(tmp_path: Path) -> None:
    blank = tmp_path / "blank"
    blank.write_text("\n")
    target = {"name": "a", "url": "http://127.0.0.1:1"}
    cases = [
        ({"drain_token_file": str(blank)}, {}, f"drain_token_file: {blank} is empty"),
        ({"drain_token_env": "T"}, {"T": "  "}, "drain_token_env: environment variable T is empty"),
        ({"targets": [target, {**target, "name": "b", "api_key_file": str(blank)}]}, {},
         f"targets[1].api_key_file: {blank} is empty"),
    ]
    for extra, environ, message in cases:
        with pytest.raises(ConfigError) as caught:
            parse_settings({"targets": [target], **extra}, "test", environ=environ)
        assert str(caught.value) == f"test: {message}"


def test_public_url_drops_credentials_and_only_a_default_port() -> None:
    def public(url: str) -> str:
        return parse_settings({"targets": [{"name": "a", "url": url}]}, environ={}).targets[0].public_url

    assert public("http://admin:8000pw@gpu-a/") == "http://gpu-a"  # ':80' inside the password is no port
    assert public("http://admin:pw@gpu-a:8000/v1/") == "http://gpu-a:8000/v1"
    assert public("https://gpu-a:443") == "https://gpu-a"
    assert public("http://[::1]:9000") == "http://[::1]:9000"


def _positive_durations(model: type, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every field of the config models typed PositiveDuration, as a key path (a list is its first item)."""
    import typing

    from pydantic import BaseModel

    from llm_vitals.durations import parse_positive_duration

    found = []
    for name, info in model.model_fields.items():
        if any(getattr(m, "func", None) is parse_positive_duration for m in info.metadata) or (
                "parse_positive_duration" in repr(info.annotation)):
            found.append((*path, name))
            continue
        for arg in (info.annotation, *typing.get_args(info.annotation)):
            inner = typing.get_args(arg)[0] if typing.get_origin(arg) is list else arg
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                found += _positive_durations(inner, (*path, name))
    return found


def _document(keys: tuple[str, ...], value: object) -> tuple[dict, str]:
    """A config with `keys` set to `value` (a target or a file_sd entry around it as needed), and the key path shown."""
    base: dict = {"targets": [{"name": "a", "url": "http://127.0.0.1:1"}]}
    if keys[0] == "backstop":  # asks the remediator: needs its URL
        base["remediator_url"] = "http://127.0.0.1:2"
    if keys[0] == "targets":
        node, shown = base["targets"][0], "targets[0]"
        keys = keys[1:]
    elif keys[0] == "discovery":
        base["discovery"] = [{"file": {"paths": ["/nowhere/*.json"]}}]
        node, shown = base["discovery"][0]["file"], "discovery[0].file"
        keys = keys[2:]
    else:
        node, shown = base, ""
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        shown += f".{key}"
    node[keys[-1]] = value
    return base, f"{shown}.{keys[-1]}".lstrip(".")


def test_every_positive_duration_refuses_zero_and_negative_with_one_message() -> None:
    from llm_vitals.exporter.settings import ExporterSettings

    keys = _positive_durations(ExporterSettings)
    # The ones the issue names, and the rest of the timeouts and intervals.
    for expected in [("metrics_timeout",), ("poll_interval",), ("targets", "canary", "timeout"),
                     ("targets", "liveness_budget"), ("targets", "down_after"), ("targets", "stuck_after"),
                     ("discovery", "file", "refresh_interval"), ("gpu_faults", "nvml", "call_timeout")]:
        assert expected in keys, expected
    for key in keys:
        for value in (0, "0s", -1, "-5s"):
            document, shown = _document(key, value)
            with pytest.raises(ConfigError) as caught:
                parse_settings(document, "cfg.yaml", environ={})
            assert str(caught.value) == f"cfg.yaml: {shown}: must be > 0", (key, value)
        document, _ = _document(key, "250ms")
        parse_settings(document, "cfg.yaml", environ={})  # any positive duration loads


def test_startup_grace_0_is_no_grace_and_loads() -> None:
    settings = parse_settings({"targets": [{"name": "a", "url": "http://127.0.0.1:1", "startup_grace": 0}]}, environ={})
    assert settings.targets[0].startup_grace == 0.0


def test_down_after_defaults_to_30s_and_openai_targets_restart_only_when_they_accept_the_risk() -> None:
    settings = parse_settings({"targets": [
        {"name": "v", "url": "http://127.0.0.1:1"},
        {"name": "o", "url": "http://127.0.0.1:2", "engine": "openai"},
        {"name": "risk", "url": "http://127.0.0.1:3", "engine": "openai", "restart_risking_busy_server": True},
    ]}, environ={})
    vllm, openai, risk = settings.targets
    assert vllm.down_after == 30.0
    assert vllm.restart_on_unresponsive and not openai.restart_on_unresponsive and risk.restart_on_unresponsive


# -- floors an engine's own refresh imposes (issue 29): facts of the engine table, said at load ----

FLOOR_WARNING = ("stuck_after: 10s is below the 30s that engine sglang needs (SGLang refreshes sglang:num_running_reqs "
                 "and sglang:num_queue_reqs only every 40 decode steps (decode_log_interval), or every 30s when idle, "
                 "so they can show work pending for that long after it ended): it may read stuck after its work has "
                 "ended; use 30s or more")


@pytest.mark.parametrize(("engine", "stuck_after", "warned"), [
    ("sglang", "10s", True), ("sglang", "29.5s", True), ("sglang", "30s", False), ("sglang", "2m", False),
    ("vllm", "10s", False), ("llamacpp", "1s", False),
])
def test_a_stuck_after_below_the_engines_floor_is_warned_about_with_the_reason(engine, stuck_after, warned) -> None:
    settings = parse_settings({"targets": [{"name": "a", "url": "http://127.0.0.1:1", "engine": engine,
                                            "stuck_after": stuck_after}]}, environ={})
    warnings = settings.warnings()
    assert bool(warnings) is warned
    if warned:
        assert warnings[0].startswith(f"targets[0].stuck_after: {stuck_after.removesuffix('s')}s is below the 30s")


def test_the_floor_is_the_engine_tables_fact_and_discovery_templates_are_checked_too() -> None:
    from llm_vitals.exporter.engines.table import ENGINES
    assert ENGINES["sglang"].facts.stuck_after_floor == 30.0
    assert all(entry.facts.stuck_after_floor == 0.0 for name, entry in ENGINES.items() if name != "sglang")
    settings = parse_settings({"discovery": [{"file": {"paths": ["/etc/t/*.json"],
                                                       "template": {"engine": "sglang", "stuck_after": "10s"}}}]},
                              environ={})
    assert settings.warnings() == [f"discovery[0].file.template.{FLOOR_WARNING}"]


def test_check_config_says_the_warning_and_still_passes(capsys) -> None:
    from llm_vitals.exporter.cli import main
    assert main(["--config", str(DATA / "warn-exporter-sglang-stuck-after-below-floor.yaml"), "--check-config"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1:] == [f"warning: targets[0].{FLOOR_WARNING}"]
