"""What every real-part tier shares (tests/real_vllm/, real_sglang/, real_triton/, real_llamacpp/,
real_docker/, k8s/): its two switches, what the normal suite leaves uncollected, SIGTERM as a
teardown, and the skip that is a failure when the tier is required (tools/real-tier-lib.sh keeps the
same rule for the setup scripts). The engine tiers' drills, report and fixtures are in tests/real_engine/.

Imported as `real_tier`: `tests/` is on sys.path under pytest (rootdir conftest, prepend import
mode), as for `from conftest import ...`.
"""

from __future__ import annotations

import os
import signal
from typing import NoReturn

import pytest


class RealTier:
    """One tier's switches: `enable` collects it (its Makefile target and tools/real-*-test.sh set
    it), `require` makes its skip a failure (CI's .ci/run sets it). Read once, at import, as the
    conftests did."""

    def __init__(self, name: str, *, enable: str, require: str) -> None:
        self.name = name  # as in "real-vLLM tier"
        self.require_var = require
        self.enabled = os.environ.get(enable) == "1"
        self.required = os.environ.get(require) == "1"

    def left_out(self, *patterns: str) -> list[str]:
        """What the conftest's `collect_ignore` / `collect_ignore_glob` holds: these unless the tier
        is switched on, so `make test` (pytest -n 2 over tests/) never starts a real part."""
        return [] if self.enabled else list(patterns)

    def stop_on_sigterm(self) -> None:
        """Call early: from pytest_configure, or the tier's first session fixture. `timeout`
        (tools/real-*-test.sh) or CI ends a run with SIGTERM: turn it into the KeyboardInterrupt
        pytest tears fixtures down on, so the real servers (in sessions of their own, they would not
        get the signal) are still stopped by PID."""
        if self.enabled:
            signal.signal(signal.SIGTERM, _interrupt)

    def skip_or_fail(self, why: str) -> NoReturn:
        """One line saying why the tier cannot run here: a skip, or a failure when it is required."""
        message = f"SKIPPED: real-{self.name} tier: {why}"
        if self.required:
            pytest.fail(message + f" [{self.require_var}=1 makes this a failure]", pytrace=False)
        pytest.skip(message)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
