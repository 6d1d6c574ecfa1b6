"""gunicorn.conf.py's master-side hook: it does its work without importing anything while the master stops.

honcho SIGKILLs a process type that is not gone 5 s after its SIGTERM. A ``child_exit`` that imported
``monitoring.exposition`` (which pulls in the job layer's database code) kept a loaded machine's stopping
master busy for seconds after its worker had exited.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, runpy, sys

config = runpy.run_path(sys.argv[1])
before = set(sys.modules)


class Worker:
    pid = int(sys.argv[2])


config["child_exit"](None, Worker())
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_child_exit_drops_the_dead_workers_live_gauges_and_imports_nothing(tmp_path: Path) -> None:
    # Given the multiprocess files of a dead web worker (a live gauge, a counter) and of a running one
    for name in ("gauge_livesum_4242.db", "counter_4242.db", "gauge_livesum_4343.db"):
        (tmp_path / name).write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMETHEUS_")}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)

    # When the master's child_exit hook runs for the dead one
    run = subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT / "gunicorn.conf.py"), "4242"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr

    # Then its live gauge is gone, its counter (a total) and the other worker's gauge stay, and the hook
    # imported no module
    assert sorted(p.name for p in tmp_path.iterdir()) == ["counter_4242.db", "gauge_livesum_4343.db"]
    assert json.loads(run.stdout) == []
