"""Quick checks of the real-llama.cpp tier's own tools; these run in the normal suite (no llama-server needed).

The kit's checks (load, report, the exporter config, setup scripts' skips) are in tests/real_engine/.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from .freeze_thread import FreezeError, frozen_thread, thread_state


def test_freeze_stops_exactly_the_thread_then_lets_it_run_on():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with frozen_thread(sleeper.pid, max_seconds=30):
            assert thread_state(sleeper.pid, sleeper.pid) == "t"
        assert thread_state(sleeper.pid, sleeper.pid) in ("S", "R")
        assert sleeper.poll() is None, "the frozen process died"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_freeze_of_no_such_thread_is_a_clear_error():
    with pytest.raises(FreezeError, match="PTRACE_SEIZE"), frozen_thread(2**22 + 12345, max_seconds=5):
        pass
