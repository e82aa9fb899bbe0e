"""Quick checks of the GPU tier's own tools; these run in `make test`, where there is no GPU."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from llm_vitals.exporter.settings import parse_settings

from .gpu_drills import TARGET, Mode, exporter_config
from .make_gguf import EMBD, FF, HEADS, LAYERS, parameter_count
from .report import lines

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("bash", "sha256sum", "cut", "grep", "tr", "sort", "dirname", "cat", "uname", "head", "sed", "date", "mkdir", "rm")


def bare_path(tmp_path: Path) -> str:
    """A PATH with the shell's basic tools and neither nvidia-smi nor nvcc, as on a machine without a GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        if found:
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def test_without_a_gpu_make_test_gpu_says_so_in_one_line_and_exits_0(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_VITALS_GPU")}
    env["PATH"] = bare_path(tmp_path)
    result = subprocess.run(["bash", str(REPO / "tools" / "real-gpu-test.sh")], env=env, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["SKIPPED: GPU tier: no NVIDIA GPU here (nvidia-smi lists none), nothing was run"]


def test_setup_skips_with_one_line_without_nvcc(tmp_path):
    env = {**os.environ, "PATH": bare_path(tmp_path), "LLM_VITALS_CACHE_ROOT": str(tmp_path / "cache")}
    result = subprocess.run(["bash", str(REPO / "tools" / "real-gpu-setup.sh")], env=env, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    if Path("/usr/local/cuda/bin/nvcc").exists():  # a CUDA machine: the setup would find it there
        return
    assert result.returncode == 77, result.stderr
    assert result.stdout.splitlines() == ["SKIPPED: GPU tier: no nvcc (the CUDA toolkit) to build llama-server with CUDA"]


def test_the_model_is_about_0_8_billion_parameters_in_the_writers_shape():
    assert 0.8e9 < parameter_count() < 0.85e9
    # The llama.cpp tier's writer takes this shape (read from its source: it imports gguf, absent here).
    tree = ast.parse((REPO / "tests" / "real_llamacpp" / "make_tiny_gguf.py").read_text())
    write = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "write")
    assert {"embd", "layers", "ff", "heads"} <= {arg.arg for arg in write.args.args}
    assert EMBD % HEADS == 0 and (LAYERS, FF) == (16, 5632)


def test_the_drills_exporter_config_loads_and_reads_gpu_0_through_nvml():
    settings = parse_settings(yaml.safe_load(exporter_config(9999, "http://127.0.0.1:8080")), "drills", environ={})
    target = settings.target(TARGET)
    assert target is not None and target.gpus == [0] and target.engine == "llamacpp"
    assert (settings.poll_interval, target.stuck_after, settings.metrics_timeout) == (1.0, 6.0, 2.0)


def test_a_long_generation_fits_one_slot_of_the_context():
    for mode in (Mode.pick(cpu_flow=False), Mode.pick(cpu_flow=True)):
        args = dict(zip(mode.server_args[::2], mode.server_args[1::2], strict=True))
        assert int(args["-np"]) == mode.slots
        assert mode.tokens + 100 < int(args["-c"]) // mode.slots  # the prompt and the tokens in one slot
    assert "-ngl" in Mode.pick(cpu_flow=False).server_args


def test_the_nvml_check_without_a_gpu_reports_why_and_flags_nothing(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "tests" / "real_gpu" / "nvml_check.py"), str(tmp_path), "--no-gpu"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    facts = json.loads((tmp_path / "nvml.json").read_text())
    assert facts["failures"] == []
    assert facts["open"].startswith(("nvml_unavailable: ", "nvml_init: "))
    assert facts["source"]["fault"] is None
    assert any(text.startswith("NVML (no GPU): ") for text in lines(tmp_path))


def test_the_report_shows_each_drill_and_its_outcome(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps({"mode": {"gpu": True}, "steps": {
        "saturation": {"outcome": "passed", "seconds": 31.2, "not_busy": [], "canaries": 0, "watchdog_1token_s": [14.2]},
        "sigstop": {"outcome": "failed", "seconds": 9.0, "reason": "no_progress", "failure": "reason"}}}))  # fmt: skip
    shown = lines(tmp_path)
    assert shown[0] == "drills (GPU):"
    assert shown[1].split()[:2] == ["passed", "saturation"] and "watchdog_1token_s [14.2]" in shown[1]
    assert "not_busy" not in shown[1]  # empty facts are left out
    assert shown[2].split()[:2] == ["failed", "sigstop"]
    assert shown[-1].startswith("NVML: no report")
