"""Say in one line which vLLM process died and by which signal, from vLLM's own log and exit statuses.

Pure: the preflight (vllm_server.VllmServer.preflight) gathers the log text, the API server's exit
status and the titles of the processes that are gone, and this decides what the line says.
"""

from __future__ import annotations

import re
import signal

# EngineCore's line when its Worker dies: "Worker proc VllmWorker-0 died unexpectedly (exit code: -4)".
# vLLM logs "exit code: None" when it reaped the Worker before reading its status.
_DIED = re.compile(r"(?P<who>\S+ proc \S+) died unexpectedly[^(]*\(exit code: (?P<code>-?\d+|None)\)")
# faulthandler's line (PYTHONFAULTHANDLER=1) in the process that got the signal.
_FATAL = re.compile(r"Fatal Python error: (?P<what>Illegal instruction|Segmentation fault|Bus error|Floating-point exception|Aborted)")
_FATAL_SIGNALS = {"Illegal instruction": "SIGILL", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS",
                  "Floating-point exception": "SIGFPE", "Aborted": "SIGABRT"}  # fmt: skip
_ERROR = re.compile(r"\b(EngineDeadError|RuntimeError|Fatal Python error|Illegal instruction|Segmentation fault)\b")


def status_name(code: int | None) -> str:
    """`SIGILL (exit code -4)` for a negative (by-signal) status, `exit status 0` otherwise."""
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"{signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            return f"signal {-code} (exit code {code})"
    return f"exit status {code}"


def death_line(log_text: str, api_status: int | None, gone: list[str]) -> str:
    """One line: which process died, its exit signal, and the vLLM log line that says so."""
    lines = log_text.splitlines()
    died = [m for m in map(_DIED.search, lines) if m]
    if died:
        first = died[0]
        code = first.group("code")
        fatal = next((m for m in map(_FATAL.search, lines) if m), None)
        if code != "None":
            how = f"by {status_name(int(code))}"
        elif fatal:
            how = f"by {_FATAL_SIGNALS[fatal.group('what')]} (faulthandler: {fatal.group(0)!r}; vLLM logged exit code None)"
        else:
            how = "with no exit code logged"
        return f"{first.group('who')} died {how}; vLLM log: {first.string.strip()}"
    error = next((line.strip() for line in lines if _ERROR.search(line)), None)
    what = ", ".join(gone) if gone else "no vLLM process"
    api = f"API server {status_name(api_status)}" if api_status is not None else "API server still running"
    said = f"; vLLM log: {error}" if error else "; vLLM log says nothing of it"
    return f"{what} gone ({api}){said}"
