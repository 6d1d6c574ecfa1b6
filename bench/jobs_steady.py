"""Steady-state cost of a job in one worker process: jobs/s, CPU and system calls per job (not a test).

Run from the repository root::

    .venv/bin/python -m bench.jobs_steady [--n 30000] [--seconds 6] [--strace] [--no-progress-fence | --raw]

N no-op jobs (:mod:`bench.jobs_app`'s kind: one ``ctx.progress`` call) are submitted to a fresh migrated SQLite
file; then ``python -m dramatiq bench.steady_app --processes 1 --threads 8`` drains them. After a 2.5 s warm-up,
for ``--seconds``: jobs/s (succeeded rows), the worker process's user and system CPU per job
(``/proc/<pid>/stat``), and with ``--strace`` the system calls per job (``strace -c -f``; it slows the worker, so
its jobs/s are not comparable). ``--raw`` does the same with N plain no-op messages and no job rows (the
raw broker: messages acked per second).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jobs import schema

from .jobs_bench import submit_n
from .procs import REPO

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> tuple[int, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])  # utime, stime


def done_count(db: Path, n: int, raw: bool) -> int:
    """Of the *n*: jobs succeeded (or, raw, messages acked: an ack deletes the message row) so far."""
    with sqlite3.connect(db) as conn:
        if raw:
            return n - conn.execute("SELECT count(*) FROM broker_messages").fetchone()[0]
        return conn.execute("SELECT count(*) FROM jobs WHERE status = 'succeeded'").fetchone()[0]


def send_raw(url: str, n: int) -> None:
    from dramatiq import Message

    from .job_worker import build_broker
    from .jobs_bench import settings_for
    from .steady_app import RAW_QUEUE

    broker = build_broker(settings_for(url))
    broker.declare_queue(RAW_QUEUE)
    try:
        for _ in range(n):
            broker.enqueue(Message(queue_name=RAW_QUEUE, actor_name="raw_noop", args=(), kwargs={}, options={}))
    finally:
        broker.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=30_000)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--strace", action="store_true")
    p.add_argument("--no-progress-fence", action="store_true")
    p.add_argument("--raw", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tenure-jobs-steady-") as tmp:
        db = Path(tmp) / "t.db"
        url = f"sqlite:///{db}"
        schema.upgrade(url)
        send_raw(url, args.n) if args.raw else submit_n(url, args.n)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
        env.update(TENURE_DATABASE_URL=url, PYTHONPATH=str(REPO))
        if args.no_progress_fence:
            env["BENCH_NO_PROGRESS_FENCE"] = "1"
        argv = [sys.executable, "-m", "dramatiq", "bench.steady_app", "--processes", "1", "--threads", "8"]
        with open(Path(tmp) / "worker.log", "wb") as log:
            main_proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                time.sleep(2.5)
                child = int(Path(f"/proc/{main_proc.pid}/task/{main_proc.pid}/children").read_text().split()[0])
                before, (u0, s0) = done_count(db, args.n, args.raw), cpu_ticks(child)
                if args.strace:
                    out = Path(tmp) / "strace.txt"
                    tracer = ["strace", "-c", "-f", "-p", str(child), "-o", str(out)]
                    subprocess.run(
                        ["timeout", "-s", "INT", str(args.seconds), *tracer], check=False, stderr=subprocess.DEVNULL
                    )
                else:
                    time.sleep(args.seconds)
                after, (u1, s1) = done_count(db, args.n, args.raw), cpu_ticks(child)
            finally:
                main_proc.terminate()
                main_proc.wait(30)
        done = after - before
        if after >= args.n:
            print("warning: the queue ran dry during the window; use a larger --n")
        per_job_us = 1e6 / TICKS / max(done, 1)
        print(
            f"{'raw msgs' if args.raw else 'jobs'}/s {done / args.seconds:,.0f}; "
            f"per one: user {(u1 - u0) * per_job_us:,.0f} µs, "
            f"system {(s1 - s0) * per_job_us:,.0f} µs; worker CPU {(u1 - u0 + s1 - s0) / TICKS / args.seconds:.0%}"
            + (" (no progress fence)" if args.no_progress_fence else "")
        )
        if args.strace:
            print(f"system calls per one over {done}:")
            for line in out.read_text().splitlines()[2:]:
                parts = line.split()
                if len(parts) >= 5 and parts[3].isdigit() and parts[-1] != "total":
                    print(f"  {parts[-1]:<16} {int(parts[3]) / max(done, 1):6.1f}")


if __name__ == "__main__":
    main()
