"""The project's image, built here on a Debian base made locally, runs what the compose file runs."""

from __future__ import annotations

import httpx
from conftest import REPO, free_port

from .engine import LABEL, Engine, wait_until

CONFIGS = REPO / "deploy" / "compose"


def test_the_image_is_the_project_on_the_local_base(engine: Engine, image: str, base_image: str):
    config = engine.api("GET", f"/images/{image}/json").json()["Config"]
    assert config["User"] == "10001:10001"
    assert any(e.startswith("PATH=/opt/llm-vitals/bin:") for e in config["Env"])
    history = engine.api("GET", f"/images/{image}/history").json()
    base_id = engine.api("GET", f"/images/{base_image}/json").json()["Id"]
    assert base_id in {layer["Id"] for layer in history}, "not built on the locally made base"


def test_the_image_checks_the_shipped_configs(engine: Engine, image: str):
    """`llm-vitals-exporter/remediator --check-config` on the files the compose file mounts.

    With both tokens set, as docker-compose.yml sets them: the remediator reads the act and the read
    token, the exporter the read token (its status page reads the remediator's decisions)."""
    for program in ("exporter", "remediator"):
        result = engine.docker(
            "run", "--rm", "--network", "none", "--label", LABEL, "-e", "LLM_VITALS_WEBHOOK_TOKEN=not-a-secret",
            "-e", "LLM_VITALS_READ_TOKEN=not-a-secret-either",
            "-v", f"{CONFIGS / f'{program}.yaml'}:/etc/llm-vitals/{program}.yaml:ro",
            image, f"llm-vitals-{program}", "--check-config", "--config", f"/etc/llm-vitals/{program}.yaml",
            check=False, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_runs_the_simulator_on_the_host_network(engine: Engine, image: str):
    port = free_port()
    name = f"lv-test-sim-{port}"
    engine.run_detached(name, ["llm-vitals-sim", "--host", "127.0.0.1", "--port", str(port), "--no-control",
                               "--startup-seconds", "0"])
    try:
        models = wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).json(), 60,
                            "the simulator in its container to answer")
        assert models["data"][0]["id"]
        page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "vllm:num_requests_running" in page
    finally:
        engine.remove(name)
