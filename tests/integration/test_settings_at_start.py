"""A combination settings validation refuses stops a real process at start, with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_process_refuses_to_start_with_the_sqlite_broker_beside_postgresql() -> None:
    # Given a PostgreSQL job database and a SQLite broker file (docs/scaling.md: "settings validation
    # refuses the SQLite broker with a PostgreSQL database")
    env = {
        **os.environ,
        "TENURE_DATABASE_URL": "postgresql://tenure@127.0.0.1:1/tenure",
        "TENURE_BROKER_URL": "sqlite:///var/broker.db",
    }
    # When a tenure command starts
    done = subprocess.run(
        [sys.executable, "-m", "tenure_cli", "db", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Then it exits 2 before touching either, saying why and what to use
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "the SQLite broker needs the SQLite job database" in done.stderr and "redis://" in done.stderr
