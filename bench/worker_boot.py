"""How long ``tenure worker`` takes to start: an old and a new commit, alternated in one run.

Run from the repository root::

    .venv/bin/python -m bench.worker_boot [--old HEAD~1] [--new HEAD] [--processes 2,4] [--runs 7]

Both commits are exported with ``git archive`` (:func:`bench.jobs_compare.export`); each run starts that tree's
``python -m tenure_cli worker tasks:compose --processes P --threads 2`` on a fresh SQLite file migrated by the
same tree, and times it from the exec to the moment every worker process has logged Dramatiq's "ready for
action"; then the worker is SIGKILLed with its process group. The sides alternate (old, new, new, old, …).
Printed per ``P``: each side's seconds per run, the medians and new ÷ old of the medians. Not a test: nothing
asserts on timings.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .broker_bench import loadavg, log
from .jobs_compare import export

#: A worker that has not booted by then is reported as a failure (its log is printed).
BOOT_TIMEOUT_S = 60.0


def boot_seconds(tree: Path, processes: int, scratch: Path) -> float:
    """One boot of *tree*'s ``tenure worker`` with *processes* worker processes, in seconds."""
    db = Path(tempfile.mkdtemp(dir=scratch)) / "boot.db"
    env = {**os.environ, "PYTHONPATH": str(tree), "TENURE_DATABASE_URL": f"sqlite:///{db}"}
    env.pop("TENURE_BROKER_URL", None)
    subprocess.run([sys.executable, "-m", "tenure_cli", "db", "upgrade"], cwd=tree, env=env, check=True,
                   capture_output=True)  # fmt: skip
    log_path = db.with_suffix(".log")
    with open(log_path, "wb") as out:
        started = time.monotonic()
        worker = subprocess.Popen(
            [sys.executable, "-m", "tenure_cli", "worker", "tasks:compose", "--processes", str(processes),
             "--threads", "2"],
            cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        while log_path.read_bytes().count(b"Worker process is ready for action.") < processes:
            if time.monotonic() - started > BOOT_TIMEOUT_S or worker.poll() is not None:
                raise RuntimeError(f"the worker did not boot:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.005)
        return time.monotonic() - started
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.worker_boot", description=__doc__.split("\n")[0])
    p.add_argument("--old", default="HEAD~1", help="the old commit (default HEAD~1)")
    p.add_argument("--new", default="HEAD", help="the new commit (default HEAD)")
    p.add_argument("--processes", default="2,4", help="worker processes per boot, comma-separated (default 2,4)")
    p.add_argument("--runs", type=int, default=7, help="boots per side and process count (default 7)")
    args = p.parse_args(argv)
    shapes = [int(x) for x in args.processes.split(",")]
    with tempfile.TemporaryDirectory(prefix="tenure-worker-boot-") as tmp:
        scratch = Path(tmp)
        trees = {"old": scratch / "old", "new": scratch / "new"}
        commits = {side: export(ref, trees[side]) for side, ref in (("old", args.old), ("new", args.new))}
        log(f"old {commits['old'][:10]} ({args.old}), new {commits['new'][:10]} ({args.new}); load {loadavg()}")
        order = ["old", "new", "new", "old"]
        results: dict[int, dict[str, list[float]]] = {n: {"old": [], "new": []} for n in shapes}
        for n in shapes:
            for k in range(2 * args.runs):
                side = order[k % 4]
                results[n][side].append(boot_seconds(trees[side], n, scratch))
        log(f"done; load {loadavg()}")
    print(f"\n{'processes':>9}  {'old s (median)':>14}  {'new s (median)':>14}  new ÷ old")
    for n, sides in results.items():
        old, new = statistics.median(sides["old"]), statistics.median(sides["new"])
        print(f"{n:>9}  {old:>14.2f}  {new:>14.2f}  {new / old:>9.2f}")
        for side in ("old", "new"):
            print(f"{'':>9}  {side}: {', '.join(f'{s:.2f}' for s in sides[side])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
