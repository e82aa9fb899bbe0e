"""Stop ONE thread of a running process (the rest keep running), then let it go: "engine hung, HTTP alive".

usage (root, or CAP_SYS_PTRACE): python freeze_thread.py TID MAX_SECONDS
Prints `frozen <state>` once the thread is stopped, then holds it until a line (or EOF) arrives on
stdin or MAX_SECONDS pass, detaches (the thread runs on) and prints `released`.

llama-server runs its engine loop on the main thread, so TID = the server's PID freezes the engine
while the HTTP threads keep answering; SIGSTOP stops the whole process and cannot do that. ptrace
does: PTRACE_SEIZE attaches without stopping, PTRACE_INTERRUPT stops exactly that thread. The
tracer is this separate process, so a test run that dies leaves no thread frozen: a tracer's exit
detaches its tracee, and MAX_SECONDS bounds a tracer that lives on.
"""

from __future__ import annotations

import ctypes
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
WAIT_ALL = 0x40000000  # __WALL: wait for a thread that is not the thread group leader too


class FreezeError(RuntimeError):
    """The thread could not be frozen (no such thread, not allowed)."""


def thread_state(pid: int, tid: int) -> str:
    """The thread's state letter from /proc: `t` while traced-stopped, `R`/`S` while running."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def _ptrace(libc: ctypes.CDLL, request: int, tid: int, what: str) -> None:
    if libc.ptrace(request, tid, None, None) != 0:
        err = ctypes.get_errno()
        raise FreezeError(f"{what}({tid}) failed: {os.strerror(err)}")


def hold(tid: int, max_seconds: float) -> None:
    """The script: freeze `tid`, report, wait for stdin or the deadline, release."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    _ptrace(libc, PTRACE_SEIZE, tid, "PTRACE_SEIZE")
    try:
        _ptrace(libc, PTRACE_INTERRUPT, tid, "PTRACE_INTERRUPT")
        os.waitpid(tid, WAIT_ALL)
        print(f"frozen {thread_state(tid, tid)}", flush=True)
        deadline = time.monotonic() + max_seconds
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([sys.stdin], [], [], left)
            if readable:
                break  # a line or EOF: the caller is done with the freeze
    finally:
        _ptrace(libc, PTRACE_DETACH, tid, "PTRACE_DETACH")
    print("released", flush=True)


@contextmanager
def frozen_thread(tid: int, max_seconds: float) -> Iterator[float]:
    """Hold thread `tid` stopped inside the block (at most `max_seconds`); yields time.time() of the freeze."""
    proc = subprocess.Popen(
        [sys.executable, __file__, str(tid), str(max_seconds)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        if not line.startswith("frozen"):
            proc.wait(timeout=10)
            raise FreezeError(f"freeze of thread {tid} failed: {line.strip()} {proc.stderr.read().strip()}")
        yield time.time()
    finally:
        if proc.poll() is None:
            try:
                proc.stdin.write("release\n")
                proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()  # its exit detaches the thread all the same
                proc.wait(timeout=10)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.splitlines()[2])
    try:
        hold(int(sys.argv[1]), float(sys.argv[2]))
    except FreezeError as exc:
        sys.exit(str(exc))
