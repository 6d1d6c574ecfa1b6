"""The SQL a job costs the ack writer, without workers: a single-threaded replay on a fresh SQLite file.

Run from the repository root::

    .venv/bin/python -m bench.claim_sql_replay [--n 4000] [--rounds 5] [--drop "DROP INDEX ix_jobs_inflight"]
    .venv/bin/python -m bench.claim_sql_replay --old 6886b16^ --new HEAD [--rounds 5]

``bench.jobs_bench`` times whole drains, whose run-to-run spread on this machine (±20 %) hides a cost of a few
per cent. This replays only what a worker's ack writer runs per job, the same way every time: N jobs are
submitted (``bench.jobs_bench.submit_n``, fair share off where it exists), then claimed eight at a time
(``store.job_claim_many`` and their ``running`` status events, one ``BEGIN IMMEDIATE … COMMIT``) and completed
eight at a time (``store.job_complete_many`` and their ``succeeded`` events, another), on one raw connection.
Printed: microseconds per job, in total and per step, median over the rounds (each on a fresh file).

``--drop`` runs SQL on the migrated file first (e.g. dropping an index or a trigger, to see what it costs);
``--old``/``--new`` export two commits (``git archive``, as ``bench.jobs_compare`` does) and replay each in its
own tree, alternating, this script copied into both (the status-event API of the old tree is adapted to).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STEPS = ("claim", "claim events", "claim commit", "complete", "complete events", "complete commit")
BATCH = 8


def _entries_take_owner(status_events_many: Any) -> bool:
    """Whether this tree's ``status_events_many`` entries carry the owner: older trees take
    ``tuple[str, str, int, str, dict[str, Any]]`` (five commas in the hint), newer ones drop the owner (four)."""
    return str(inspect.signature(status_events_many).parameters["entries"].annotation).count(",") == 5


def replay(n: int, drop: str) -> dict[str, float]:
    """One replay in the importable tree; microseconds per job, per step and in total."""
    from bench import jobs_bench
    from jobs import events, schema, store

    workdir = Path(tempfile.mkdtemp(prefix="tenure-claim-replay-"))
    try:
        path = workdir / "tenure.db"
        url = f"sqlite:///{path}"
        schema.upgrade(url)
        if drop:
            with sqlite3.connect(path) as conn:
                conn.executescript(drop)
            conn.close()
        if hasattr(jobs_bench, "_fair_share_off"):
            jobs_bench._fair_share_off(url)  # noqa: SLF001 - the benchmark's own switch
        jobs_bench.submit_n(url, n)
        owner = _entries_take_owner(events.status_events_many)

        def entry(job_id: str, seq: int, status: str, data: dict[str, Any]) -> tuple[Any, ...]:
            return (job_id, jobs_bench.OWNER, seq, status, data) if owner else (job_id, seq, status, data)

        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA synchronous = NORMAL")
        ids = [r[0] for r in conn.execute("SELECT id FROM jobs WHERE status = 'queued' ORDER BY created_at, id")]
        spent = dict.fromkeys(STEPS, 0.0)

        def timed(step: str, fn: Any, *args: Any) -> Any:
            t = time.perf_counter()
            out = fn(*args)
            spent[step] += time.perf_counter() - t
            return out

        for i in range(0, len(ids), BATCH):
            now = int(time.time() * 1000)
            conn.execute("BEGIN IMMEDIATE")
            claimed = timed("claim", store.job_claim_many, conn, ids[i : i + BATCH], "replay", now, 60_000)
            running = [entry(j.id, j.event_seq, "running", {"attempt": j.attempt}) for j in claimed.values()]
            timed("claim events", events.status_events_many, conn, now, running)
            timed("claim commit", conn.execute, "COMMIT")
            conn.execute("BEGIN IMMEDIATE")
            completions = [(j.id, j.attempt, "replay", None, None) for j in claimed.values()]
            done = timed("complete", store.job_complete_many, conn, completions, now)
            timed(
                "complete events",
                events.status_events_many,
                conn,
                now,
                [entry(k, v, "succeeded", {}) for k, v in done.items()],
            )
            timed("complete commit", conn.execute, "COMMIT")
        finished = conn.execute("SELECT count(*) FROM jobs WHERE status = 'succeeded'").fetchone()[0]
        conn.close()
        if finished != len(ids) or len(ids) != n:
            raise SystemExit(f"replay check failed: {finished} of {len(ids)} succeeded, {n} submitted")
        per_job = {step: seconds / n * 1e6 for step, seconds in spent.items()}
        per_job["total"] = sum(spent.values()) / n * 1e6
        return per_job
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def _row(label: str, m: dict[str, float]) -> str:
    return f"{label:<10} total {m['total']:6.1f} µs/job  " + "  ".join(f"{s} {m[s]:5.1f}" for s in STEPS)


def _compare(old: str, new: str, rounds: int, n: int) -> None:
    from .jobs_compare import export

    scratch = Path(tempfile.mkdtemp(prefix="tenure-claim-replay-trees-"))
    try:
        trees = {"old": scratch / "old", "new": scratch / "new"}
        for side, ref in (("old", old), ("new", new)):
            commit = export(ref, trees[side])
            shutil.copy(Path(__file__), trees[side] / "bench" / "claim_sql_replay.py")
            print(f"{side}: {commit[:10]} ({ref})", flush=True)
        runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
        for k in range(2 * rounds):
            side = ("old", "new", "new", "old")[k % 4]
            out = subprocess.run(
                [sys.executable, "-m", "bench.claim_sql_replay", "--n", str(n), "--rounds", "1", "--json"],
                cwd=trees[side],
                env={**os.environ, "PYTHONPATH": str(trees[side])},
                check=True,
                capture_output=True,
                text=True,
            )
            runs[side].append(json.loads(out.stdout.splitlines()[-1]))
            print(_row(side, runs[side][-1]), flush=True)
        medians = {side: _median(r) for side, r in runs.items()}
        print()
        for side in ("old", "new"):
            print(_row(f"{side} med", medians[side]))
        print(f"new ÷ old, total: {medians['new']['total'] / medians['old']['total']:.2f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.claim_sql_replay", description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=4000, help="jobs per replay (default 4000)")
    p.add_argument("--rounds", type=int, default=5, help="replays (per side with --old/--new; default 5)")
    p.add_argument("--drop", default="", help="SQL run on the migrated file first (e.g. DROP INDEX …)")
    p.add_argument("--old", help="compare two commits: the old one")
    p.add_argument("--new", default="HEAD", help="with --old: the new one (default HEAD)")
    p.add_argument("--json", action="store_true", help="print the median as one JSON line (for --old/--new)")
    args = p.parse_args(argv)
    if args.old:
        _compare(args.old, args.new, args.rounds, args.n)
        return 0
    runs = [replay(args.n, args.drop) for _ in range(args.rounds)]
    if args.json:
        print(json.dumps(_median(runs)))
    else:
        for r in runs:
            print(_row("run", r), flush=True)
        print(_row("median", _median(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
