"""Run a function in a forked child of the test process and get its report back (the brokers' fork-safety
tests: a child must use a broker its parent already used with connections of its own)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable


def run_forked(child: Callable[[], str], timeout_s: float = 30) -> str:
    """``child()`` in a forked process; returns what it returned. Fails if it raised, hung or exited non-zero."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        status = 1
        try:
            os.close(read_end)
            os.write(write_end, child().encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    try:
        deadline = time.monotonic() + timeout_s
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            assert time.monotonic() < deadline, "forked child hung"
            time.sleep(0.01)
        report = os.read(read_end, 4096).decode()
    finally:
        os.close(read_end)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(done[1]) == 0, report
    return report
