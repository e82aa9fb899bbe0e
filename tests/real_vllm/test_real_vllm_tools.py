"""Quick checks of the real-vLLM tier's own tools; these run in the normal suite (no vLLM needed).

The kit's checks (load, report, setup scripts' skips) are in tests/real_engine/.
"""

from __future__ import annotations

import pytest

from .engine_death import death_line, status_name

WORKER_SIGILL_LOG = """\
(APIServer pid=101) INFO:     127.0.0.1:40000 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error
(EngineCore pid=202) ERROR 12-03 13:40:01 [multiproc_executor.py:263] Worker proc VllmWorker-0 died unexpectedly \
(exit code: -4), shutting down executor.
(APIServer pid=101) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.
"""


@pytest.mark.parametrize(
    ("log", "api_status", "gone", "expected"),
    [
        pytest.param(
            WORKER_SIGILL_LOG, None, ["VLLM::Worker"],
            "Worker proc VllmWorker-0 died by SIGILL (exit code -4); vLLM log: (EngineCore pid=202) ERROR 12-03 "
            "13:40:01 [multiproc_executor.py:263] Worker proc VllmWorker-0 died unexpectedly (exit code: -4), "
            "shutting down executor.",
            id="worker-sigill",
        ),
        pytest.param(
            "x\n(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: boom\n", 0, ["API server", "VLLM::EngineCore"],
            "API server, VLLM::EngineCore gone (API server exit status 0); vLLM log: "
            "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: boom",
            id="no-died-line",
        ),
        pytest.param("", None, [], "no vLLM process gone (API server still running); vLLM log says nothing of it", id="silent"),
        pytest.param("", -9, ["API server"],
                     "API server gone (API server SIGKILL (exit code -9)); vLLM log says nothing of it", id="api-killed"),
    ],
)  # fmt: skip
def test_death_line_names_the_process_its_signal_and_the_log_line(log, api_status, gone, expected):
    assert death_line(log, api_status, gone) == expected


@pytest.mark.parametrize(
    ("code", "expected"),
    [(-4, "SIGILL (exit code -4)"), (-11, "SIGSEGV (exit code -11)"), (-200, "signal 200 (exit code -200)"),
     (0, "exit status 0"), (1, "exit status 1"), (None, "no exit status")],
)  # fmt: skip
def test_status_name(code, expected):
    assert status_name(code) == expected


def test_death_line_when_vllm_logged_no_exit_code():
    log = (
        "(EngineCore pid=2) ERROR [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly "
        "(exit code: None), shutting down executor.\n"
    )
    assert death_line(log, None, []).startswith("Worker proc VllmWorker-0 died with no exit code logged; vLLM log: (EngineCore")


def test_death_line_takes_the_signal_from_faulthandler_when_vllm_logged_none():
    log = (
        "Fatal Python error: Illegal instruction\n\nThread 0x00007f (most recent call first):\n"
        "(EngineCore pid=2) ERROR [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly "
        "(exit code: None), shutting down executor.\n"
    )
    assert death_line(log, None, []).startswith(
        "Worker proc VllmWorker-0 died by SIGILL (faulthandler: 'Fatal Python error: Illegal instruction'; "
        "vLLM logged exit code None); vLLM log: (EngineCore pid=2) ERROR"
    )
