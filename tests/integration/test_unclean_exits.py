"""A consumer process killed without closing the broker is reported by the next one to start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from broker import SQLiteBroker

CHILD = textwrap.dedent(
    """
    import sys, time
    from broker import SQLiteBroker
    b = SQLiteBroker(sys.argv[1], middleware=[])
    b.declare_queue("q")
    c = b.consume("q", timeout=100)  # registers this process as a consumer
    print("ready", flush=True)
    time.sleep(60)
    """
)


def _start_consumer(url: str) -> subprocess.Popen[str]:
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, url],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.timeout(60)
def test_a_sigkilled_consumer_is_reported_once_by_the_next_start(sqlite_url: str) -> None:
    # Given: a consumer process killed with SIGKILL (it never closes its broker)
    killed = _start_consumer(sqlite_url)
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(10)
    finally:
        killed.kill()

    # When: the next consumer process starts
    started = time.time() * 1000
    nxt = SQLiteBroker(sqlite_url, middleware=[])
    nxt.declare_queue("q")
    nxt.consume("q", timeout=10)

    # Then: it reports exactly the killed process, with its start time
    assert nxt.unclean_exits_reported is not None
    count, since = nxt.unclean_exits_reported
    assert count == 1
    assert since is not None and since <= started
    exits = nxt.unclean_exits()
    assert [e["pid"] for e in exits] == [killed.pid]
    assert exits[0]["reported_at"] is not None
    nxt.close()

    # And: a clean close is not an unclean exit, and nothing is reported twice
    again = SQLiteBroker(sqlite_url, middleware=[])
    again.declare_queue("q")
    again.consume("q", timeout=10)
    assert again.unclean_exits_reported is None
    assert len(again.unclean_exits()) == 1
    again.close()
