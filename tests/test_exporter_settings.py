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
    "invalid-exporter-unknown-key.yaml": "poll_intervall: unknown key",
    "invalid-exporter-target-typo.yaml": "targets[0].stuck_afte: unknown key",
    "invalid-exporter-bad-duration.yaml": "poll_interval: not a duration: 'five seconds' (use e.g. 30s, 5m, 1h or plain seconds)",
    "invalid-exporter-duplicate-name.yaml": "duplicate target name 'gpu-a'",
    "invalid-exporter-bad-engine.yaml": "targets[0].engine: Input should be 'vllm', 'llamacpp', 'triton', 'sglang', 'tgi' or 'openai'",
    "invalid-exporter-no-targets.yaml": "give at least one target, or a discovery source",
    "invalid-exporter-missing-key-env.yaml": "targets[0].api_key_env: environment variable LLM_VITALS_TEST_KEY_THAT_IS_NOT_SET is not set",
    "invalid-exporter-bad-listen.yaml": "listen: listen must be HOST:PORT, got '9471'",
    "invalid-exporter-bad-workload.yaml":
        r"targets[0].workload: workload 'vllm fleet' must match ^[A-Za-z0-9][A-Za-z0-9_.:/\[\]-]{0,511}$",
    "invalid-exporter-not-yaml.yaml": "not valid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>'",
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
